"""A faithful Ollama emulator for tests and benchmarks (reference: ollama-protocol.md, v0.33.0).

Owns the emulated server: its knobs (`EmulatorConfig`), what it saw (`EmulatorState`,
`ReceivedRequest`), the native `/api/*` wire format, the timing and fault engine that both the
native and the OpenAI-compatible face (`gateway.testing.emulator_openai`) run on, the app factory
and a CLI. Fidelity items (reference §11 "Emulator"):

* headers go out with the first chunk, never before it (§1); nothing is sent while "loading";
* NDJSON, `application/json; charset=utf-8` and SSE content types; compact Go-style JSON with
  HTML escaping and RFC3339Nano `created_at` (§1);
* a final chunk with `done_reason`, `context` (generate only) and metrics in nanoseconds whose
  zero fields are omitted (§2.3); `stream: false` aggregation (§2.4); load/unload shortcuts (§2.5);
* the statuses and texts of §4.2, mid-stream error lines (§4.3, §4.4), the loopback `Host` and
  `Origin` gates (§6.8), and generation that stops, and is recorded, on a client disconnect (§5).

Run it with `python -m gateway.testing.emulator --port 11434`, or in-process with
`gateway.testing.server.LoopbackServer(create_emulator_app(config))`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import ipaddress
import itertools
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, get_args

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.testing.emulator_openai import (
    ChatCompletionDialect,
    CompletionDialect,
    error_object,
    model_list,
    parse_request,
)

Fault = Literal[
    "status_before",
    "busy",
    "not_found",
    "error_midstream",
    "hang_before",
    "hang_midstream",
    "drop_midstream",
    "eof_without_done",
    "malformed",
]
Outcome = Literal["completed", "client_disconnect", "fault"]
Event = dict[str, Any] | str
"""One streamed event: a JSON object, or raw text such as SSE `[DONE]`."""

FAULTS: frozenset[str] = frozenset(get_args(Fault))
_MIDSTREAM = frozenset(
    {"error_midstream", "hang_midstream", "drop_midstream", "eof_without_done", "malformed"}
)
_BUSY = "server busy, please try again.  maximum pending requests exceeded"  # two spaces, §4.2
_MALFORMED = '{"model":"truncated'
_JSON = "application/json; charset=utf-8"
_RECORD_KEY = "gateway.emulator.record"


@dataclass
class EmulatorConfig:
    """The emulator's knobs. Mutable: tests change them between requests.

    Each request takes a snapshot when it arrives, so a change never affects one in flight.
    `ttft` covers load plus prefill; the reported durations are measured from the real delays
    (`load_duration` is `load_duration_ns` capped at the measured TTFT, `prompt_eval_duration`
    the rest of it, `eval_duration` from the first chunk to the final one).

    Attributes:
        models: Installed model names; any other model gets 404 (§4.2).
        ttft: Seconds from arrival to the first chunk, and to the headers (§1).
        inter_token: Seconds between chunks.
        tokens: Content tokens per answer (`"tok0 "`, `"tok1 "`, ...).
        thinking_tokens: Thinking-only chunks sent before the content (§2.3).
        empty_first_chunk: Send one chunk with empty text first.
        fault: None, or one of these (`FAULTS`). Before any byte: `status_before`
            (`fault_status` with `fault_message`), `busy` (503 and the busy text), `not_found`
            (404 for any model), `hang_before` (never answer; only the client leaving ends
            it). After `fault_after` tokens, at the time the next chunk was due:
            `error_midstream` (one error line, then the end; status stays 200, §4.3/§4.4),
            `hang_midstream` (send nothing more, keep the connection open),
            `drop_midstream` (close the TCP connection mid-body), `eof_without_done` (end the
            body cleanly with no final chunk), `malformed` (one line that is not JSON, then
            the end). Without streaming, `error_midstream` answers `fault_status` (§2.4) and
            `eof_without_done` answers `done: false` without metrics.
        fault_after: Tokens sent before a mid-stream fault.
        fault_status: Status of `status_before`, and of `error_midstream` without streaming.
        fault_message: Error text of `status_before` and `error_midstream`.
        version: What `/api/version` reports.
        host_gate: 403 with an empty body for a non-local `Host` (§6.8).
        origin_gate: 403 with an empty body for a disallowed `Origin` (§6.8).
        omit_usage: Never send `usage` on `/v1`, like servers without `include_usage`.
        prompt_eval_count: Reported prompt tokens (0 is omitted, §9.2).
        load_duration_ns: Reported `load_duration` (0 is omitted).
    """

    models: list[str] = field(default_factory=lambda: ["llama3.2:latest", "qwen2.5:7b"])
    ttft: float = 0.05
    inter_token: float = 0.01
    tokens: int = 16
    thinking_tokens: int = 0
    empty_first_chunk: bool = False
    fault: Fault | None = None
    fault_after: int = 5
    fault_status: int = 500
    fault_message: str = "an error was encountered while running the model"
    version: str = "0.33.0"
    host_gate: bool = True
    origin_gate: bool = True
    omit_usage: bool = False
    prompt_eval_count: int = 12
    load_duration_ns: int = 1_000_000


@dataclass(eq=False)
class ReceivedRequest:
    """One request as the emulator saw it. Written by the server thread, read by tests.

    The record ends just after the last byte is handed to the server, so a client can see the
    end first: call `wait_ended` before reading `outcome` or `ended_at`.

    Attributes:
        method: HTTP method.
        path: URL path without the query.
        headers: Lower-case names; repeated headers joined with ", ".
        body: The decoded JSON body, or None (no body, or not JSON).
        started_at: `time.monotonic()` at arrival.
        first_byte_at: When the status line and headers went out, or None.
        ended_at: When the exchange ended, or None while it runs.
        tokens_sent: Tokens produced (streamed, or held for a `stream: false` body).
        outcome: `completed` (whatever the status), `client_disconnect` (the client left before
            the end) or `fault` (an injected fault ended it); None while it runs.
        status: The response status, or None before the headers.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: Any = None
    started_at: float = field(default_factory=time.monotonic)
    first_byte_at: float | None = None
    ended_at: float | None = None
    tokens_sent: int = 0
    outcome: Outcome | None = None
    status: int | None = None
    _ended: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def wait_ended(self, timeout: float) -> bool:
        """Block until the exchange ended or the disconnect was noticed; False on timeout."""
        return self._ended.wait(timeout)

    def finish(self, outcome: Outcome) -> None:
        """Mark the end once; an outcome set earlier (e.g. `fault`) wins."""
        if self._ended.is_set():
            return
        if self.outcome is None:
            self.outcome = outcome
        self.ended_at = time.monotonic()
        self._ended.set()


