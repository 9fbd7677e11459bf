"""The Ollama emulator's timing and fault engine, shared by its native and OpenAI faces.

Owns how one generation runs once a request is valid: picking the answer (a fault before any
byte, an unknown model, a full queue, a load or unload, or a generation), sending its chunks on
schedule as a raw ASGI app (against a running deadline, so a constant batch has no drift; the
capacity model of `gateway.testing.emulator.capacity` decides the waits and gaps), playing
mid-stream faults, noticing a client disconnect (§5) and measuring what the final
chunk reports. What the chunks say is planned by `gateway.testing.emulator.content`, how they
look is the `Dialect`'s business (`gateway.testing.emulator.dialect`). `Endpoint` lets routes
return raw ASGI apps, `refusal` gives other routes the same faults before the first byte, and
`run_cancellable` gives other streams the same disconnect handling.

Over ~300 lines for one reason: `_Generation` is one timed answer: the deadline its chunks keep, the
mid-stream faults, the disconnect watch and the final chunk's counts read the same schedule, and
`answer`, `refusal` and `run_cancellable` are the ways into the same rules.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.testing.emulator.capacity import AfterLoad, Capacity, Seat
from gateway.testing.emulator.catalog import resolve
from gateway.testing.emulator.config import EmulatorConfig
from gateway.testing.emulator.content import PLAIN, Shape, plan
from gateway.testing.emulator.dialect import Dialect, Event, Piece, Summary
from gateway.testing.emulator.prefix import PromptTokens, tokenize
from gateway.testing.emulator.state import Outcome, ReceivedRequest
from gateway.testing.emulator.wire import JSON_MEDIA_TYPE, encode_json, json_response

_MIDSTREAM = frozenset(
    {"error_midstream", "hang_midstream", "drop_midstream", "eof_without_done", "malformed"}
)
_BUSY = "server busy, please try again.  maximum pending requests exceeded"  # two spaces, §4.2
_MALFORMED = '{"model":"truncated'
# llm/memory.go: a model that cannot fit even with every other model unloaded
_TOO_BIG = "model requires more system memory ({need:.1f} GiB) than is available ({have:.1f} GiB)"

Handler = Callable[[Request], Awaitable[ASGIApp]]
"""A route handler: decodes the request and returns the ASGI app that answers it."""


class Endpoint:
    """Adapt `async handler(request) -> ASGI app` into an ASGI endpoint.

    Starlette's own adapter wants a `Response`; `_Generation` is a bare ASGI app that must see
    the raw `receive` to notice disconnects, so routes use this instead.
    """

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Decode the request through the handler, then let the app it returns answer."""
        app: ASGIApp = await self._handler(Request(scope, receive))
        await app(scope, receive, send)


def refusal(config: EmulatorConfig, record: ReceivedRequest, model: str) -> tuple[int, str] | None:
    """The `(status, message)` of a fault played before any byte, or None (see `EmulatorConfig`)."""
    before = {
        "status_before": (config.fault_status, config.fault_message),
        "busy": (503, _BUSY),
        "not_found": (404, f"model '{model}' not found"),
    }
    if config.fault not in before:
        return None
    record.outcome = "fault"
    return before[config.fault]


def answer(
    dialect: Dialect,
    config: EmulatorConfig,
    record: ReceivedRequest,
    *,
    capacity: Capacity,
    model: str,
    stream: bool,
    limit: int | None,
    loaded: dict[str, Any] | None = None,
    unload: bool = False,
    shape: Shape = PLAIN,
) -> ASGIApp:
    """Pick the answer once a body is valid: a fault before any byte, 404, busy, load, generation.

    Args:
        dialect: How the face renders the answer.
        config: The request's config snapshot.
        record: The request's record.
        capacity: The models' slots and loads; a generation is admitted here, at arrival.
        model: The model as asked.
        stream: Stream the answer, or send one `stream: false` body.
        limit: `num_predict` / `max_tokens`, or None.
        loaded: The answer of the load/unload shortcut (§2.5), or None for a generation.
        unload: `keep_alive: 0`: unload now (the shortcut) or once the generation ends.
        shape: What the answer says besides plain tokens.

    Returns:
        The ASGI app that sends the answer; a full queue (`max_queue`) gets 503 and the busy text.
    """
    refused = refusal(config, record, model)
    if refused is not None:
        return json_response(refused[0], dialect.error_body(*refused))
    if resolve(model, config.models) is None:
        return json_response(404, dialect.error_body(404, f"model '{model}' not found"))
    if config.memory is not None and config.size_of(model) > config.memory:
        message = _TOO_BIG.format(need=config.size_of(model), have=config.memory)
        return json_response(500, dialect.error_body(500, message))
    if loaded is not None:
        runner = capacity.runner(model)
        if unload:
            runner.unload()
            capacity.wake()
            return json_response(200, loaded)
        return AfterLoad(capacity, runner, config, json_response(200, loaded))
    seat = capacity.seat(model, config)
    if seat is None:
        return json_response(503, dialect.error_body(503, _BUSY))
    pieces = plan(config, limit, shape)
    prompt = tokenize(record.body) if config.prefill_rate > 0 else None
    return _Generation(
        dialect,
        config,
        record,
        stream=stream,
        pieces=pieces,
        seat=seat,
        unload=unload,
        prompt=prompt,
    )


