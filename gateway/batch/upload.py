"""Receiving a `POST /v1/files` body: within its size, at a minimum pace, spooled to disk.

The multipart body is parsed as it arrives (Starlette's parser spools the file part to a
temporary file past 1 MiB), so an upload no longer sits in memory whole several times over
while it is read. An upload must also keep moving: after a grace of `GATEWAY_BODY_TIMEOUT`
seconds it must have sent at least `GATEWAY_BATCH_UPLOAD_MIN_BYTES_PER_SECOND` on average, or
it ends with 408; two trickled uploads held the process's upload slots without bound before.
"""

from __future__ import annotations

import time

import anyio
from starlette.datastructures import FormData, UploadFile
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive

from gateway.errors import (
    BadRequestError,
    ClientClosedRequestError,
    GatewayError,
    PayloadTooLargeError,
)
from gateway.neutral import Outcome
from gateway.policies import UploadLimits

#: Room for the multipart framing and the `purpose` field around the file itself.
FORM_OVERHEAD = 64 * 1024


class UploadTooSlowError(GatewayError):
    """An upload fell below the minimum pace (408: the client may send it again faster)."""

    status_code = 408
    outcome: Outcome = "client_disconnect"  # as the door's own 408 for a stalled body


class PacedReceive:
    """An ASGI `receive` that enforces an upload's size limit and minimum pace.

    Args:
        receive: The request's own `receive`.
        limits: The file's largest size, the grace (`GATEWAY_BODY_TIMEOUT`) and the pace.
    """

    def __init__(self, receive: Receive, limits: UploadLimits) -> None:
        self._receive = receive
        self._limit = limits.max_file_bytes + FORM_OVERHEAD
        self._grace = limits.grace
        self._rate = limits.min_bytes_per_second
        self._started = time.monotonic()
        self.received = 0

    async def __call__(self) -> Message:
        """The next message, once it comes within the pace.

        Raises:
            UploadTooSlowError: the bytes so far are not enough for the time taken (408).
            PayloadTooLargeError: past the size limit (413).
        """
        # By when the next bytes must come: grace, plus a second per `rate` bytes received.
        due = self._started + self._grace + self.received / self._rate
        left = due - time.monotonic()
        message: Message | None = None
        if left > 0:
            with anyio.move_on_after(left):
                message = await self._receive()
        if message is None:
            raise UploadTooSlowError(
                f"the upload is slower than {self._rate} bytes per second; send it faster"
            )
        self.received += len(message.get("body", b""))
        if self.received > self._limit:
            raise PayloadTooLargeError(f"request body is larger than {self._limit} bytes")
        return message


async def read_form(request: Request, limits: UploadLimits) -> tuple[UploadFile, object, FormData]:
    """Parse the upload's multipart body as it arrives: (the `file` part, `purpose`, the form).

    The caller closes the form (its temporary file) when done.

    Raises:
        PayloadTooLargeError: `Content-Length` or the bytes sent pass the limit (413).
        UploadTooSlowError: the body came too slowly (408).
        BadRequestError: not a multipart body it can read, or no `file` part (400).
        ClientClosedRequestError: the client went away mid-body (499).
    """
    limit = limits.max_file_bytes + FORM_OVERHEAD
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequestError("invalid Content-Length")
        if int(declared) > limit:
            raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
    paced = Request(request.scope, PacedReceive(request.receive, limits))
    try:
        form = await paced.form(max_files=1, max_fields=10)
    except GatewayError:
        raise
    except ClientDisconnect as exc:
        raise ClientClosedRequestError("client closed the connection") from exc
    except Exception as exc:  # python-multipart's errors: a malformed body
        raise BadRequestError("the multipart body could not be read") from exc
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        await form.close()
        raise BadRequestError("the form has no file field 'file'")
    return upload, form.get("purpose"), form
