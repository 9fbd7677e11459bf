r"""`BodyWriter`: a streamed response's body written straight to its connection (the push path).

The relay's push path (`gateway.relay.push`) writes each batch of chunks from the upstream's read
callback, with no coroutine in between, so it cannot go through ASGI's `send` (a coroutine, and
every middleware's wrapper of it). The door's protocol (`gateway.serve.door.DoorProtocol`) puts
one `BodyWriter` per request in the ASGI scope's extensions (`gateway.relay.push.WRITER`; ASGI
lets a server add its own extensions there); the response head and the body's end still go
through `send`, so uvicorn's cycle keeps its state (its chunked framing, keep-alive, the
response's completion), and this writer frames each piece exactly as the cycle does
(`RequestResponseCycle.send` in uvicorn's `httptools_impl`: `%x\r\n`, the piece, `\r\n`).

It reaches into uvicorn's `RequestResponseCycle` (`response_started`, `response_complete`,
`chunked_encoding`, `disconnected`, `message_event`, `transport`, `flow`): docs/architecture.md
lists it with the other library seams, and tests/project/test_library_seams.py checks those
attributes exist.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class BodyWriter:
    """Writes body pieces of one request's streamed response past the ASGI chain.

    Args:
        cycle: uvicorn's `RequestResponseCycle` of the request.

    `watch` registers the one flow listener of the connection: its protocol calls it from
    `pause_writing` and `resume_writing` (`listener` below).
    """

    __slots__ = ("_cycle", "_transport", "listener")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._transport: Any = None  # the socket's own transport, once the head went out
        self.listener: Callable[[bool], None] | None = None

    def ready(self) -> bool:
        """A chunked response has started, has not completed, and its client is connected."""
        cycle = self._cycle
        return (
            cycle.response_started
            and not cycle.response_complete
            and cycle.chunked_encoding is True
            and not cycle.disconnected
        )

    def write(self, body: bytes) -> None:
        """Write one non-empty piece of the body as one HTTP/1.1 chunk.

        Dropped once the client is gone, as uvicorn's `send` drops it.
        """
        cycle = self._cycle
        if cycle.disconnected or cycle.response_complete:
            return
        transport = self._transport
        if transport is None:  # the first piece: it takes the held head along
            transport = cycle.transport
            if transport.is_closing():
                return
            transport.write(b"%x\r\n%b\r\n" % (len(body), body))
            # Later pieces past the head-holding proxy (`gateway.serve.coalesce`): no head of
            # this response is left to hold, and the next response's head is written after
            # this one completed, when nothing is written here any more.
            bare = getattr(transport, "bare", None)
            self._transport = bare() if bare is not None else transport
            return
        if transport.is_closing():
            return
        transport.write(b"%x\r\n%b\r\n" % (len(body), body))

    @property
    def paused(self) -> bool:
        """The connection's write buffer is over the high-water mark (uvicorn's flow control)."""
        return bool(self._cycle.flow.write_paused)

    def watch(self, listener: Callable[[bool], None] | None) -> None:
        """Call `listener(True)` when writing pauses, `listener(False)` when it resumes.

        None stops it.
        """
        self.listener = listener

    def done(self) -> bool:
        """The response completed or the client left: the writer is no longer used."""
        return bool(self._cycle.response_complete or self._cycle.disconnected)

    def client_gone(self) -> None:
        """The connection closed: the request's `receive` answers `http.disconnect` now.

        uvicorn's `HttpToolsProtocol.connection_lost` tells only the connection's latest
        request; a response still streaming ahead of a pipelined request would not learn that
        its client left, and would relay its whole answer to nobody (the door calls this for
        every request of the connection, `gateway.serve.door.DoorProtocol.connection_lost`).
        """
        cycle = self._cycle
        if not cycle.response_complete:
            cycle.disconnected = True
        cycle.message_event.set()

    def flow_changed(self, paused: bool) -> None:
        """The connection paused (True) or resumed (False) writing: tell the listener."""
        listener = self.listener
        if listener is not None:
            listener(paused)