async def run_cancellable(
    record: ReceivedRequest, receive: Receive, produce: Callable[[], Awaitable[Outcome]]
) -> None:
    """Run `produce` until it ends or the client leaves, then record the outcome (§5).

    A listener task awaits `receive()` next to the producer and cancels both on
    `http.disconnect`, so a disconnect is noticed at once, even during a sleep or a hang.
    """
    outcome: Outcome | None = None
    disconnected = False
    try:
        async with anyio.create_task_group() as group:

            async def listen() -> None:
                nonlocal disconnected
                while (await receive())["type"] != "http.disconnect":
                    pass
                disconnected = True
                group.cancel_scope.cancel()

            group.start_soon(listen)
            try:
                outcome = await produce()
            except OSError:  # ASGI spec 2.4 servers raise on a send after a disconnect
                disconnected = True
            group.cancel_scope.cancel()
    finally:
        # uvicorn also reports `http.disconnect` once the response is complete, so a
        # finished producer wins; without one, the listener's verdict decides. Neither
        # means an outside cancellation, such as a server shutdown.
        record.finish(outcome or ("client_disconnect" if disconnected else "fault"))


def prompt_tokens(config: EmulatorConfig, body: object) -> int:
    """The prompt tokens a generation reports (`prompt_eval_count`, OpenAI `prompt_tokens`).

    `config.prompt_eval_count` when set (a constant, 12 by default, which the tests rely on);
    when None, the whitespace-separated words of the request's `system`, `prompt` and message
    contents (text parts of a content list included), at least 1: a rough count that grows
    with the prompt, like a tokenizer's, so a benchmark's prompt sizes can be checked.
    """
    if config.prompt_eval_count is not None:
        return config.prompt_eval_count
    if not isinstance(body, dict):
        return 1
    texts: list[object] = [body.get("system"), body.get("prompt")]
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            texts.append(message.get("content"))
    words = 0
    for text in texts:
        parts = text if isinstance(text, list) else [text]
        for part in parts:
            value = part.get("text") if isinstance(part, dict) else part
            words += len(value.split()) if isinstance(value, str) else 0
    return max(1, words)


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


