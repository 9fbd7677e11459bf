"""Pure-ASGI middleware: request id, arrival time, one JSON log line a request, last-resort 500.

`AccessMiddleware` wraps everything, so it makes the request's `RequestContext`
(`gateway.context`), whose `arrival` (a `time.perf_counter()` in seconds) is the clock start
for TTFT, and every request is logged, including
those the CORS layer answers itself. The request id comes from a well-formed incoming
`X-Request-ID` or is made here, and goes back in the `X-Request-ID` response header. The log line
has no prompt text and no secrets: only the key's id, never the key. Its `route` is the matched
route's template or `other` (`gateway.routing.route_label`), never the raw path, so a client
cannot fill the field with paths of its choosing. It names the client's address: the peer's,
or, when the peer is one of `GATEWAY_TRUSTED_PROXIES`, the nearest untrusted address in its
`X-Forwarded-For` (`client_address`). Every string in the line is JSON-escaped, so no client or
upstream text can break it into two lines.

`UnexpectedErrorMiddleware` is the last line of defence: an unexpected exception becomes a
logged 500 in the client's dialect, with the request id, instead of reaching the server.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.handlers import RejectionCounter
from gateway.context import RequestContext, request_context
from gateway.errors import error_response
from gateway.routing import route_label
from gateway.upstream.headers import upstream_request_id
from gateway.wire.address import Network, client_address

logger = logging.getLogger("gateway.access")

_VALID_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
#: Scraped and probed every few seconds: their lines would drown the requests' own.
_UNLOGGED = frozenset({"/metrics", "/healthz", "/readyz"})


class AccessMiddleware:
    """Wraps the app; see the module docstring.

    Args:
        app: The ASGI app.
        trusted_proxies: Networks whose `X-Forwarded-For` is believed (`GATEWAY_TRUSTED_PROXIES`).
    """

    def __init__(self, app: ASGIApp, trusted_proxies: Sequence[Network] = ()) -> None:
        self.app = app
        self.trusted_proxies = tuple(trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stamp the request, add `X-Request-ID`, log one line when the response ends."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        context = request_context(scope)  # the first to ask: its arrival is now
        request_id = context.request_id = _incoming_id(scope) or uuid.uuid4().hex
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if logger.isEnabledFor(logging.INFO) and scope["path"] not in _UNLOGGED:
                self._log(scope, context, status)

    def _log(self, scope: Scope, context: RequestContext, status: int | None) -> None:
        summary = context.summary
        record = {
            "request_id": context.request_id,
            "client": client_address(scope, self.trusted_proxies),
            "method": scope["method"],
            "route": route_label(scope),
            "status": status,
            "key_id": context.key_id,
            "model": context.model,
            **(summary.log_fields() if summary is not None else {"outcome": context.outcome}),
        }
        record.setdefault("duration_s", round(time.perf_counter() - context.arrival, 6))
        upstream_id = upstream_request_id(context.request_id)
        if upstream_id != context.request_id:
            record["upstream_request_id"] = upstream_id
        logger.info(json.dumps(record, separators=(",", ":"), default=str))


class UnexpectedErrorMiddleware:
    """The last line of defence: an unexpected exception becomes a logged 500.

    The 500 is in the client's dialect and the exception is logged with the request id; an
    exception after the response started is logged and raised on (nothing more can be sent).
    It sits inside the CORS layer (when CORS is on), which sits inside `AccessMiddleware`
    (`create_app`): the 500 then carries the CORS headers a browser app needs to read it, like
    every handler's error, and the CORS layer's own answers (preflights) are still logged with a
    request id.

    Args:
        app: The ASGI app.
        rejections: Counts the 500 of a request the relay did not meter (the app's metrics);
            None counts nothing.
    """

    def __init__(self, app: ASGIApp, rejections: RejectionCounter | None = None) -> None:
        self.app = app
        self.rejections = rejections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; answer 500 for an exception raised before the response started."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_noting_start(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_noting_start)
        except Exception:
            context = request_context(scope)
            logger.exception("unhandled error, request_id=%s", context.request_id)
            context.set_outcome("error")
            if started:
                raise
            response = error_response(scope["path"], 500, "internal gateway error")
            await response(scope, receive, send)
            if self.rejections is not None and not context.metered:
                self.rejections.count_rejection(route_label(scope), 500, "error")


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _VALID_ID.match(text) else None
    return None
