"""Reading a request body within its size limit (field failure F-36): 413 past it.

Its bytes are charged to the process's body budget as they arrive
(`gateway.wire.budget`): 429 past the key's share, 503 past the process's budget. A body
that holds a charge must keep a minimum pace (the budget's `grace` and `min_rate`), else 408:
charged up front, or trickled, a few clients' declared bodies held the whole budget without
bound and every other key's bodies got 503 (found by an attacking review).
"""

from __future__ import annotations

import time

from starlette.requests import ClientDisconnect, Request

from gateway.context import request_context
from gateway.errors import (
    BadRequestError,
    ClientClosedRequestError,
    GatewayError,
    PayloadTooLargeError,
)
from gateway.neutral import Outcome
from gateway.wire.budget import hold_of


class BodyTooSlowError(GatewayError):
    """A buffered body fell below the minimum pace (408: the client may send it again faster)."""

    status_code = 408
    outcome: Outcome = "client_disconnect"  # as the door's own 408 for a stalled body


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read the request body, refusing more than `max_bytes` without buffering the excess.

    The bytes are charged to the request's `BodyHold` (the key is the authenticated one,
    the `RequestContext`'s `key_id`; none for the admin API) as they arrive, never by the declared
    `Content-Length` alone. The charge lasts until the request ends. Each piece must come by
    `grace + received / min_rate` seconds after the first read (the budget's pace).

    Raises:
        PayloadTooLargeError: `Content-Length` or the bytes received exceed `max_bytes`.
        BadRequestError: `Content-Length` is not a number.
        RateLimitedError: the key's bodies would pass its share of the body budget (429).
        ServiceUnavailableError: the process's bodies would pass the body budget (503).
        BodyTooSlowError: the body came slower than the budget's pace (408).
        ClientClosedRequestError: the client went away before the body was complete.
    """
    declared = request.headers.get("content-length")
    hold = hold_of(request.scope)
    key = request_context(request.scope).key_id
    if declared is not None:
        if not declared.isdigit():
            raise BadRequestError("invalid Content-Length")
        if int(declared) > max_bytes:
            raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
    parts: list[bytes] = []
    size = 0
    started = time.monotonic()
    try:
        async for part in request.stream():
            size += len(part)
            if size > max_bytes:
                raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
            if hold is not None and part:
                budget = hold.budget
                due = started + budget.grace + (size - len(part)) / budget.min_rate
                if time.monotonic() > due:
                    raise BodyTooSlowError(
                        f"the request body is slower than {budget.min_rate} bytes per second "
                        "after the first seconds; send it faster"
                    )
                hold.take(key, len(part))
            if part:
                parts.append(part)
    except ClientDisconnect as exc:
        raise ClientClosedRequestError("client closed the connection") from exc
    return parts[0] if len(parts) == 1 else b"".join(parts)  # one piece (the usual): no copy
