"""Errors on `/v1/messages` paths in Anthropic's shape (`gateway.errors.error_body`)."""

from __future__ import annotations

import json

import pytest

from gateway.errors import error_body, error_response


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ],
)
def test_each_status_has_anthropics_error_type(status: int, kind: str) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/messages/nope/x"):
        body = json.loads(error_body(path, status, "why"))
        assert body == {"type": "error", "error": {"type": kind, "message": "why"}}


def test_other_paths_keep_their_shapes() -> None:
    assert (
        json.loads(error_body("/v1/messagesx", 404, "m"))["error"]["type"]
        == "invalid_request_error"
    )
    assert (
        json.loads(error_body("/v1/chat/completions", 401, "m"))["error"]["code"]
        == "invalid_api_key"
    )
    assert json.loads(error_body("/api/chat", 401, "m")) == {"error": "m"}


def test_retry_after_is_kept() -> None:
    response = error_response("/v1/messages", 503, "busy", {"Retry-After": "3"})
    assert (response.status_code, response.headers["retry-after"]) == (503, "3")
    assert json.loads(response.body)["error"]["type"] == "overloaded_error"
