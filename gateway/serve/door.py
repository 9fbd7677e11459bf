"""The door: what a client connection may do before and while it sends a request.

Owns `DoorProtocol` (uvicorn's httptools protocol behind these limits; `gateway.serve.coalesce`
builds the protocol passed as `http=` on it) and its `DoorLimits`; what it counts across a
server's connections (refusals, connections per address) is `gateway.serve.tallies`'.

**The door.** uvicorn's httptools protocol keeps a connection that sends nothing, or sends its
headers a byte at a time, for ever: its keep-alive timer starts only once a response is
complete, and httptools puts no bound on a request head (uvicorn's `h11_max_incomplete_event_size`
exists for h11 only). A few thousand such connections use up the process's file descriptors and
new clients are reset. So, per connection:

- the request head must be complete within `header_timeout` seconds of the connection opening,
  or, on a kept-alive connection, of its first byte (until then uvicorn's `timeout_keep_alive`
  applies). Over it: 408 if part of a head arrived, else a plain close;
- at most `body_timeout` seconds may pass between two pieces of a request body (not counted
  while the gateway itself stops reading, or holds back a `100 Continue`). Over it: 408;
- a head may hold at most `max_header_bytes` bytes (request target and header lines) and
  `max_headers` header fields. Over it: 431 (RFC 6585 section 5), counted while the head
  arrives, so an endless header is cut after about that many bytes, not buffered;
- at most `max_connections` connections are open per process; one more is answered 503 at once
  and closed (uvicorn's `limit_concurrency` cannot do this: it answers only once a request head
  has arrived, so idle connections still pile up, and it counts in-flight tasks too);
- at most `max_connections_per_address` of them come from one client address (an IPv4 address,
  an IPv6 /64: `gateway.limits.address.address_bucket`), so that one client cannot take the
  whole process (idle or half-sent heads, reopened as the header deadline closes them); one
  more is answered 503 the same way. The address is the TCP peer's, since no header has arrived
  yet: a peer in `trusted_proxies` (a reverse proxy, a load balancer) carries many clients on
  its connections and has no share. Each refused address is logged once a minute.

Once the head is in, nothing here bounds the response: a generation streams as long as the
relay's own deadlines allow. Refusals are error bodies in the dialect of the path the request
line named (`gateway.errors.error_body`: Anthropic's on `/v1/messages`, OpenAI's error object
on the OpenAI API, Ollama's `{"error": ...}` elsewhere and before any path arrived), with
`Connection: close`; where the client may still be sending, the gateway reads and discards for
up to `LINGER` seconds after its answer (nginx's lingering close), so the answer is not lost to
a TCP reset.

Over ~300 lines for one reason: `DoorProtocol` is one state machine over uvicorn's callbacks
(connection, head, body, response, timers), and its parts read each other's state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.errors import error_body
from gateway.relay.push import WRITER
from gateway.serve.logs import escape_text
from gateway.serve.tallies import AddressShares, DoorReport, Network, shared_address
from gateway.serve.writer import BodyWriter

# The name from before the door had a module of its own: log lines and filters stay the same.
logger = logging.getLogger("gateway.coalesce")

#: Seconds a refused connection is still read (and the bytes dropped) after the answer.
LINGER = 2.0


@dataclass(frozen=True)
class DoorLimits:
    """What one client connection may take (GATEWAY_HEADER_TIMEOUT and companions).

    Attributes:
        header_timeout: Seconds for a request head to arrive (module docstring).
        body_timeout: Seconds allowed between two pieces of a request body.
        max_header_bytes: Bytes of one request head.
        max_headers: Header fields of one request.
        max_connections: Open client connections per process; 0: no cap.
        max_connections_per_address: Open client connections per process from one client
            address (IPv6: one /64); 0: no share.
        trusted_proxies: Networks whose connections have no per-address share
            (`GATEWAY_TRUSTED_PROXIES`).
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    max_connections: int = 0
    max_connections_per_address: int = 0
    trusted_proxies: tuple[Network, ...] = ()


