"""Errors the gateway answers with, and the one place their HTTP bodies are rendered.

Hierarchy (each carries an HTTP status and a message that is safe to show a client)::

    GatewayError
    ├── BadRequestError            400  body is empty, not UTF-8, not JSON, or nested too deep
    ├── UnauthorizedError          401  key missing, unknown, revoked, expired (WWW-Authenticate)
    ├── ForbiddenError             403  the key may not use this model (or this endpoint)
    ├── NotFoundError              404  no such model (`/v1/models/{model}`, `/api/show`)
    ├── PayloadTooLargeError       413  body over GATEWAY_MAX_BODY_BYTES
    │   └── OverTokenLimitError    413  the request needs more tokens than its key's whole TPM
    ├── UnprocessableError         422  not an object, or the wrong shape (model missing, ...)
    │   └── UntranslatableRequestError 422 the upstream's dialect cannot express the request
    ├── RateLimitedError           429  a per-key limit is reached (+ Retry-After, X-RateLimit-*)
    ├── ServiceUnavailableError    503  the gateway cannot serve now: upstream queue full or too
    │                                   slow, limiter storage down (fail-closed) (+ Retry-After)
    ├── ClientClosedRequestError   499  the client left while its body was being read (logged only)
    └── UpstreamError              502  the upstream failed (base of the upstream family)
        ├── AnswerTooLargeError    413  the answer the request asked for is over the 32 MiB
        │                               the gateway holds (many inputs, `stream:false`)
        ├── UpstreamStatusError    4xx passed on (429 with its Retry-After), a 500 that blames
        │                          the request as 400, other 5xx as 502, 503 kept with Retry-After
        ├── UpstreamUnavailableError 502 connection refused / reset / dropped
        └── UpstreamTimeoutError   504  connect, first-byte or idle timeout

Every upstream error says whose fault it is (`blame`, see `Blame`): the circuit breaker and the
retries act on that (docs/operations.md, "Whose fault is a failure").

Bodies follow the client's surface: Ollama's `{"error": "..."}` on `/api/*`, `/v1/generate`,
`/v1/chat` and everything outside `/v1/` and `/admin/` (reference section 4.1), and OpenAI's
`{"error": {"message", "type", "param", "code"}}` on every other `/v1/` path, unknown ones
included, so the OpenAI SDKs raise their typed exceptions, and on the admin API (`/admin/`);
Anthropic's `{"type": "error", "error": {"type", "message"}}` on `/v1/messages` and every path
below it (`speaks_anthropic`), so the `anthropic` SDKs and Claude Code read theirs.
A failure after the first streamed byte cannot change the status any more; the relay turns it
into one final error chunk in the client's format instead (reference section 4.3).

Over ~300 lines for one reason: each class of the hierarchy above carries its status and
its blame (`Blame`, `REQUEST_BLAMING_500`; `parse_retry_after` for the upstream's Retry-After),
and `error_response` renders them all in one place, so a status and its body never drift apart.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Literal

from fastapi.responses import Response

from gateway.neutral import Outcome

#: The `/v1/` routes that take Ollama's bodies, and so answer errors in Ollama's shape.
OLLAMA_V1_PATHS = frozenset({"/v1/generate", "/v1/chat"})


def speaks_openai(path: str) -> bool:
    """Whether a request path answers errors as OpenAI error objects.

    True for the OpenAI surface, and for the admin API (`/admin/`), whose clients are scripts
    that want a `type` to branch on.
    """
    if path.startswith("/admin/"):
        return True
    return path.startswith("/v1/") and path not in OLLAMA_V1_PATHS


class GatewayError(Exception):
    """Base of every error the gateway answers with.

    Attributes:
        status_code: HTTP status sent to the client.
        message: Client-safe text; never contains secrets or upstream internals.
        headers: Extra response headers (for example `Retry-After`).
        outcome: The `outcome` label recorded in metrics for a request that ends here.
    """

    status_code = 500
    outcome: Outcome = "error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def status_for(self, path: str) -> int:  # noqa: ARG002 - subclasses decide by the path
        """The HTTP status a client at `path` gets: `status_code`, unless its API says otherwise."""
        return self.status_code


class BadRequestError(GatewayError):
    """The body is not valid JSON (400, as Ollama answers; reference section 1)."""

    status_code = 400
    outcome: Outcome = "bad_request"


class UnauthorizedError(GatewayError):
    """No usable API key (401 with `WWW-Authenticate: Bearer`, RFC 6750 section 3)."""

    status_code = 401
    outcome: Outcome = "rejected_auth"

    def __init__(self, message: str, *, challenge: str = 'Bearer realm="gateway"') -> None:
        super().__init__(message, headers={"WWW-Authenticate": challenge})


class ForbiddenError(GatewayError):
    """The key is valid but may not use the requested model (403)."""

    status_code = 403
    outcome: Outcome = "forbidden"


class NotFoundError(GatewayError):
    """No such model, or none this key may see (404; Ollama's and OpenAI's status for it)."""

    status_code = 404
    outcome: Outcome = "not_found"


class PayloadTooLargeError(GatewayError):
    """The request body is larger than `GATEWAY_MAX_BODY_BYTES` (413)."""

    status_code = 413
    outcome: Outcome = "bad_request"


class OverTokenLimitError(PayloadTooLargeError):
    """The request needs more tokens than its key's whole TPM allows (413): it can never pass.

    Its prompt alone exceeds what one minute's window holds, so waiting cannot help; a 429
    would make clients and SDKs retry it for ever.
    """

    outcome: Outcome = "bad_request"

    def status_for(self, path: str) -> int:
        """400 on `/v1/messages`, 413 elsewhere.

        Anthropic answers a prompt too long for the model with 400 `invalid_request_error`
        ("prompt is too long"); Claude Code shows that message, but words every 413 as its
        own "Request too large (max 32MB) ... images" text, hiding the gateway's reason.
        """
        return 400 if speaks_anthropic(path) else self.status_code


class UnprocessableError(GatewayError):
    """Well-formed JSON of the wrong shape (422)."""

    status_code = 422
    outcome: Outcome = "bad_request"


class UntranslatableRequestError(UnprocessableError):
    """The gateway could not build the upstream request from this body (422).

    Raised when an upstream's dialect cannot translate the request (for example a body shape
    the OpenAI dialect has no equivalent for): the request's fault, never the upstream's.
    """


class ClientClosedRequestError(GatewayError):
    """The client went away before its request was read (499, nginx's convention; logged only)."""

    status_code = 499
    outcome: Outcome = "client_disconnect"


class RateLimitedError(GatewayError):
    """A per-key limit (RPM, TPM, concurrency) is reached (429, RFC 6585 section 4).

    Waiting lifts it; a request that no window could admit is `OverTokenLimitError` (413).
    """

    status_code = 429
    outcome: Outcome = "rate_limited"


class ServiceUnavailableError(GatewayError):
    """The gateway cannot take the request now; the client should retry later (503)."""

    status_code = 503
    outcome: Outcome = "rejected_busy"


#: Whose fault a failed upstream call is: `upstream` (it is broken or silent: feeds its circuit
#: breaker from a single request), `request` (the request caused it: never feeds the breaker
#: and is never retried), `either` (an upstream 500 or error line whose text may come from the
#: request: feeds the breaker only when several keys see it, `gateway.upstream.breaker`).
Blame = Literal["upstream", "request", "either"]

#: Longest `Retry-After` passed on from an upstream or honoured for it, in seconds: an upstream
#: (or a proxy in front of it) asking for hours must not take it out of rotation for hours.
MAX_RETRY_AFTER = 300

#: Texts of upstream 500 answers known to be caused by the request, not by the server's health
#: (lower case, matched as prefixes of the message). Ollama answers these with 500 although
#: resending the same request fails the same way on any server: the token-repeat abort
#: (reference section 10, T6), a chat template that cannot render the request's messages (Go
#: `text/template` errors), and inputs (images) the runner cannot decode.
REQUEST_BLAMING_500 = (
    "prediction aborted, token repeat limit reached",
    "template: ",
    "failed to process inputs",
    "invalid image",
)

_DELTA_SECONDS = re.compile(r"[0-9]{1,10}")


def parse_retry_after(value: str | None, *, now: float | None = None) -> int | None:
    """Read a `Retry-After` value (RFC 9110 section 10.2.3) as whole seconds from now.

    Args:
        value: The header's value: delay-seconds (`120`) or an HTTP-date
            (`Wed, 21 Oct 2015 07:28:00 GMT`); None when absent.
        now: The current time (seconds since the epoch) for an HTTP-date; `time.time()`.

    Returns:
        Seconds in 0..`MAX_RETRY_AFTER` (a date in the past is 0), or None when the value is
        absent or neither form.
    """
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return min(int(value), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a date without a zone is not one
        return None
    seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(int(seconds + 0.999), 0), MAX_RETRY_AFTER)


class UpstreamError(GatewayError):
    """The upstream model server failed (502 unless a subclass says otherwise).

    Attributes:
        blame: Whose fault it is (`Blame`); `upstream` unless the raiser knows better.
    """

    status_code = 502
    outcome: Outcome = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        blame: Blame = "upstream",
    ) -> None:
        super().__init__(message, headers=headers)
        self.blame: Blame = blame


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an error status before the first byte.

    4xx statuses other than 401/403 are the client's fault and pass through with the upstream's
    message (for example Ollama's 404 `model 'x' not found`); a 429 keeps the upstream's
    `Retry-After` (capped at `MAX_RETRY_AFTER`). 401/403 from the upstream mean the gateway is
    misconfigured (Ollama's empty-bodied Host/Origin gate, reference section 6.8) and become
    502. 503 (Ollama's "server busy", reference section 8) stays 503 with `Retry-After`. A 500
    whose message is one of `REQUEST_BLAMING_500` becomes 400: the request is at fault. Other
    5xx become 502; a 500's blame is `either` (its text may come from the request).

    Attributes:
        upstream_status: The upstream's status code.
        retry_after: The upstream's `Retry-After` in seconds (capped), or None.
    """

    def __init__(
        self, upstream_status: int, message: str, *, retry_after: int | None = None
    ) -> None:
        self.upstream_status = upstream_status
        self.retry_after = retry_after
        headers: dict[str, str] = {}
        blame: Blame = "upstream"
        if upstream_status in (401, 403):
            status, text = 502, f"upstream refused the gateway (status {upstream_status})"
        elif 400 <= upstream_status < 500:
            # An empty body (llama-cpp-python's 400 to a header it refuses) still says what.
            text = message or f"upstream answered {upstream_status} with no error message"
            status, blame = upstream_status, "request"
            if upstream_status == 429:
                text = message or "upstream rate limit reached"
                headers["Retry-After"] = str(retry_after if retry_after is not None else 1)
        elif upstream_status == 503:
            status, text = 503, message or "upstream busy"
            headers["Retry-After"] = str(retry_after if retry_after is not None else 1)
        elif upstream_status == 500 and message.lower().startswith(REQUEST_BLAMING_500):
            status, text, blame = 400, message, "request"
        else:
            status, text = 502, message or f"upstream failed with status {upstream_status}"
            if upstream_status == 500:
                blame = "either"
        super().__init__(text, headers=headers, blame=blame)
        self.status_code = status
        self.outcome = "client_error" if 400 <= status < 500 else "upstream_error"


class AnswerTooLargeError(UpstreamError):
    """The answer the request asked for is larger than the gateway will hold (413).

    Embeddings for many inputs, or a long generation asked for as one `stream:false` object:
    the size follows from the request, so it is the request's fault (`blame` `request`: no
    retry, no failover, no circuit breaker), and the message says how to ask for less.
    """

    status_code = 413
    outcome: Outcome = "client_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, blame="request")


class UpstreamUnavailableError(UpstreamError):
    """The upstream could not be reached, or dropped the connection (502)."""


class UpstreamTimeoutError(UpstreamError):
    """The upstream did not answer in time (504).

    Its blame is `upstream` for the gateway's per-phase deadlines (connect, first byte, idle:
    the upstream was silent) and `request` when the request's own total deadline
    (`GATEWAY_REQUEST_TIMEOUT`) ran out first.
    """

    status_code = 504
    outcome: Outcome = "timeout"


def ollama_error_body(message: str) -> bytes:
    """Serialize Ollama's error object, `{"error": message}` (reference section 4.1), as bytes."""
    return json.dumps({"error": message}).encode()


#: OpenAI's error `type` and `code` by status (what api.openai.com sends for each).
_OPENAI_ERRORS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", None),
    408: ("invalid_request_error", "timeout"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", None),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    431: ("invalid_request_error", "request_too_large"),
}


def openai_error_body(message: str, status_code: int) -> bytes:
    """Serialize OpenAI's error object `{"error": {"message", "type", "param", "code"}}`.

    The SDKs choose their exception by the status (`openai.AuthenticationError` for 401,
    `RateLimitError` for 429, ...); `type` and `code` are what OpenAI itself sends with it.
    """
    kind, code = _OPENAI_ERRORS.get(status_code, ("server_error", None))
    error: dict[str, Any] = {"message": message, "type": kind, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


#: Anthropic's error `type` by status (Messages API reference, "Errors"); others: `api_error`.
_ANTHROPIC_ERRORS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "request_too_large",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    """Whether a request path answers errors in Anthropic's shape: `/v1/messages` and below."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def anthropic_error_body(message: str, status_code: int) -> bytes:
    """Serialize Anthropic's error `{"type": "error", "error": {"type", "message"}}`.

    The `anthropic` SDKs choose their exception by the status (`AuthenticationError` for 401,
    `RateLimitError` for 429, ...); users read `error.type` from the body.
    """
    kind = _ANTHROPIC_ERRORS.get(status_code, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def error_body(path: str, status_code: int, message: str) -> bytes:
    """The error body for `path` in its clients' dialect: Anthropic's, OpenAI's or Ollama's."""
    if speaks_anthropic(path):
        return anthropic_error_body(message, status_code)
    if speaks_openai(path):
        return openai_error_body(message, status_code)
    return ollama_error_body(message)


def error_response(
    path: str, status_code: int, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """Build the error response for `path` in its clients' dialect (`error_body`).

    Args:
        path: Request path; decides the shape (`speaks_anthropic`, `speaks_openai`).
        status_code: HTTP status.
        message: Client-safe message.
        headers: Extra headers such as `WWW-Authenticate` or `Retry-After`.
    """
    body = error_body(path, status_code, message)
    return Response(body, status_code, headers=headers, media_type="application/json")
