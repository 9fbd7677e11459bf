"""Reading a request body within its size limit (field failure F-36): 413 past it."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from gateway.errors import BadRequestError, ClientClosedRequestError, PayloadTooLargeError


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read the request body, refusing more than `max_bytes` without buffering the excess.

    Raises:
        PayloadTooLargeError: `Content-Length` or the bytes received exceed `max_bytes`.
        BadRequestError: `Content-Length` is not a number.
        ClientClosedRequestError: the client went away before the body was complete.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequestError("invalid Content-Length")
        if int(declared) > max_bytes:
            raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
    parts: list[bytes] = []
    size = 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > max_bytes:
                raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
            parts.append(part)
    except ClientDisconnect as exc:
        raise ClientClosedRequestError("client closed the connection") from exc
    return b"".join(parts)