class EmulatorState:
    """The live config plus every request seen, shared between the server and test threads."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.booted_at = time.time()
        self._arrived = threading.Condition()
        self._records: list[ReceivedRequest] = []
        self._ids = itertools.count()

    @property
    def records(self) -> list[ReceivedRequest]:
        """A snapshot of the requests seen so far, oldest first."""
        with self._arrived:
            return list(self._records)

    def add(self, record: ReceivedRequest) -> None:
        """Append a new request and wake `wait_for_requests`."""
        with self._arrived:
            self._records.append(record)
            self._arrived.notify_all()

    def wait_for_requests(self, count: int, timeout: float) -> bool:
        """Block until at least `count` requests arrived; False on timeout."""
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self._records) >= count, timeout)

    def clear(self) -> None:
        """Forget the requests seen (long benchmarks call this to bound memory)."""
        with self._arrived:
            self._records.clear()

    def next_id(self) -> int:
        """Return a per-app sequence number for `/v1` ids."""
        return next(self._ids)


# --- wire encoding (§1) --------------------------------------------------------------------------


def encode_json(obj: object) -> str:
    """Encode like Go's `json.Marshal`: compact, UTF-8, with `<`, `>`, `&` HTML-escaped."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    # These characters only occur inside JSON strings, so a plain replace is exact.
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _created_at() -> str:
    """RFC3339Nano in UTC with trailing fraction zeros trimmed, as Go prints it."""
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


def _local_time(timestamp: float) -> str:
    """RFC3339 with the local offset (`modified_at`, `expires_at`)."""
    text = datetime.fromtimestamp(timestamp).astimezone().isoformat()
    return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text


def _json(status: int, obj: object) -> Response:
    return Response(encode_json(obj), status_code=status, media_type=_JSON)


