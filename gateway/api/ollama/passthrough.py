"""An upstream's own answer relayed to an Ollama client: errors, small answers, progress streams.

`gateway.api.ollama.models` and `gateway.api.ollama.manage` send a few requests to an Ollama
upstream themselves, outside the generation engine. This module turns what comes back into the
client's answer: an error status or a failed call into a `GatewayError` (the same statuses the
engine answers: an upstream 4xx passed on with its message, 401/403 and other 5xx as 502, a 503
kept, timeouts 504), a small answer as it came, and a progress stream relayed unbuffered
(`ProgressResponse`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
from fastapi import Response
from starlette.types import Receive, Scope, Send

from gateway.context import ending
from gateway.errors import (
    GatewayError,
    ServiceUnavailableError,
    UpstreamStatusError,
    UpstreamUnavailableError,
)
from gateway.lifecycle import Lifecycle
from gateway.neutral import Outcome
from gateway.relay.disconnect import watch_disconnect
from gateway.upstream.errors import ERROR_BODY_LIMIT, error_message, log_status_error
from gateway.upstream.errors import transport_error as classify

logger = logging.getLogger("gateway.api")

#: Status logged for a request whose client left before any byte was sent (nginx's convention).
CLIENT_CLOSED_REQUEST = 499


def status_error(response: httpx.Response, raw: bytes) -> UpstreamStatusError:
    """The client's error for an upstream error status, with the message of its body `raw`."""
    message = error_message(raw, nested=False)
    log_status_error(logger, response.status_code, message)
    return UpstreamStatusError(response.status_code, message)


def error_of(response: httpx.Response) -> UpstreamStatusError:
    """`status_error` for a response whose body was read."""
    return status_error(response, response.content[:ERROR_BODY_LIMIT])


def transport_error(exc: Exception) -> GatewayError:
    """The client's error for a failed upstream call (`httpx.HTTPError` or `TimeoutError`).

    The classifier is `gateway.upstream.errors.transport_error`; these calls say the same
    thing of every deadline, connecting included.
    """
    message = "upstream did not answer in time"
    classified = classify(exc, message, connect_timeout_message=message)
    if classified is None:
        return UpstreamUnavailableError("upstream closed the connection unexpectedly")
    return classified[0]


#: Most bytes read of an upstream's small answer (show, tags, ps, copy, delete, a blob check).
#: Ollama's `verbose` `/api/show` with a tokenizer vocabulary is about 10 MiB; an answer past
#: this is refused rather than held in memory (a hostile upstream's endless body).
SMALL_ANSWER_LIMIT = 32 * 1024 * 1024


async def fetch(
    client: httpx.AsyncClient, method: str, path: str, *, budget: float | None, **options: Any
) -> httpx.Response:
    """Send one request and read its whole answer, bounded in size and time.

    At most `SMALL_ANSWER_LIMIT` bytes, within `budget` seconds for everything (connect,
    headers, body; None: the client's own timeouts only, for an upload whose length is the
    client's).

    Returns:
        The response, its body read (`.content`, `.json()` work).

    Raises:
        UpstreamUnavailableError: the answer is longer than `SMALL_ANSWER_LIMIT`.
        TimeoutError: `budget` ran out.
        httpx.HTTPError: the call failed.
    """
    with anyio.fail_after(budget) if budget is not None else contextlib.nullcontext():
        request = client.build_request(method, path, **options)
        response = await client.send(request, stream=True)
        body = bytearray()
        try:
            async for part in response.aiter_bytes():
                body += part
                if len(body) > SMALL_ANSWER_LIMIT:
                    logger.warning("upstream answer to %s is over %d bytes", path, len(body))
                    raise UpstreamUnavailableError("upstream sent an over-long answer")
        finally:
            await response.aclose()
    return httpx.Response(
        response.status_code, headers=response.headers, content=bytes(body), request=request
    )


def passed(response: httpx.Response) -> Response:
    """The upstream's small answer as it came: status, body, content type."""
    media = response.headers.get("content-type")
    return Response(response.content, response.status_code, media_type=media)


