"""Reading a request body within its size limit (field failure F-36): 413 past it.

Its bytes are charged to the process's body budget as they are announced or arrive
(`gateway.relay.bodybudget`): 429 past the key's share, 503 past the process's budget.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from gateway.errors import BadRequestError, ClientClosedRequestError, PayloadTooLargeError
from gateway.relay.bodybudget import hold_of


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read the request body, refusing more than `max_bytes` without buffering the excess.

    The bytes are charged to the request's `BodyHold` (the key is the authenticated one,
    `state["key_id"]`; none for the admin API): the declared `Content-Length` before anything
    is read, else each chunk as it arrives. The charge lasts until the request ends.

    Raises:
        PayloadTooLargeError: `Content-Length` or the bytes received exceed `max_bytes`.
        BadRequestError: `Content-Length` is not a number.
        RateLimitedError: the key's bodies would pass its share of the body budget (429).
        ServiceUnavailableError: the process's bodies would pass the body budget (503).
        ClientClosedRequestError: the client went away before the body was complete.
    """
    declared = request.headers.get("content-length")
    charged = 0
    hold = hold_of(request.scope)
    key_id = request.scope.get("state", {}).get("key_id")
    key = None if key_id is None else str(key_id)
    if declared is not None:
        if not declared.isdigit():
            raise BadRequestError("invalid Content-Length")
        if int(declared) > max_bytes:
            raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
        charged = int(declared)
        if hold is not None:  # all of it up front: refused before a byte is buffered
            hold.take(key, charged)
    parts: list[bytes] = []
    size = 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > max_bytes:
                raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
            if size > charged:  # a chunked body: charged as it arrives
                if hold is not None:
                    hold.take(key, size - charged)
                charged = size
            if part:
                parts.append(part)
    except ClientDisconnect as exc:
        raise ClientClosedRequestError("client closed the connection") from exc
    return parts[0] if len(parts) == 1 else b"".join(parts)  # one piece (the usual): no copy