def _answer(
    status: int, message: str, headers: list[tuple[bytes, bytes]], target: bytes = b""
) -> bytes:
    """A whole HTTP/1.1 response ending the connection, with an error body for `target`.

    Args:
        status: The HTTP status.
        message: The error's text.
        headers: Extra header lines (the server's default headers, `Retry-After`).
        target: The request target received so far (possibly cut short); its path chooses the
            dialect of the body. Empty (no request line yet): Ollama's.
    """
    path = target.split(b"?", 1)[0].decode("latin-1")
    body = error_body(path, status, message)
    lines = [STATUS_LINE[status]]
    for name, value in [
        *headers,
        (b"content-type", b"application/json; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]:
        lines.append(name + b": " + value + b"\r\n")
    return b"".join([*lines, b"\r\n", body])


class DoorProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol behind the door limits.

    A cooperative base: what it lets in goes on to the next class's `connection_made`.
    `with_limits(limits)` gives the class to pass as uvicorn's `http=`; the class itself carries
    `DoorLimits()` (no connection cap).
    """

    limits: ClassVar[DoorLimits] = DoorLimits()
    report: ClassVar[DoorReport] = DoorReport()
    shares: ClassVar[AddressShares] = AddressShares()

    @classmethod
    def with_limits(
        cls, limits: DoorLimits, count: Callable[[str], None] | None = None
    ) -> type[Self]:
        """A subclass enforcing `limits`, with its own report and shares (one per server).

        Args:
            limits: The door's limits.
            count: Called with each refusal's reason (`DoorReport.note`), e.g. a counter's.
        """
        report = DoorReport(count=count)
        attributes = {"limits": limits, "report": report, "shares": AddressShares()}
        return cast(type[Self], type(cls.__name__, (cls,), attributes))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None  # the head or the body deadline
        self._address: str | None = None  # the address share this connection holds, if any
        self._closing = False  # refused or answered: incoming bytes are dropped
        self._head_pending = True  # between two requests, or inside a head
        self._head_began = False  # bytes of the pending head have arrived
        self._head_received = 0  # bytes received while the head was pending (at most the head)
        self._head_size = 0  # the target and header lines parsed so far
        self._header_count = 0
        self._too_large = False
        self._body_seen_at = 0.0
        self._writers: list[BodyWriter] = []  # the push path's writers of this connection
        self.url = b""  # uvicorn sets it per request head; an answer before one reads it

    # --- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuse the connection over the cap or its address's share; else let it in.

        What is let in starts the head deadline.
        """
        limits = self.limits
        cap = limits.max_connections
        if cap and len(self.connections) >= cap:
            # Not in uvicorn's `connections`: refused connections neither count nor get drained.
            self.report.note("connections", "over GATEWAY_MAX_CLIENT_CONNECTIONS")
            self._refuse(transport, f"the gateway has too many open connections ({cap})")
            return
        share = limits.max_connections_per_address
        address = shared_address(transport, limits.trusted_proxies) if share else None
        if address is not None:
            if not self.shares.take(address, share):
                self.report.note(
                    "connections_per_address", "over GATEWAY_MAX_CLIENT_CONNECTIONS_PER_ADDRESS"
                )
                if self.shares.first_refusal(address):
                    logger.warning(
                        "client %s holds %d open connections, its share "
                        "(GATEWAY_MAX_CLIENT_CONNECTIONS_PER_ADDRESS): refusing more with 503 "
                        "(logged once a minute per address)",
                        escape_text(address),
                        share,
                    )
                message = f"too many open connections from this address ({share})"
                self._refuse(transport, message)
                return
            self._address = address
        super().connection_made(transport)
        self._arm(limits.header_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the deadlines, give back the address's share (a refused one reached nothing).

        Every request of the connection is told that its client left, not only the latest.
        """
        self._disarm()
        if self._address is not None:
            self.shares.release(self._address)
            self._address = None
        if self.flow is None:  # refused in `connection_made`
            return
        super().connection_lost(exc)
        # uvicorn tells only its latest request (`self.cycle`): a stream ahead of a pipelined
        # request must learn that its client left too, or it relays its whole answer to nobody.
        for writer in self._writers:
            writer.client_gone()
        self._writers = []

    def data_received(self, data: bytes) -> None:
        """Parse `data` (uvicorn), counting the bytes of a pending head; answer 431 over the cap."""
        if self._closing:
            return
        if self._head_pending:
            self._head_received += len(data)
        super().data_received(data)
        if self._closing or self.transport.is_closing():
            return
        # The head is still incomplete after all of `data`: every byte counted belongs to it.
        if self._too_large or (
            self._head_pending and self._head_received > self.limits.max_header_bytes
        ):
            self._refuse_head()

    # --- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        """The first byte of a head: on a kept-alive connection its deadline starts now."""
        if self._too_large:
            return
        super().on_message_begin()
        self._head_began = True
        if self._timer is None and not self._responding():
            self._arm(self.limits.header_timeout, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        """Count the request target towards the head's size."""
        if self._too_large:
            return
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count one header field; over a cap, parse nothing more of this connection."""
        if self._too_large:
            return
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4  # ": " and CRLF
        limits = self.limits
        if self._header_count > limits.max_headers or self._head_size > limits.max_header_bytes:
            self._too_large = True  # data_received answers once the parser returns
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        """The head is in: stop its deadline, start the app, start the body deadline."""
        if self._too_large:
            return
        self._head_pending = self._head_began = False
        self._disarm()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not a WebSocket upgrade
            writer = BodyWriter(cycle)
            self._writers = [w for w in self._writers if not w.done()]
            self._writers.append(writer)
            extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
            extensions[WRITER] = writer
        if not self.parser.should_upgrade():
            self._body_seen_at = self.loop.time()
            self._arm(self.limits.body_timeout, self._body_timed_out)

    def on_body(self, body: bytes) -> None:
        """A piece of the body arrived: its deadline restarts (lazily, see `_body_timed_out`)."""
        if self._too_large:
            return
        self._body_seen_at = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        """The request is in: no deadline until the next head begins."""
        if self._too_large:
            return
        super().on_message_complete()
        self._disarm()
        self._head_pending = True
        self._head_received = self._head_size = self._header_count = 0

    def on_response_complete(self) -> None:
        """Let uvicorn start its keep-alive timer or the next request; time a begun head.

        A head that began while the response was being written gets its deadline from now.
        """
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if (
            self._head_began
            and not pipelined
            and self._timer is None
            and not self.transport.is_closing()
        ):
            self._arm(self.limits.header_timeout, self._head_timed_out)

    def pause_writing(self) -> None:
        """The client's write buffer is full: uvicorn's flow control, then the push path's."""
        super().pause_writing()
        for writer in self._writers:
            writer.flow_changed(True)

    def resume_writing(self) -> None:
        """The client's write buffer drained: uvicorn's flow control, then the push path's."""
        super().resume_writing()
        for writer in self._writers:
            writer.flow_changed(False)

    def _should_upgrade(self) -> bool:
        """Never hand a head cut short by a cap to uvicorn's WebSocket upgrade (no method)."""
        return not self._too_large and super()._should_upgrade()

    # --- deadlines and refusals ---------------------------------------------------------------

    def _responding(self) -> bool:
        """A response is being produced or waits in the pipeline."""
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        """No complete head in time: 408 if part of one came, else close (as keep-alive does)."""
        self._timer = None
        if self.transport.is_closing():
            return
        self.report.note("head_timeout", "head too slow (GATEWAY_HEADER_TIMEOUT)")
        if not self._head_began:
            self.transport.close()
            return
        seconds = self.limits.header_timeout
        message = f"the request head did not arrive within {seconds:g} s"
        answer = _answer(408, message, self.server_state.default_headers, self.url)
        self._end(answer, linger=False)

    def _body_timed_out(self) -> None:
        """Nothing of the body for `body_timeout` seconds: 408 (or a close once answering)."""
        self._timer = None
        if self.transport.is_closing():
            return
        timeout = self.limits.body_timeout
        idle = self.loop.time() - self._body_seen_at
        cycle = self.cycle
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            # The gateway is the one not reading: the client gets a fresh window afterwards.
            self._body_seen_at = self.loop.time()
            self._arm(timeout, self._body_timed_out)
            return
        if idle < timeout:  # a piece came meanwhile; on_body does not re-arm, for speed
            self._arm(timeout - idle, self._body_timed_out)
            return
        self.report.note("body_timeout", "body too slow (GATEWAY_BODY_TIMEOUT)")
        started = cycle.response_started
        # The app's receive() sees a disconnect now, and its writes go nowhere.
        cycle.disconnected = True
        cycle.message_event.set()
        if started:
            self.transport.close()
            return
        message = f"the request body stopped arriving for {timeout:g} s"
        answer = _answer(408, message, self.server_state.default_headers, self.url)
        self._end(answer, linger=False)

    def _refuse_head(self) -> None:
        """431, or a plain close if a pipelined response is still being written."""
        self.report.note(
            "head_too_large", "head too large (GATEWAY_MAX_HEADER_BYTES, GATEWAY_MAX_HEADERS)"
        )
        self._too_large = True
        if self._responding():
            self.transport.close()  # an answer now would corrupt the one being sent
            return
        limits = self.limits
        message = (
            f"request header fields too large (at most {limits.max_header_bytes} bytes "
            f"and {limits.max_headers} fields)"
        )
        answer = _answer(431, message, self.server_state.default_headers, self.url)
        self._end(answer, linger=True)

    def _refuse(self, transport: asyncio.Transport, why: str) -> None:
        """Answer a connection just made 503 (`why`; try again later) and close it."""
        self.transport = transport
        answer = _answer(503, f"{why}; try again later", [(b"retry-after", b"1")])
        self._end(answer, linger=True)

    def _end(self, answer: bytes, *, linger: bool) -> None:
        """Write `answer` and close the connection.

        With `linger`, half-close and drop what still comes for up to `LINGER` seconds (or
        until the client closes): closing with unread bytes would reset `answer` away.
        """
        self._closing = True
        self._disarm()
        transport = self.transport
        transport.write(answer)
        if linger and transport.can_write_eof():
            transport.write_eof()
            self._timer = self.loop.call_later(LINGER, transport.close)
        else:
            transport.close()