_GO_JSON_ERRORS = {
    "Expecting value": "looking for beginning of value",
    "Expecting property name enclosed in double quotes": (
        "looking for beginning of object key string"
    ),
    "Expecting ':' delimiter": "after object key",
    "Expecting ',' delimiter": "after object key:value pair",
    "Extra data": "after top-level value",
}


def _go_json_error(exc: json.JSONDecodeError) -> str:
    """Approximate the Go `encoding/json` error text for a malformed body (§1)."""
    if not exc.doc[exc.pos :].strip():
        return "unexpected EOF"
    where = _GO_JSON_ERRORS.get(exc.msg, "looking for beginning of value")
    return f"invalid character '{exc.doc[exc.pos]}' {where}"


def _reject_constant(name: str) -> object:
    """Refuse `NaN` and `Infinity`, which Python accepts and Go's decoder does not."""
    raise json.JSONDecodeError("Expecting value", name, name.startswith("-"))


def _go_kind(value: object) -> str:
    kinds = ((bool, "bool"), (str, "string"), (list, "array"), (dict, "object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "number")


async def _read_json(
    request: Request, record: ReceivedRequest, struct: str, empty: str
) -> str | None:
    """Decode the body into `record.body` the way gin's `ShouldBindJSON` would (§1).

    Returns:
        None when the body is a usable object, else the 400 error text.
    """
    raw = (await request.body()).decode("utf-8", "replace")
    if not raw.strip():
        return empty
    try:
        record.body = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return _go_json_error(exc)
    if record.body is None:  # JSON null decodes into a zero struct
        record.body = {}
    if not isinstance(record.body, dict):
        return f"json: cannot unmarshal {_go_kind(record.body)} into Go value of type {struct}"
    model = record.body.get("model", "")
    if not isinstance(model, str):
        name = struct.rsplit(".", 1)[-1]
        return (
            f"json: cannot unmarshal {_go_kind(model)} into Go struct field {name}.model"
            " of type string"
        )
    return None


# --- what a generation produces ------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """One streamed chunk's text; `counted` is False for the empty first chunk."""

    content: str = ""
    thinking: str = ""
    counted: bool = True


@dataclass(frozen=True)
class Summary:
    """What the final chunk reports (§2.3). Durations are nanoseconds."""

    done_reason: str
    prompt_eval_count: int
    eval_count: int
    total_duration: int
    load_duration: int
    prompt_eval_duration: int
    eval_duration: int

    def metrics(self) -> dict[str, int]:
        """The metric fields in Go struct order, zero ones omitted (`omitempty`, §9.2)."""
        names = (
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_count",
            "eval_duration",
        )
        return {name: getattr(self, name) for name in names if getattr(self, name)}


class Dialect(Protocol):
    """How one endpoint family renders what the engine produces."""

    @property
    def sse(self) -> bool:
        """True for `data: ...` SSE framing, False for NDJSON lines."""

    @property
    def media_type(self) -> str:
        """Content type of a streamed answer."""

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """Render an error sent before the first byte."""

    def chunk(self, piece: Piece, index: int) -> list[Event]:
        """Render one token chunk."""

    def finish(self, summary: Summary) -> list[Event]:
        """Render the end of a complete stream."""

    def midstream_error(self, message: str) -> list[Event]:
        """Render an error after the status line went out."""

    def body(self, pieces: list[Piece], summary: Summary | None) -> dict[str, Any]:
        """Render a `stream: false` answer; `summary` is None when no final chunk came."""


class _NativeDialect:
    """Renders `/api/generate` (§2) and `/api/chat` (§3) in Go struct field order."""

    sse = False
    media_type = "application/x-ndjson"

    def __init__(self, model: str, *, chat: bool, context: bool) -> None:
        self._model = model
        self._chat = chat
        self._context = context and not chat  # /api/chat never returns context

    def _text(self, content: str, thinking: str) -> dict[str, Any]:
        head: dict[str, Any] = {"model": self._model, "created_at": _created_at()}
        if self._chat:
            message = {"role": "assistant", "content": content}
            return {**head, "message": message | ({"thinking": thinking} if thinking else {})}
        return {**head, "response": content} | ({"thinking": thinking} if thinking else {})

    def _final(self, summary: Summary, content: str, thinking: str) -> dict[str, Any]:
        final = {**self._text(content, thinking), "done": True, "done_reason": summary.done_reason}
        if self._context:  # prompt plus output token ids, re-tokenized at the end (§2.3)
            final["context"] = list(range(1, summary.prompt_eval_count + summary.eval_count + 1))
        return final | summary.metrics()

    def loaded(self, reason: str) -> dict[str, Any]:
        """Render the load or unload answer to an empty prompt or message list (§2.5)."""
        return {**self._text("", ""), "done": True, "done_reason": reason}

    def error_body(self, status: int, message: str) -> dict[str, Any]:  # noqa: ARG002
        """Render `{"error": message}` (§4.1)."""
        return {"error": message}

    def chunk(self, piece: Piece, index: int) -> list[Event]:  # noqa: ARG002
        """Render one token chunk."""
        return [{**self._text(piece.content, piece.thinking), "done": False}]

    def finish(self, summary: Summary) -> list[Event]:
        """Render the separate empty final chunk that carries the metrics (§9.2 item 10)."""
        return [self._final(summary, "", "")]

    def midstream_error(self, message: str) -> list[Event]:
        """Render the bare `{"error": ...}` line; no `done` chunk follows (§4.3)."""
        return [{"error": message}]

    def body(self, pieces: list[Piece], summary: Summary | None) -> dict[str, Any]:
        """Aggregate text and thinking; the rest comes from the last chunk (§2.4)."""
        content = "".join(piece.content for piece in pieces)
        thinking = "".join(piece.thinking for piece in pieces)
        if summary is None:  # no final chunk: done false and no metrics (§2.4 pitfall)
            return {**self._text(content, thinking), "done": False}
        return self._final(summary, content, thinking)


# --- the engine ----------------------------------------------------------------------------------


def _plan(config: EmulatorConfig, limit: int | None) -> tuple[list[Piece], str]:
    """Lay out the chunks of one answer and its `done_reason` (`length` when cut by a limit)."""
    pieces = [Piece(thinking=f"think{i} ") for i in range(config.thinking_tokens)]
    pieces += [Piece(content=f"tok{i} ") for i in range(config.tokens)]
    reason = "stop"
    if limit is not None and 0 <= limit < len(pieces):
        pieces, reason = pieces[:limit], "length"
    if config.empty_first_chunk:
        pieces.insert(0, Piece(counted=False))
    return pieces, reason


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


class _Generation:
    """One answer as a raw ASGI app: timed chunks, faults, and disconnect detection.

    A listener task awaits `receive()` next to the producer and cancels both on
    `http.disconnect`, so a disconnect is noticed at once, even during a sleep or a hang (§5).
    The headers go out with the first chunk only (§1).
    """

    def __init__(
        self,
        dialect: Dialect,
        config: EmulatorConfig,
        record: ReceivedRequest,
        *,
        stream: bool,
        limit: int | None,
    ) -> None:
        self._dialect = dialect
        self._config = config
        self._record = record
        self._stream = stream
        self._pieces, self._done_reason = _plan(config, limit)
        self._send: Send | None = None
        self._started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG002
        self._send = send
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
                    outcome = await self._produce()
                except OSError:  # ASGI spec 2.4 servers raise on a send after a disconnect
                    disconnected = True
                group.cancel_scope.cancel()
        finally:
            # uvicorn also reports `http.disconnect` once the response is complete, so a
            # finished producer wins; without one, the listener's verdict decides. Neither
            # means an outside cancellation, such as a server shutdown.
            self._record.finish(outcome or ("client_disconnect" if disconnected else "fault"))

    async def _produce(self) -> Outcome:
        config, record = self._config, self._record
        if config.fault == "hang_before":
            await anyio.sleep_forever()
        cut = config.fault_after if config.fault in _MIDSTREAM else None
        sent: list[Piece] = []
        first_at: float | None = None
        for piece in self._pieces:
            if cut is not None and piece.counted and record.tokens_sent >= cut:
                break
            # Schedule against the arrival time, so sleeps do not accumulate drift.
            await _sleep_until(record.started_at + config.ttft + len(sent) * config.inter_token)
            first_at = first_at or time.monotonic()
            if self._stream:
                await self._emit(self._dialect.chunk(piece, len(sent)))
            sent.append(piece)
            record.tokens_sent += piece.counted
        await _sleep_until(record.started_at + config.ttft + len(sent) * config.inter_token)
        if cut is not None:
            return await self._fault(sent)
        summary = self._summarize(first_at, sent)
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
        ttft = _ns(first - self._record.started_at)
        load = min(self._config.load_duration_ns, ttft)
        return Summary(
            done_reason=self._done_reason,
            prompt_eval_count=self._config.prompt_eval_count,
            eval_count=sum(piece.counted for piece in sent),
            total_duration=_ns(now - self._record.started_at),
            load_duration=load,
            prompt_eval_duration=ttft - load,
            eval_duration=_ns(now - first),
        )

    async def _start(self, status: int = 200, media_type: str | None = None) -> None:
        if self._started or self._send is None:
            return
        self._started = True
        media_type = media_type or (self._dialect.media_type if self._stream else _JSON)
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
        headers = [(b"content-type", _JSON.encode()), (b"content-length", str(len(body)).encode())]
        self._started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})


