"""The gateway's uvicorn protocol: one write per head, behind the door (gateway.serve.door).

Owns `CoalescingHttpToolsProtocol` (uvicorn's httptools protocol, passed as `http=`: the door's
`DoorProtocol` over a `HeadHoldingProtocol`), and the `HeadHoldingTransport` it writes through.

**Coalescing.** uvicorn writes the status line and headers as soon as the app sends
`http.response.start`, and each body message with a write of its own. The relay sends its
headers only once the upstream's first chunk is in hand, and that chunk right after them, so a
streamed answer's first token always travelled as two TCP segments. On one host the first
segment wakes the client, which then often runs on the gateway's CPU before the gateway can
write the second: the token reaches the client a scheduler slice later (measured: about 0.5 ms
of TTFT, docs/performance.md). nginx avoids the same split with `writev` and `TCP_NOPUSH`.
`HeadHoldingTransport` holds a response head back until the next write (the first body bytes,
sent without any wait in between) and sends both in one `write`. A head that no write follows
in the same event-loop iteration (a `100 Continue`, a response whose body the app has not
produced yet) is sent at the end of that iteration, and before the transport closes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.serve.door import DoorProtocol


class HeadHoldingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a `HeadHoldingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Wrap `transport`, so that a response head goes out with the next write."""
        held = HeadHoldingTransport(transport, self.loop)
        super().connection_made(held)  # type: ignore[arg-type]


class CoalescingHttpToolsProtocol(DoorProtocol, HeadHoldingProtocol):
    """uvicorn's httptools protocol behind the door limits, over a `HeadHoldingTransport`.

    Pass `CoalescingHttpToolsProtocol.with_limits(limits)` as uvicorn's `http=`; the class
    itself carries `DoorLimits()` (no connection cap).
    """


class HeadHoldingTransport:
    """A transport proxy that sends a held response head together with the next write.

    A write that starts with `HTTP/` is a response head (uvicorn writes each head, and only
    heads, as one bytes object starting with the status line). Other attributes are the
    wrapped transport's.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        """Write `data`, after the held head if any; hold `data` if it is a head."""
        if self._held is not None:
            data, self._held = self._held + data, None
            self._transport.write(data)
        elif data[:5] == b"HTTP/":
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def bare(self) -> asyncio.Transport | HeadHoldingTransport:
        """The wrapped transport while no head is held (a body may be written to it), else self.

        Why: the push path writes every chunk of a streamed body (`gateway.serve.writer`);
        once the head went out with the first piece, each later write through this proxy cost
        two Python calls more (`is_closing`, `write`) for nothing.
        """
        return self._transport if self._held is None else self

    def flush(self) -> None:
        """Send a held head now."""
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def write_eof(self) -> None:
        """Send a held head, then close the sending side."""
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        """Send a held head, then close."""
        self.flush()
        self._transport.close()

    # The calls made per request or per written chunk, delegated explicitly: reaching them
    # through `__getattr__` first fails the normal lookup (an AttributeError raised and caught
    # inside the interpreter), about 0.8 us a call against 0.1 (timeit, uvloop's transport).
    def is_closing(self) -> bool:
        """The wrapped transport is closing or closed."""
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        """Stop reading the client's socket (uvicorn's flow control)."""
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        """Read the client's socket again."""
        self._transport.resume_reading()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
