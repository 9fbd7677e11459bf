"""Checking a batch input file before anything runs: every line, with its number in each error.

A line is `{"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body": {...}}`
(OpenAI's Batch input format). Each body is checked by the endpoint's own parser, exactly as an
interactive request would be, and kept as the bytes that were checked: what runs later is what
was checked. The batch fails as a whole if any line fails (OpenAI does the same), listing at
most `MAX_ERRORS` errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.auth.principal import Principal
from gateway.errors import GatewayError
from gateway.relay.surface import Endpoint
from gateway.settings import Settings

#: The most errors a failed batch lists (the first ones by line number).
MAX_ERRORS = 100
#: The longest `custom_id` accepted, in characters.
MAX_CUSTOM_ID = 512


@dataclass(frozen=True, slots=True)
class InputLine:
    """One checked line: its 1-based number, id, model and the body bytes to send."""

    line_no: int
    custom_id: str
    model: str
    body: bytes


@dataclass(frozen=True, slots=True)
class LineError:
    """One reason a batch input is refused; `line` is 1-based, None for the whole file."""

    code: str
    message: str
    line: int | None = None

    def as_openai(self) -> dict[str, Any]:
        """OpenAI's batch error object: `{"code", "message", "param", "line"}`."""
        return {"code": self.code, "message": self.message, "param": None, "line": self.line}


def check_input(
    content: bytes,
    *,
    endpoint_path: str,
    endpoint: Endpoint,
    principal: Principal,
    settings: Settings,
) -> tuple[list[InputLine], list[LineError]]:
    """Parse and check every line of a batch input file.

    Args:
        content: The file's bytes (UTF-8 JSONL; blank lines are skipped).
        endpoint_path: The batch's `endpoint`; every line's `url` must be it.
        endpoint: That endpoint's parser (`gateway.api.openai.routes`).
        principal: The batch's key: each line's model must be one it may use.
        settings: Body limits (`GATEWAY_MAX_BODY_BYTES`, ...) and `GATEWAY_BATCH_MAX_LINES`.

    Returns:
        (lines, errors): the checked lines, and every error found (at most `MAX_ERRORS`);
        the batch may run only when `errors` is empty.
    """
    errors: list[LineError] = []
    lines: list[InputLine] = []
    seen: set[str] = set()
    try:
        # utf-8-sig: a byte-order mark at the start (Windows editors write one) is dropped.
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return [], [LineError("invalid_file", f"the file is not UTF-8 (byte {exc.start})")]
    # JSON Lines ends lines with \n (or \r\n) only: str.splitlines would also split at
    # U+2028, U+0085 and the like, which JSON strings may hold unescaped.
    lines_of_text = (raw.removesuffix("\r") for raw in text.split("\n"))
    numbered = [(n, raw) for n, raw in enumerate(lines_of_text, 1) if raw.strip()]
    if not numbered:
        return [], [LineError("empty_file", "the file has no request lines")]
    if len(numbered) > settings.batch_max_lines:
        message = f"the file has {len(numbered)} lines; at most {settings.batch_max_lines}"
        return [], [LineError("too_many_lines", message)]
    for line_no, raw in numbered:
        if len(errors) >= MAX_ERRORS:
            break
        problem, line = _check_line(line_no, raw, endpoint_path, endpoint, principal, settings)
        if problem is not None:
            errors.append(problem)
            continue
        assert line is not None  # noqa: S101 - one of the two is set
        if line.custom_id in seen:
            errors.append(LineError("duplicate_custom_id", "custom_id is repeated", line_no))
            continue
        seen.add(line.custom_id)
        lines.append(line)
    return lines, errors


def _check_line(
    line_no: int,
    raw: str,
    endpoint_path: str,
    endpoint: Endpoint,
    principal: Principal,
    settings: Settings,
) -> tuple[LineError | None, InputLine | None]:
    def fail(code: str, message: str) -> tuple[LineError, None]:
        return LineError(code, message, line_no), None

    if len(raw.encode()) > settings.max_body_bytes + 4096:
        return fail("line_too_large", f"the line is over {settings.max_body_bytes} bytes")
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError):
        return fail("invalid_json_line", "the line is not valid JSON")
    if not isinstance(item, dict):
        return fail("invalid_request", "the line is not a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return fail("missing_required_parameter", "custom_id (a non-empty string) is missing")
    if len(custom_id) > MAX_CUSTOM_ID:
        return fail("invalid_request", f"custom_id is longer than {MAX_CUSTOM_ID} characters")
    if "\x00" in custom_id:  # no database text column holds a NUL (PostgreSQL refuses it)
        return fail("invalid_request", "custom_id must not contain NUL")
    if item.get("method", "POST") != "POST":
        return fail("invalid_request", "method must be POST")
    if item.get("url") != endpoint_path:
        return fail("invalid_url", f"url must be the batch's endpoint, {endpoint_path}")
    body = item.get("body")
    if not isinstance(body, dict):
        return fail("missing_required_parameter", "body (a JSON object) is missing")
    if body.get("stream") is True:
        return fail("invalid_request", "stream: true is not supported in a batch")
    encoded = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if len(encoded) > settings.max_body_bytes:
        return fail("line_too_large", f"the body is over {settings.max_body_bytes} bytes")
    try:
        request = endpoint.parse(encoded, settings)
    except GatewayError as exc:
        return fail("invalid_request", exc.message)
    if "\x00" in request.model:
        return fail("invalid_request", "model must not contain NUL")
    if not principal.allows_model(request.model):
        return fail("model_not_allowed", f"this API key may not use model '{request.model}'")
    return None, InputLine(line_no, custom_id, request.model, encoded)