async def _sleep_until(deadline: float) -> None:
    await anyio.sleep(max(0.0, deadline - time.monotonic()))


# --- endpoints -----------------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[ASGIApp]]


class _Endpoint:
    """Adapt `async handler(request) -> ASGI app` into an ASGI endpoint.

    Starlette's own adapter wants a `Response`; `_Generation` is a bare ASGI app that must see
    the raw `receive` to notice disconnects, so routes use this instead.
    """

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app: ASGIApp = await self._handler(Request(scope, receive))
        await app(scope, receive, send)


def _context(request: Request) -> tuple[EmulatorState, EmulatorConfig, ReceivedRequest]:
    """Return the state, a snapshot of the config taken now, and this request's record."""
    state: EmulatorState = request.app.state.emulator
    return state, dataclasses.replace(state.config), request.scope[_RECORD_KEY]


def _resolve(name: str, models: list[str]) -> str | None:
    """Find an installed model; the tag defaults to `latest`, matching ignores case (§2.1)."""
    wanted = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
    return next((model for model in models if model.lower() == wanted.lower()), None)


def _answer(
    dialect: Dialect,
    config: EmulatorConfig,
    record: ReceivedRequest,
    *,
    model: str,
    stream: bool,
    limit: int | None,
    loaded: dict[str, Any] | None = None,
) -> ASGIApp:
    """Pick the answer once a body is valid: a fault before any byte, 404, load, or a generation."""
    before = {
        "status_before": (config.fault_status, config.fault_message),
        "busy": (503, _BUSY),
        "not_found": (404, f"model '{model}' not found"),
    }
    if config.fault in before:
        record.outcome = "fault"
        status, message = before[config.fault]
        return _json(status, dialect.error_body(status, message))
    if _resolve(model, config.models) is None:
        return _json(404, dialect.error_body(404, f"model '{model}' not found"))
    if loaded is not None:
        return _json(200, loaded)
    return _Generation(dialect, config, record, stream=stream, limit=limit)