async def send_streamed(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """Send `request`; return its successful response with the body not read yet.

    Raises:
        GatewayError: the call failed, or the upstream answered an error status (`status_error`,
            the response closed).
    """
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise transport_error(exc) from exc
    if response.is_success:
        return response
    raw = b""
    try:
        async for part in response.aiter_bytes():
            raw += part
            if len(raw) >= ERROR_BODY_LIMIT:
                break
    except httpx.HTTPError:
        pass  # the status says enough
    finally:
        await response.aclose()
    raise status_error(response, raw)


class ProgressResponse(Response):
    """An upstream progress stream relayed unbuffered under a disconnect watcher; always closed.

    The upstream request is sent from here, so a client leaving while the upstream is still
    silent (a `stream:false` pull) closes it too; closing is what makes Ollama cancel a pull.
    Until the first byte a failure is raised for the app's error handlers; after it, a broken
    upstream stream or a shutdown (`Lifecycle.stop_streams`) ends the body with one
    `{"error": ...}` line (reference section 4.3). It watches for the client leaving as
    `gateway.relay.response.RelayResponse` does, with the same watcher
    (`gateway.relay.disconnect`).

    Args:
        open_stream: Sends the upstream request; returns its successful response (body unread).
        lifecycle: Its stop signal ends the stream.
        done: Told the status and outcome once the stream ended (not for a raised failure).
    """

    def __init__(
        self,
        open_stream: Callable[[], Awaitable[httpx.Response]],
        lifecycle: Lifecycle,
        done: Callable[[int, Outcome], None],
    ) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._open, self._lifecycle, self._done = open_stream, lifecycle, done
        self._upstream: httpx.Response | None = None
        self._started = self._gone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG002
        """Open, relay, close; see the class docstring.

        Raises:
            GatewayError: the request failed before its first byte was sent.
        """
        relayed: Outcome | None = None  # the stream's own ending, when it reached one
        failure = None
        try:
            with anyio.CancelScope() as cancel, self._lifecycle.ends_with(cancel):
                watcher = watch_disconnect(receive, cancel, self._client_left)
                try:
                    self._upstream = await self._open()
                    relayed = await self._relay(self._upstream, send)
                except GatewayError as exc:
                    failure = exc
                except OSError:  # the server could not write: the client is gone
                    self._gone = True
                finally:
                    watcher.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if self._upstream is not None:
                    await self._upstream.aclose()
        if failure is not None:
            raise failure
        shutdown = cancel.cancelled_caught and self._lifecycle.stopped and not self._gone
        if shutdown:
            if not self._started:
                raise ServiceUnavailableError("gateway is shutting down")
            await self._end(send, b'{"error":"gateway is shutting down"}\n')
        elif not self._started:  # the client left first; nobody reads this, the log shows it
            await self._end(send, b"", start=True)
        self._done(self.status_code, ending(relayed, shutdown=shutdown))

    async def _relay(self, upstream: httpx.Response, send: Send) -> Outcome:
        media = upstream.headers.get("content-type", "application/x-ndjson")
        self.status_code, self._started = upstream.status_code, True
        headers = [(b"content-type", media.encode("latin-1"))]
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        outcome: Outcome = "completed"
        try:
            async for part in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": part, "more_body": True})
        except httpx.HTTPError:
            logger.warning("upstream progress stream broke off")
            outcome = "upstream_error"
            line = b'{"error":"upstream closed the connection unexpectedly"}\n'
            await send({"type": "http.response.body", "body": line, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return outcome

    async def _end(self, send: Send, body: bytes, *, start: bool = False) -> None:
        with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
            if start:
                self.status_code = CLIENT_CLOSED_REQUEST
                await send({"type": "http.response.start", "status": CLIENT_CLOSED_REQUEST})
            await send({"type": "http.response.body", "body": body, "more_body": False})

    def _client_left(self) -> None:
        self._gone = True
