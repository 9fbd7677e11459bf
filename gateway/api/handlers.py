"""The app's exception handlers: each error as a response in the client's dialect, counted.

Registered once by `create_app` (`register_error_handlers`). A `GatewayError` and Starlette's
`HTTPException` (an unknown path, a method not allowed) name the request's outcome in its
`RequestContext` (`gateway.context`) for the access log and the SERVER span, and are counted in
`gateway_requests_total` when the relay has not metered the request itself; the bodies are
`gateway.errors.error_response`'s. Unexpected exceptions are
`gateway.api.middleware.access.UnexpectedErrorMiddleware`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.context import request_context
from gateway.errors import GatewayError, error_response
from gateway.neutral import Outcome
from gateway.routing import allowed_methods, route_label


class RejectionCounter(Protocol):
    """Counts a request that ended before the relay metered it (`Metrics.count_rejection`)."""

    def count_rejection(
        self, route: str, status: int, outcome: str, key: str | None = None
    ) -> None:
        """Count one request in `gateway_requests_total` with `model="other"`."""


Handler = Callable[[Request, Exception], Coroutine[Any, Any, Response]]


def _rejection_handlers(
    rejections: RejectionCounter | None, *, per_key: bool
) -> tuple[Handler, Handler]:
    """The handlers of `GatewayError` and of Starlette's `HTTPException` (they count refusals)."""

    def count(request: Request, status_code: int, outcome: Outcome) -> None:
        """Name the request's outcome; count it when the relay has not metered it."""
        context = request_context(request.scope)
        context.set_outcome(outcome)
        if rejections is not None and not context.metered:
            principal = context.principal
            key = None
            if principal is not None:
                key = principal.name if per_key else "all"
            rejections.count_rejection(route_label(request.scope), status_code, outcome, key=key)

    async def gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)  # noqa: S101 - registered for GatewayError only
        status = exc.status_for(request.url.path)
        count(request, status, exc.outcome)
        return error_response(request.url.path, status, exc.message, exc.headers)

    async def http_exception(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)  # noqa: S101
        status = exc.status_code
        message = {404: "not found", 405: "method not allowed"}.get(status, str(exc.detail))
        count(request, status, "not_found" if status == 404 else "error")
        headers = exc.headers
        if status == 405 and (allowed := allowed_methods(request.scope, request.app.router.routes)):
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}  # every route's (RFC 9110)
        return error_response(request.url.path, status, message, headers)

    return gateway_error, http_exception


async def _handle_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)  # noqa: S101
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ()))
    return error_response(request.url.path, 422, f"invalid request: {where} {first.get('msg', '')}")


def register_error_handlers(
    app: FastAPI, rejections: RejectionCounter | None = None, *, metrics_per_key: bool = True
) -> None:
    """Register every exception handler of the gateway on `app` (called once by `create_app`).

    Unexpected exceptions are turned into a 500 by
    `gateway.api.middleware.access.UnexpectedErrorMiddleware`, which
    knows the request id.

    Args:
        app: The app.
        rejections: Counts each refusal the relay did not meter (the app's metrics); None
            counts nothing.
        metrics_per_key: `GATEWAY_METRICS_PER_KEY`: a refusal's `key` label is the key's name,
            else `all`.
    """
    gateway_error, http_exception = _rejection_handlers(rejections, per_key=metrics_per_key)
    app.add_exception_handler(GatewayError, gateway_error)
    app.add_exception_handler(StarletteHTTPException, http_exception)
    app.add_exception_handler(RequestValidationError, _handle_validation_error)