async def _native(request: Request, *, chat: bool) -> ASGIApp:
    """`POST /api/generate` (§2) and `POST /api/chat` (§3)."""
    _, config, record = _context(request)
    struct = "api.ChatRequest" if chat else "api.GenerateRequest"
    error = await _read_json(request, record, struct, "missing request body")
    if error is not None:
        return _json(400, {"error": error})
    body: dict[str, Any] = record.body
    model = body.get("model", "")
    if chat and not model:  # /api/generate answers 404 `model '' not found` instead (§4.2)
        return _json(400, {"error": "model is required"})
    options = body.get("options")
    limit = options.get("num_predict") if isinstance(options, dict) else None
    dialect = _NativeDialect(model, chat=chat, context=body.get("raw") is not True)
    loaded = None
    if not body.get("messages" if chat else "prompt"):
        unload = body.get("keep_alive") in (0, "0", "0s")
        loaded = dialect.loaded("unload" if unload else "load")
    return _answer(
        dialect,
        config,
        record,
        model=model,
        stream=body.get("stream") is not False,
        limit=limit if isinstance(limit, int) else None,
        loaded=loaded,
    )


async def _generate(request: Request) -> ASGIApp:
    return await _native(request, chat=False)


async def _chat(request: Request) -> ASGIApp:
    return await _native(request, chat=True)


