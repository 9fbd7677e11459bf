"""The one classifier of upstream failures, for every path that calls an upstream.

A failed call (a transport exception, a deadline, a broken stream) or an error status becomes
the client's `GatewayError` (`gateway.errors`), with the `gateway_upstream_errors_total` kind it
is counted under (docs/metrics.md). Two paths use it: the generation engine
(`gateway.relay.exchange`, which counts and retries by it) and the few calls the Ollama surface
makes itself (`gateway.api.ollama.passthrough`: model lists, model management, which count
nothing). What each path tells the client where they differ is a parameter here: the
deadline's message, the message of a connect timeout, whose fault a deadline is, and how an
error body's message is found.
"""

from __future__ import annotations

import json
import logging

import httpx

from gateway.errors import (
    Blame,
    GatewayError,
    ServiceUnavailableError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.upstream.dialects.base import StreamBrokenError
from gateway.wire.json import parse_json

#: Most bytes of an upstream error body read to find its message.
ERROR_BODY_LIMIT = 64 * 1024

#: The client's message when every connection to the upstream is taken.
POOL_BUSY = "every upstream connection is busy (GATEWAY_MAX_CONNECTIONS)"


def transport_error(
    exc: BaseException,
    timeout_message: str,
    *,
    connect_timeout_message: str = "timed out connecting to upstream",
    request_deadline: bool = False,
) -> tuple[GatewayError, str] | None:
    """The client's error for a failed upstream call, and its `upstream_errors` kind.

    Args:
        exc: What the call or a read raised.
        timeout_message: The client's message when a deadline ran out (the caller's own
            `TimeoutError`, or the HTTP client's read or write timeout).
        connect_timeout_message: The client's message when connecting timed out.
        request_deadline: The caller's deadline was the rest of the request's total
            `GATEWAY_REQUEST_TIMEOUT`, not a phase's: running out of it is not the upstream's
            fault (it was never silent for a whole phase).

    Returns:
        (error, kind): kind is `timeout`, `pool`, `connect` or `stream`. None for what is no
        upstream failure (cancellation, a bug): the caller re-raises or logs it.
    """
    if isinstance(exc, TimeoutError):
        blame: Blame = "request" if request_deadline else "upstream"
        return UpstreamTimeoutError(timeout_message, blame=blame), "timeout"
    if isinstance(exc, httpx.PoolTimeout):
        return ServiceUnavailableError(POOL_BUSY, headers={"Retry-After": "1"}), "pool"
    if isinstance(exc, httpx.ConnectTimeout):
        return UpstreamTimeoutError(connect_timeout_message), "timeout"
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeoutError(timeout_message), "timeout"
    if isinstance(exc, httpx.ConnectError):
        return UpstreamUnavailableError("upstream is unreachable"), "connect"
    if isinstance(exc, httpx.HTTPError):
        return UpstreamUnavailableError("upstream closed the connection unexpectedly"), "stream"
    if isinstance(exc, StreamBrokenError):
        return UpstreamUnavailableError(str(exc)), "stream"
    return None


def status_kind(error: UpstreamStatusError) -> str:
    """The `gateway_upstream_errors_total` kind of an upstream error status (docs/metrics.md)."""
    if error.upstream_status == 429:
        return "rate_limited"
    if error.upstream_status == 503:
        return "busy"
    if error.status_code < 500:  # passed on as 4xx: the upstream refused the request
        return "status_4xx"
    return "status"


def error_message(raw: bytes, *, nested: bool = True) -> str:
    """The message of an upstream error body: the text of its `error`.

    Args:
        raw: The error body, at most `ERROR_BODY_LIMIT` bytes.
        nested: Also take OpenAI's `{"error": {"message": ...}}` (the generation engine, which
            calls upstreams of both dialects). False: Ollama's `{"error": str}` only, and a body
            deeper or longer than an error message is taken as text (the Ollama surface's own
            calls, to Ollama upstreams only).

    Returns:
        The message; the body's first 200 bytes as text when it is not JSON.
    """
    try:
        # Bounded, an error body is `{"error": "..."}`: anything deep or long is no message.
        data = json.loads(raw) if nested else parse_json(raw, max_depth=8, max_values=1_000)
    except (ValueError, RecursionError):
        return raw[:200].decode("utf-8", "replace").strip()
    error = data.get("error") if isinstance(data, dict) else None
    if nested and isinstance(error, dict):
        error = error.get("message")
    return str(error) if error else ""


def log_status_error(logger: logging.Logger, status: int, message: str) -> None:
    """Log an upstream's error status; its message only at debug level.

    An upstream's error text may echo the request: vLLM's and other FastAPI servers' 400s carry
    pydantic's `input` (the messages themselves), so by default the line names the status and
    the message's length, not its text (no prompt text in logs by default). At
    `GATEWAY_LOG_LEVEL=debug` the first 200 characters are logged with it (escaped, like every
    line: `gateway.serve.logs`). The client gets the whole message in its error either way.

    Args:
        logger: The caller's logger (`gateway.relay`, `gateway.api`).
        status: The upstream's HTTP status.
        message: `error_message` of its body.
    """
    if logger.isEnabledFor(logging.DEBUG):
        logger.warning("upstream answered %s: %s", status, message[:200])
    else:
        logger.warning(
            "upstream answered %s (a %d-character message, logged at debug level only)",
            status,
            len(message),
        )
