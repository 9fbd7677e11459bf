"""One worker's exchange with the target: a keep-alive connection, one request, one record.

Owns `Client`: it holds one `gateway.clients.bench.wire.Connection`, reopens it after an error or a
close, sends a request built once, feeds the answer to a
`gateway.clients.bench.protocol.AnswerReader`
with the client's clock, and returns the `RequestRecord`. Whatever the target does (refuse,
fail, hang past `Target.timeout`) becomes a failed record, never an exception, so a closed
loop keeps its shape when the server misbehaves.
"""

from __future__ import annotations

import time

import httptools

from gateway.clients.bench import wire
from gateway.clients.bench.protocol import AnswerReader, Target
from gateway.clients.bench.records import RequestRecord

#: Seconds to open a connection.
CONNECT_TIMEOUT = 10.0
#: Backoff after consecutive failures: the first pause, and the longest.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0
#: The longest `Retry-After` honoured, seconds (a longer one is taken as this).
RETRY_AFTER_MAX = 60.0


def backoff(failures: int, retry_after: float | None) -> float:
    """Seconds to wait after `failures` (at least 1) failed requests in a row.

    The server's `Retry-After` (seconds) when it sent a positive one, at least `BACKOFF_FIRST`
    and at most `RETRY_AFTER_MAX`; else (none, or `Retry-After: 0`, which would turn the
    backoff off) `BACKOFF_FIRST` doubling per failure up to `BACKOFF_MAX`. Never 0.
    """
    if retry_after is not None and retry_after > 0:
        return min(max(retry_after, BACKOFF_FIRST), RETRY_AFTER_MAX)
    pause: float = BACKOFF_FIRST * 2.0 ** min(failures - 1, 16)
    return min(pause, BACKOFF_MAX)


class Client:
    """One worker's keep-alive connection to the target, reopened when it is lost."""

    def __init__(self, target: Target, max_tokens: int | None = None) -> None:
        """A client of `target`.

        `max_tokens` is what each request asks: a server count above it fails the record
        (`AnswerReader`); None does not check.
        """
        self.target = target
        self.max_tokens = max_tokens
        self.connection: wire.Connection | None = None
        self.failures = 0
        self.retry_after: float | None = None
        self.last_text = ""  # the last answer's content, with `keep_text`

    def pause(self, record: RequestRecord) -> float:
        """Seconds this worker waits before its next request, after `record`.

        0 after a success. After a failure `backoff`: the server's positive `Retry-After` (a
        429 or 503, capped at `RETRY_AFTER_MAX`), else an exponential backoff from
        `BACKOFF_FIRST` doubling per consecutive failure up to `BACKOFF_MAX`. A failing server
        (or a gateway limiting the key) is thus never hammered: a closed loop that answered
        errors at once would otherwise send thousands of requests a second.
        """
        if record.ok:
            self.failures = 0
            return 0.0
        self.failures += 1
        return backoff(self.failures, self.retry_after)

    async def exchange(
        self,
        request: bytes,
        model: str,
        prompt_id: str,
        warmup: bool,
        *,
        max_tokens: int | None = None,
        keep_text: bool = False,
        prompt_words: int | None = None,
        turn: int | None = None,
    ) -> RequestRecord:
        """Send one request and read its answer into a record; never raises for the target.

        Args:
            request: The whole request (`wire.request_bytes`).
            model: The model it names (for the record).
            prompt_id: The workload prompt's id (for the record).
            warmup: Sent during warm-up (for the record).
            max_tokens: This request's output limit when it differs from the client's.
            keep_text: Keep the answer's content in `last_text` (a conversation's history).
            prompt_words: Words of the prompt sent (for the record).
            turn: The conversation turn (for the record).
        """
        target = self.target
        reader = AnswerReader(
            target.api,
            target.key,
            max_tokens or self.max_tokens,
            surface=target.surface,
            keep_text=keep_text,
        )
        clock = time.perf_counter
        start = clock()
        connection = self.connection
        failure: str | None = None
        try:
            if connection is None or not connection.reusable:
                self.close()
                connection = self.connection = await wire.connect(
                    target.host, target.port, tls=target.tls, timeout=CONNECT_TIMEOUT
                )
                start = clock()
            live = connection

            def sink(piece: bytes) -> None:
                if live.status == 200:
                    reader.feed(piece, clock())
                    if reader.error is not None:
                        live.stop()  # the first error decides the record
                else:
                    reader.feed_error(piece)
                    if reader.error_body_full:
                        live.stop()  # the error text is all that is kept

            await connection.send(request, sink, timeout=target.timeout)
        except TimeoutError:
            failure = f"no end of answer within {target.timeout:g} s"
        except (OSError, httptools.HttpParserError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        end = clock()
        reader.close(end)
        self.retry_after = None if connection is None else connection.retry_after
        status = connection.status or None if connection is not None else None
        if connection is None or not connection.reusable:
            self.close()
        self.last_text = reader.text
        return reader.record(
            start,
            end,
            status,
            model,
            prompt_id,
            warmup,
            failure=failure,
            prompt_words=prompt_words,
            turn=turn,
        )

    def close(self) -> None:
        """Drop the connection."""
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.close()