class _Generation:
    """One answer as a raw ASGI app: timed chunks, faults, and disconnect detection.

    The headers go out with the first chunk only (§1); `run_cancellable` notices a disconnect.
    """

    def __init__(
        self,
        dialect: Dialect,
        config: EmulatorConfig,
        record: ReceivedRequest,
        *,
        stream: bool,
        pieces: tuple[Iterable[Piece], str],
        seat: Seat,
        unload: bool,
        prompt: PromptTokens | None = None,
    ) -> None:
        self._seat = seat
        self._prompt = prompt
        self._cached = 0
        self._unload = unload
        self._dialect = dialect
        self._config = config
        self._record = record
        self._stream = stream
        self._pieces, self._done_reason = pieces
        self._send: Send | None = None
        self._started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG002
        self._send = send
        try:
            await run_cancellable(self._record, receive, self._produce)
        finally:  # ended, failed or left: the slot (or queue place) goes to the next in line
            self._seat.leave(unload=self._unload)

    async def _produce(self) -> Outcome:
        config, record, seat = self._config, self._record, self._seat
        if config.fault == "hang_before":
            await anyio.sleep_forever()
        await seat.take(record.started_at)
        cut = config.fault_after if config.fault in _MIDSTREAM else None
        sent: list[Piece] = []
        emitted = 0
        first_at: float | None = None
        # One running deadline: each gap is added to the last one's due time, not slept from
        # the wake-up, so a constant batch gives exact gaps and late wake-ups do not add up.
        deadline = seat.prefill_start + config.ttft
        if self._prompt is not None:  # a GPU's prefill: only the tokens not in the cache
            self._cached = seat.prefill(self._prompt)
            uncached = self._prompt.count - self._cached
            if config.prefill_shared:
                await seat.share_prefill(uncached)
                deadline = time.monotonic() + config.ttft
            else:
                deadline += uncached / config.prefill_rate
        for piece in self._pieces:
            if cut is not None and piece.counted and record.tokens_sent >= cut:
                break
            await _sleep_until(deadline)
            first_at = first_at or time.monotonic()
            if self._stream and not piece.silent:
                await self._emit(self._dialect.chunk(piece, emitted))
                emitted += 1
            sent.append(piece)
            record.tokens_sent += piece.counted
            deadline += seat.gap()
        await _sleep_until(deadline)
        if cut is not None:
            return await self._fault(sent)
        summary = self._summarize(first_at, sent)
        # Decoding has stopped: free the slot before the last chunk goes out, as a real server
        # frees its slot when decoding ends, so a closed-loop client's next request, sent on
        # reading this chunk, never finds the slot still taken (a spurious 503 with max_queue 0).
        seat.leave(unload=self._unload)
        if self._stream:
            await self._emit(self._dialect.finish(summary), more_body=False)
        else:
            await self._respond(200, encode_json(self._dialect.body(sent, summary)))
        return "completed"

    async def _fault(self, sent: list[Piece]) -> Outcome:
        """Play a mid-stream fault at the point where the next chunk was due."""
        config, dialect = self._config, self._dialect
        if config.fault == "hang_midstream":
            await anyio.sleep_forever()
        if config.fault == "drop_midstream":
            # Returning with the body unfinished makes uvicorn close the transport mid-body
            # ("ASGI callable returned without completing response"): the client sees a
            # truncated chunked body. Without streaming the headers go out first, then the drop.
            await self._start()
            return "fault"
        if not self._stream:
            if config.fault == "error_midstream":  # §2.4: the partial text is discarded
                error = dialect.error_body(config.fault_status, config.fault_message)
                await self._respond(config.fault_status, encode_json(error))
            elif config.fault == "eof_without_done":
                await self._respond(200, encode_json(dialect.body(sent, None)))
            else:
                await self._respond(200, _MALFORMED)
            return "fault"
        events: dict[str, list[Event]] = {
            "error_midstream": dialect.midstream_error(config.fault_message),
            "malformed": [_MALFORMED],
            "eof_without_done": [],
        }
        await self._emit(events[str(config.fault)], more_body=False)
        return "fault"

    def _summarize(self, first_at: float | None, sent: list[Piece]) -> Summary:
        now = time.monotonic()
        first = now if first_at is None else first_at
        prefill = _ns(first - self._seat.prefill_start)  # the queue wait and the load excluded
        warm = min(self._config.load_duration_ns, prefill)
        prompt = self._prompt
        return Summary(
            done_reason=self._done_reason,
            prompt_eval_count=(
                prompt_tokens(self._config, self._record.body) if prompt is None else prompt.count
            ),
            cached_tokens=None if prompt is None else self._cached,
            eval_count=sum(piece.counted for piece in sent),
            total_duration=_ns(now - self._record.started_at),
            load_duration=_ns(self._seat.load_seconds) + warm,
            prompt_eval_duration=prefill - warm,
            eval_duration=_ns(now - first),
            tool_called=any(piece.tool_call for piece in sent),
        )

    async def _start(self, status: int = 200, media_type: str | None = None) -> None:
        if self._started or self._send is None:
            return
        self._started = True
        media_type = media_type or (self._dialect.media_type if self._stream else JSON_MEDIA_TYPE)
        headers = [(b"content-type", media_type.encode())]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def _emit(self, events: list[Event], *, more_body: bool = True) -> None:
        texts = (event if isinstance(event, str) else encode_json(event) for event in events)
        frame = "data: {}\n\n" if self._dialect.sse else "{}\n"
        await self._start()
        body = "".join(frame.format(text) for text in texts).encode()
        assert self._send is not None  # noqa: S101 - set by __call__
        await self._send({"type": "http.response.body", "body": body, "more_body": more_body})

    async def _respond(self, status: int, text: str) -> None:
        """Send a whole `stream: false` answer in one piece, like gin's `c.JSON`."""
        body = text.encode()
        assert self._send is not None  # noqa: S101 - set by __call__
        headers = [
            (b"content-type", JSON_MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        self._started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})


#: Seconds before a deadline that a long sleep wakes up, to sleep the rest in a short one.
_LANDING = 0.02


async def _sleep_until(deadline: float) -> None:
    """Sleep until `deadline` (monotonic seconds), late by about a millisecond at most.

    A long sleep on a coarse kernel timer wakes late (10 ms after a 0.3 s sleep on the test
    VM: the timer wheel's slack grows with the timeout), which would add to every TTFT the
    emulator is meant to reproduce exactly; a short sleep is accurate. So: long, then short.
    """
    left = deadline - time.monotonic()
    if left > _LANDING:
        await anyio.sleep(left - _LANDING)
        left = deadline - time.monotonic()
    # Always once, even when due already: sleep(0) lets the loop run (the client's flow
    # control, a disconnect) between two tokens sent at full speed.
    await anyio.sleep(max(0.0, left))
