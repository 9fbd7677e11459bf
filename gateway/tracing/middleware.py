"""`TracingMiddleware`: the SERVER span of each HTTP request (added only when tracing is on)."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.context import RequestContext, request_context
from gateway.routing import OTHER_ROUTE, route_label
from gateway.tracing.spans import METHODS, Tracing

#: Scraped and probed every few seconds: their spans would drown the requests' own.
_UNTRACED = frozenset({"/metrics", "/healthz", "/readyz"})


class TracingMiddleware:
    """Pure ASGI: one SERVER span per HTTP request (`gateway.tracing`); added only when on.

    It sits inside `AccessMiddleware`, so the request id is known, and keeps the span in the
    request's `RequestContext` (`gateway.context`), where its `Generation` finds its parent.

    Args:
        app: The ASGI app.
        tracing: The app's tracing.
    """

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request inside its span; end the span with its status and route."""
        if scope["type"] != "http" or scope["path"] in _UNTRACED:
            await self.app(scope, receive, send)
            return
        span = self.tracing.start_server(scope)
        context = request_context(scope)
        context.span = span
        status: int | None = None

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        error: str | None = None
        try:
            await self.app(scope, receive, send_noting_status)
        except BaseException as exc:  # after the response started, or a cancellation
            error = type(exc).__qualname__
            raise
        finally:
            end_server(span, scope, context, status, error)


def end_server(
    span: Span, scope: Scope, context: RequestContext, status: int | None, error: str | None
) -> None:
    """End a SERVER span: route, status, the request's id, key id and outcome (`context`)."""
    route = route_label(scope)
    attributes: dict[str, Any] = {"gateway.request_id": context.request_id}
    if route != OTHER_ROUTE:
        attributes["http.route"] = route
        method = scope["method"]
        span.update_name(f"{method if method in METHODS else 'HTTP'} {route}")
    if status is not None:
        attributes["http.response.status_code"] = status
    key_id = context.key_id
    if key_id:
        attributes["gateway.key_id"] = key_id
    outcome = context.outcome
    if outcome:
        attributes["gateway.outcome"] = outcome
    span.set_attributes(attributes)
    if error is not None or status is None or status >= 500:
        # HTTP conventions: the exception's type if one ended the request, else the status.
        span.set_attribute("error.type", error or str(status or "no_response"))
        span.set_status(Status(StatusCode.ERROR))
    span.end()