async def _openai(request: Request, *, chat: bool) -> ASGIApp:
    """`POST /v1/chat/completions` (§7.1) and `POST /v1/completions` (§7.2)."""
    state, config, record = _context(request)
    struct = "openai.ChatCompletionRequest" if chat else "openai.CompletionRequest"
    # gin's ShouldBindJSON reports an empty body as io.EOF's text; only /api/* rewords it.
    error = await _read_json(request, record, struct, "EOF")
    parsed = parse_request(record.body, chat=chat) if error is None else (400, error)
    if isinstance(parsed, tuple):
        return _json(parsed[0], error_object(*parsed))
    if chat and not parsed.model:
        return _json(400, error_object(400, "model is required"))
    kind = ChatCompletionDialect if chat else CompletionDialect
    number, created = state.next_id(), int(time.time())
    dialect = kind(parsed, number=number, created=created, omit_usage=config.omit_usage)
    return _answer(
        dialect, config, record, model=parsed.model, stream=parsed.stream, limit=parsed.max_tokens
    )


async def _chat_completions(request: Request) -> ASGIApp:
    return await _openai(request, chat=True)


async def _completions(request: Request) -> ASGIApp:
    return await _openai(request, chat=False)


def _details(name: str) -> dict[str, Any]:
    base, _, tag = name.partition(":")
    family = base.rsplit("/", 1)[-1].rstrip("0123456789.") or "llama"
    size = tag.upper() if tag[:1].isdigit() and tag.endswith("b") else "3.2B"
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": size,
        "quantization_level": "Q4_K_M",
    }


def _listing(name: str) -> dict[str, Any]:
    digest = hashlib.sha256(name.encode()).hexdigest()
    size = 2_000_000_000 + int(digest[:7], 16)
    return {"name": name, "model": name, "size": size, "digest": digest, "details": _details(name)}


async def _root(request: Request) -> ASGIApp:  # noqa: ARG001
    return PlainTextResponse("Ollama is running")


async def _version(request: Request) -> ASGIApp:
    return _json(200, {"version": _context(request)[1].version})


async def _tags(request: Request) -> ASGIApp:
    state, config, _ = _context(request)
    modified = _local_time(state.booted_at)
    return _json(200, {"models": [{**_listing(m), "modified_at": modified} for m in config.models]})


async def _ps(request: Request) -> ASGIApp:
    _, config, _ = _context(request)
    expires = _local_time(time.time() + 300)  # the default keep_alive, 5m
    models = [
        {**entry, "expires_at": expires, "size_vram": entry["size"], "context_length": 4096}
        for entry in map(_listing, config.models)
    ]
    return _json(200, {"models": models})


async def _models(request: Request) -> ASGIApp:
    state, config, _ = _context(request)
    return _json(200, model_list(config.models, int(state.booted_at)))


async def _not_found(request: Request, exc: Exception) -> Response:  # noqa: ARG001
    return PlainTextResponse("404 page not found", status_code=404)


async def _not_allowed(request: Request, exc: Exception) -> Response:  # noqa: ARG001
    return PlainTextResponse("405 method not allowed", status_code=405)


# --- front door: recording and the loopback gates (§6.8) -----------------------------------------

_ORIGIN_SCHEMES = frozenset({"app", "file", "tauri", "vscode-webview", "vscode-file"})


def _host_allowed(host: str, hostname: str) -> bool:
    """Ollama's `allowedHostsMiddleware` for a server bound to loopback."""
    name = host[1 : host.find("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        name = name.lower()
        local_tld = name.endswith((".localhost", ".local", ".internal"))
        return local_tld or name in ("", "localhost", hostname)
    return address.is_loopback or address.is_private or address.is_unspecified


def _origin_allowed(origin: str, host: str) -> bool:
    """gin-contrib/cors with Ollama's default origins and an empty `OLLAMA_ORIGINS`."""
    if origin in (f"http://{host}", f"https://{host}"):
        return True  # same-origin requests are not CORS requests
    scheme, _, rest = origin.partition("://")
    if scheme in _ORIGIN_SCHEMES:
        return True
    name, _, port = rest.partition(":")
    local = name in ("localhost", "127.0.0.1", "0.0.0.0")  # noqa: S104 - a name, not a bind
    return scheme in ("http", "https") and local and (not port or port.isdigit())


class _FrontDoor:
    """Pure ASGI middleware: records every request, then applies the Origin and Host gates."""

    def __init__(self, app: ASGIApp, state: EmulatorState) -> None:
        self._app = app
        self._state = state
        self._hostname = socket.gethostname().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        record = ReceivedRequest(method=scope["method"], path=scope["path"], headers=headers)
        self._state.add(record)

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status, record.first_byte_at = message["status"], time.monotonic()
            await send(message)

        app = self._gate(scope["method"], headers) or self._app
        try:
            await app({**scope, _RECORD_KEY: record}, receive, observed_send)
        except BaseException:
            record.finish("fault")
            raise
        record.finish("completed")

    def _gate(self, method: str, headers: dict[str, str]) -> ASGIApp | None:
        """Return the gate's answer, or None to let the request through (CORS runs first)."""
        config, origin, host = self._state.config, headers.get("origin"), headers.get("host", "")
        if origin and config.origin_gate and not _origin_allowed(origin, host):
            return Response(status_code=403)
        if origin and method == "OPTIONS":
            return Response(status_code=204)  # a CORS preflight
        if config.host_gate and not _host_allowed(host, self._hostname):
            return Response(status_code=403)
        return None


def create_emulator_app(config: EmulatorConfig | None = None) -> Starlette:
    """Build the emulator app; `app.state.emulator` is its `EmulatorState`.

    Args:
        config: The knobs; tests may keep a reference and change it between requests.

    Returns:
        A Starlette app serving the endpoints of reference §2, §3, §6.1-6.4 and §7.
    """
    state = EmulatorState(config or EmulatorConfig())
    get, post = ["GET"], ["POST"]  # Starlette adds HEAD to every GET route, as Ollama has
    routes = [
        Route("/", _Endpoint(_root), methods=get),
        Route("/api/version", _Endpoint(_version), methods=get),
        Route("/api/tags", _Endpoint(_tags), methods=get),
        Route("/api/ps", _Endpoint(_ps), methods=get),
        Route("/api/generate", _Endpoint(_generate), methods=post),
        Route("/api/chat", _Endpoint(_chat), methods=post),
        Route("/v1/models", _Endpoint(_models), methods=get),
        Route("/v1/chat/completions", _Endpoint(_chat_completions), methods=post),
        Route("/v1/completions", _Endpoint(_completions), methods=post),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_FrontDoor, state=state)],
        exception_handlers={404: _not_found, 405: _not_allowed},
    )
    app.state.emulator = state
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Run the emulator under uvicorn until interrupted.

    Args:
        argv: Command-line arguments without the program name; `sys.argv[1:]` when None.

    Returns:
        The process exit status.
    """
    defaults = EmulatorConfig()
    parser = argparse.ArgumentParser(
        prog="python -m gateway.testing.emulator", description="Run the Ollama emulator."
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    parser.add_argument("--port", type=int, default=11434, help="port (default: %(default)s)")
    parser.add_argument("--models", default=",".join(defaults.models), help="comma-separated")
    parser.add_argument("--ttft", type=float, default=defaults.ttft, help="seconds to first chunk")
    parser.add_argument("--inter-token", type=float, default=defaults.inter_token)
    parser.add_argument("--tokens", type=int, default=defaults.tokens)
    parser.add_argument("--thinking-tokens", type=int, default=defaults.thinking_tokens)
    parser.add_argument("--fault", choices=sorted(FAULTS), default=None)
    parser.add_argument("--fault-after", type=int, default=defaults.fault_after)
    parser.add_argument("--http", choices=["h11", "httptools"], default="httptools")
    levels = ["debug", "info", "warning", "error"]
    parser.add_argument("--log-level", default="info", choices=levels)
    args = parser.parse_args(argv)
    try:  # Ollama only gates Host while it listens on a loopback address (§6.8)
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    config = EmulatorConfig(
        models=[name for name in args.models.split(",") if name],
        ttft=args.ttft,
        inter_token=args.inter_token,
        tokens=args.tokens,
        thinking_tokens=args.thinking_tokens,
        fault=args.fault,
        fault_after=args.fault_after,
        host_gate=loopback,
    )
    uvicorn.run(
        create_emulator_app(config),
        host=args.host,
        port=args.port,
        http=args.http,
        ws="none",
        log_level=args.log_level,
        server_header=False,  # Ollama (Go net/http) sends no Server header
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
