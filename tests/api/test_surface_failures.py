"""The field-failure classes on every client surface, in front of both upstream dialects.

The tests of F-04, F-06, F-07 and F-13 were written for `/v1/generate` and `/v1/chat`; here the
same classes run on Ollama's `/api/chat` and `/api/generate`, OpenAI's `/v1/chat/completions`
and `/v1/completions` (and the embedding routes where a class applies), each in front of an
Ollama upstream (NDJSON) and an OpenAI-compatible one (SSE), over real loopback sockets:

* framing and UTF-8 cut at every byte position: the client gets exactly the text, valid UTF-8,
  framed in its own surface (NDJSON lines; `data:` events ending in `data: [DONE]`);
* errors before the first byte get a real status in the client's error shape (and the
  upstream's `Retry-After`); errors after it get status 200 and one final error chunk;
* a client leaving at any phase (queued for a slot, before the first byte, while a
  `stream:false` answer is gathered, mid-stream) frees the upstream request, the in-flight
  count and the slot;
* a failure before the first byte is retried, one after it is not;
* a non-streamed answer that fails midway gets a real 5xx, not a 200.

The upstream is the emulator (its faults and records), or a stand-in for what the emulator
cannot do (answers cut at every byte, `Retry-After`, headers and then silence, broken
embeddings). The gateways run on the client protocol `gateway serve` uses. Every wait is for
an event (a record, a polled gauge) with a generous deadline; nothing asserts how long
something took.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from resource import RLIM_INFINITY
from typing import Any, Literal

import anyio
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from gateway.app import create_app
from gateway.serve.coalesce import CoalescingHttpToolsProtocol
from gateway.serve.server import door_limits
from gateway.settings import Settings
from gateway.testing.server import LoopbackServer
from tests.support.client import MODEL
from tests.support.lookalikes import OllamaLookalike, OpenAILookalike, sse
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway, store_key

# Every failure class on every surface and both dialects: a third of the fast tier's time.
pytestmark = pytest.mark.slow

DIALECTS = ["ollama", "openai"]

#: Seconds any awaited event may take before the test fails: generous, for a loaded machine.
DEADLINE = 15.0

#: Tokens whose UTF-8 takes 1 to 4 bytes a character (and several code points a glyph), with
#: newlines and a `data: [DONE]` look-alike inside the text: none of it may break the framing.
TOKENS = ["Grüße", ", 世界", " 🎉", " naïve ﬁn", " 👍🏽", "\n\n", " data: [DONE]", "!"]
#: The upstream's own error text in the `error` endings.
UPSTREAM_ERROR = "the runner crashed: café ☕"
#: What the emulator generates before a mid-stream fault (`fault_after` = 5).
EMULATED_PREFIX = "".join(f"tok{i} " for i in range(5))


# --- the client surfaces ---------------------------------------------------------------------


@dataclass(frozen=True)
class Surface:
    """One client route: its path, its wire format and its body."""

    path: str
    openai: bool
    chat: bool

    def body(self, *, stream: bool) -> dict[str, Any]:
        asked: dict[str, Any] = (
            {"messages": [{"role": "user", "content": "hi"}]} if self.chat else {"prompt": "hi"}
        )
        return {"model": MODEL, **asked, "stream": stream}

    def text(self, frame: dict[str, Any]) -> str:
        """The generated text one frame of a stream carries."""
        if not self.openai:
            return str(frame["message"]["content"] if self.chat else frame["response"])
        choice = frame["choices"][0] if frame.get("choices") else {}
        if self.chat:
            return str(choice.get("delta", {}).get("content") or "")
        return str(choice.get("text") or "")


SURFACES = [
    Surface("/api/chat", openai=False, chat=True),
    Surface("/api/generate", openai=False, chat=False),
    Surface("/v1/chat/completions", openai=True, chat=True),
    Surface("/v1/completions", openai=True, chat=False),
]
#: The embedding routes, for the classes that apply to a one-object answer.
EMBEDDINGS = ["/api/embed", "/v1/embeddings"]
ALL_ROUTES: list[Surface | str] = [*SURFACES, *EMBEDDINGS]


def _ids(surface: Surface | str) -> str:
    return surface if isinstance(surface, str) else surface.path


routes = pytest.mark.parametrize("surface", SURFACES, ids=_ids)
all_routes = pytest.mark.parametrize("surface", ALL_ROUTES, ids=_ids)
dialects = pytest.mark.parametrize("dialect", DIALECTS)


def _openai(surface: Surface | str) -> bool:
    return surface.openai if isinstance(surface, Surface) else surface.startswith("/v1/")


def _path(surface: Surface | str) -> str:
    return surface.path if isinstance(surface, Surface) else surface


def _body(surface: Surface | str, *, stream: bool = True) -> dict[str, Any]:
    if isinstance(surface, Surface):
        return surface.body(stream=stream)
    return {"model": MODEL, "input": "hi"}


def _post(gw: Gateway, surface: Surface | str, *, stream: bool = True) -> httpx.Response:
    with httpx.Client(timeout=DEADLINE * 2) as client:
        return client.post(
            f"{gw.url}{_path(surface)}", json=_body(surface, stream=stream), headers=gw.headers()
        )


def frames(surface: Surface, response: httpx.Response) -> list[dict[str, Any] | str]:
    """Check a streamed answer's framing in the client's surface; return its parsed frames.

    NDJSON: status 200, `application/x-ndjson`, one JSON object a line, each line ended.
    SSE: status 200, `text/event-stream`, `data: <one line>` events, each ended by a blank
    line; `[DONE]` comes back as the string. Either way the body is valid UTF-8.
    """
    assert response.status_code == 200, response.text
    raw = response.content
    assert "\ufffd" not in raw.decode("utf-8")  # strict: raises on invalid UTF-8
    content_type = response.headers["content-type"]
    parsed: list[dict[str, Any] | str] = []
    if not surface.openai:
        assert content_type == "application/x-ndjson"
        assert raw.endswith(b"\n"), raw[-200:]
        for line in raw[:-1].split(b"\n"):
            frame = json.loads(line)
            assert isinstance(frame, dict), line
            parsed.append(frame)
        return parsed
    assert content_type.startswith("text/event-stream")
    events = raw.split(b"\n\n")
    assert events[-1] == b"", raw[-200:]  # every event ends with its blank line
    for event in events[:-1]:
        assert event.startswith(b"data: "), event
        data = event.removeprefix(b"data: ")
        assert b"\n" not in data, event
        assert b"\r" not in data, event
        if data == b"[DONE]":
            parsed.append("[DONE]")
            continue
        frame = json.loads(data)
        assert isinstance(frame, dict), event
        parsed.append(frame)
    return parsed


def assert_complete(surface: Surface, response: httpx.Response, tokens: list[str]) -> None:
    """A whole stream: one frame per token with exactly its text, then the surface's end."""
    parsed = frames(surface, response)
    if surface.openai:
        assert parsed[-1] == "[DONE]"
        body = parsed[:-1]
        assert "[DONE]" not in body
        assert all(isinstance(f, dict) and "error" not in f for f in body), body
        reasons = [f["choices"][0]["finish_reason"] for f in body if isinstance(f, dict)]
        assert reasons[-1] == "stop"
    else:
        *body, final = parsed
        assert isinstance(final, dict)
        assert final["done"] is True
        assert all(isinstance(f, dict) and f["done"] is False for f in body), body
    texts = [surface.text(f) for f in body if isinstance(f, dict)]
    assert [t for t in texts if t] == tokens


def assert_cut(surface: Surface, response: httpx.Response, before: str) -> str:
    """A stream cut after its first byte: the text so far, then one final error chunk.

    Returns:
        The error chunk's message.
    """
    parsed = frames(surface, response)
    *body, last = parsed
    assert isinstance(last, dict)
    assert "".join(surface.text(f) for f in body if isinstance(f, dict)) == before
    assert all(isinstance(f, dict) and "error" not in f for f in body), body
    assert set(last) == {"error"}, last
    if surface.openai:
        assert "[DONE]" not in parsed
        error = last["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        message = error["message"]
    else:
        assert not any(isinstance(f, dict) and f.get("done") for f in parsed)
        message = last["error"]
    assert isinstance(message, str)
    assert message
    return message


def answer_text(surface: Surface, response: httpx.Response) -> str:
    """The text of a non-streamed answer: one JSON object of the surface, valid UTF-8."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert "\ufffd" not in response.content.decode("utf-8")
    body = response.json()
    if not surface.openai:
        assert body["done"] is True
        return str(body["message"]["content"] if surface.chat else body["response"])
    [choice] = body["choices"]
    assert choice["finish_reason"] == "stop"
    return str(choice["message"]["content"] if surface.chat else choice["text"])


def assert_error(surface: Surface | str, response: httpx.Response, status: int) -> str:
    """A real status with the client's error body; returns the message.

    `{"error": "..."}` on Ollama's surface; `{"error": {"message", "type", "param", "code"}}`
    on OpenAI's.
    """
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    if _openai(surface):
        error = body["error"]
        assert isinstance(error, dict), body
        assert set(error) == {"message", "type", "param", "code"}, error
        message = error["message"]
    else:
        message = body["error"]
    assert isinstance(message, str), body
    assert message
    return message


# --- waiting on events -----------------------------------------------------------------------


def eventually(check: Callable[[], bool], what: str) -> None:
    """Poll `check` until it holds; fail after `DEADLINE` seconds."""
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"not within {DEADLINE} s: {what}"
        time.sleep(0.02)


def gauge(gw: Gateway, name: str, **labels: str) -> float:
    return metric_value(gw.metrics_text(), name, **labels)


def generations(emulator: Emulator) -> list[Any]:
    """The generation requests the emulator received (not model lists or probes)."""
    paths = ("/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions")
    return [r for r in emulator.state.records if r.path in paths]


def one_generation(emulator: Emulator) -> Any:
    eventually(lambda: len(generations(emulator)) >= 1, "the request reached the upstream")
    [record] = generations(emulator)
    return record


# --- an upstream stand-in that writes what a test scripts -------------------------------------


#: Seconds between two pieces of a cut answer: the gateway reads each piece on its own.
PAUSE = 0.001


class Pieces(Response):
    """A 200 answer written in pieces of `size` bytes (all of it in one write when None)."""

    def __init__(self, body: bytes, media_type: str, size: int | None) -> None:
        self.body, self.content_type, self.size = body, media_type, size
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", self.content_type.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        step = self.size or len(self.body)
        for start in range(0, len(self.body), step):
            piece = self.body[start : start + step]
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            if self.size:
                await anyio.sleep(PAUSE)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Dropped(Response):
    """A 200 answer whose connection is dropped after `body` (uvicorn closes it mid-body)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": True})


class Silent(Response):
    """No answer, or a status line and headers only (`media_type`) and then nothing, as an
    OpenAI-compatible server that sends its headers at once; `gone` is set when the gateway
    closes the connection."""

    def __init__(self, gone: threading.Event, media_type: str | None = None) -> None:
        self.gone, self.media_type = gone, media_type
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.media_type is not None:
            headers = [(b"content-type", self.media_type.encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone.set()


def _json(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _native_stream(path: str, tokens: list[str], ending: str, newline: str) -> bytes:
    """Ollama's NDJSON for `tokens`, ended by `done: true`, the upstream's error line or EOF.

    Only the fields the gateway reads: each byte costs the byte-by-byte tests a write.
    """
    chat = path == "/api/chat"

    def text(token: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": token}} if chat else {"response": token}

    lines = [{**text(token), "done": False} for token in tokens]
    final = {"done": True, "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 8}
    if ending == "error":
        lines.append({"error": UPSTREAM_ERROR})
    elif ending == "done":
        lines.append({**text(""), **final})
    return "".join(_json(line) + newline for line in lines).encode()


def _openai_stream(path: str, tokens: list[str], ending: str, newline: str) -> bytes:
    """An OpenAI-compatible SSE answer (vLLM's, with only the fields the gateway reads),
    ended by `[DONE]`, an error event or EOF."""
    chat = path == "/v1/chat/completions"

    def choice(token: str | None, reason: str | None = None, **delta: str) -> dict[str, Any]:
        if chat:
            content = {} if token is None else {"content": token}
            body: dict[str, Any] = {"delta": {**delta, **content}}
        else:
            body = {"text": token or ""}
        return {"choices": [{"index": 0, **body, "finish_reason": reason}]}

    events: list[dict[str, Any] | str] = [choice("", role="assistant")] if chat else []
    events += [choice(token) for token in tokens]
    if ending == "error":  # vLLM sends `[DONE]` after its error event; nothing may follow it
        error = {"message": UPSTREAM_ERROR, "type": "InternalServerError", "param": None}
        events += [{"error": {**error, "code": 500}}, "[DONE]"]
    elif ending == "done":
        usage = {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}
        events += [choice(None, "stop"), {"choices": [], "usage": usage}, "[DONE]"]
    text = ": ping\n\n" + sse(*events)  # a comment first, which clients ignore
    return text.replace("\n", newline).encode()  # JSON holds no raw newline


class Script:
    """What the stand-in answers, set by a test; the same for both faces.

    Attributes:
        tokens: The generated text, one token a line or event.
        ending: `done` (a clean end), `error` (the upstream's own error after the tokens) or
            `eof` (the body just ends: no final line, no `[DONE]`).
        piece: Bytes per write of a generation's answer; None: all of it in one write.
        newline: What ends each line of that answer.
        failures: (status, message, headers) answered first, one per request, in order.
        hang: `silent` (answer nothing) or `headers` (send the headers, then nothing); `hung`
            gets one event per such request, set when the gateway closes the connection.
        embedding: `ok`, `dropped` (the connection closes mid-body) or `malformed`.
        calls: The paths of the generation and embedding requests received.
    """

    def __init__(self) -> None:
        self.tokens = list(TOKENS)
        self.ending: Literal["done", "error", "eof"] = "done"
        self.piece: int | None = None
        self.newline = "\n"
        self.failures: list[tuple[int, str, dict[str, str]]] = []
        self.hang: Literal["", "silent", "headers"] = ""
        self.hung: list[threading.Event] = []
        self.embedding: Literal["ok", "dropped", "malformed"] = "ok"
        self.calls: list[str] = []

    async def answer(self, request: Request, *, openai: bool) -> Response:
        await request.body()
        path = request.url.path
        self.calls.append(path)
        if self.failures:
            status, message, headers = self.failures.pop(0)
            error: Any = {"message": message, "type": "server_error", "param": None, "code": None}
            return JSONResponse({"error": error if openai else message}, status, headers=headers)
        embedding = path in ("/api/embed", "/v1/embeddings")
        media_type = "text/event-stream" if openai else "application/x-ndjson"
        if self.hang:
            gone = threading.Event()
            self.hung.append(gone)
            shown = "application/json" if embedding else media_type
            return Silent(gone, shown if self.hang == "headers" else None)
        if embedding:
            return self._embedding(openai)
        stream = _openai_stream if openai else _native_stream
        body = stream(path, self.tokens, self.ending, self.newline)
        return Pieces(body, media_type, self.piece)

    def _embedding(self, openai: bool) -> Response:
        vector = [0.25, -0.5, 0.75]
        if openai:
            data = [{"object": "embedding", "index": 0, "embedding": vector}]
            body: dict[str, Any] = {"object": "list", "data": data, "model": MODEL}
        else:
            body = {"model": MODEL, "embeddings": [vector], "prompt_eval_count": 1}
        raw = _json(body).encode()
        if self.embedding == "dropped":
            return Dropped(raw[: len(raw) // 2])
        if self.embedding == "malformed":
            return Response(raw[: len(raw) // 2], media_type="application/json")
        return Response(raw, media_type="application/json")


class NativeStandIn(OllamaLookalike):
    """The script behind Ollama's native API."""

    def __init__(self, script: Script) -> None:
        super().__init__(generate_paths=("/api/generate", "/api/chat", "/api/embed"))
        self.script = script

    async def generate(self, request: Request) -> Response:
        return await self.script.answer(request, openai=False)


class OpenAIStandIn(OpenAILookalike):
    """The script behind an OpenAI-compatible API."""

    def __init__(self, script: Script) -> None:
        paths = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
        super().__init__(complete_paths=paths)
        self.script = script

    async def complete(self, request: Request) -> Response:
        return await self.script.answer(request, openai=True)


@dataclass
class StandIn:
    script: Script
    url: str


@pytest.fixture
def stand_in(dialect: str) -> Iterator[StandIn]:
    """The scripted upstream speaking `dialect`, on a loopback port."""
    script = Script()
    upstream = NativeStandIn(script) if dialect == "ollama" else OpenAIStandIn(script)
    with LoopbackServer(upstream.app) as server:
        yield StandIn(script, server.url)


@pytest.fixture
def front(tmp_path: Path, dialect: str) -> Iterator[Callable[..., Gateway]]:
    """Start gateways in front of an upstream URL, speaking `dialect`; keywords are settings.

    Each runs on the client protocol `gateway serve` runs (`gateway.serve.door`,
    `gateway.serve.coalesce`),
    so disconnects and writes go through what production uses; conftest's `make_gateway` runs
    uvicorn's plain one, and an emulator even in front of another upstream.
    """
    servers: list[LoopbackServer] = []

    def make(upstream_url: str, **overrides: Any) -> Gateway:
        database_url = f"sqlite+aiosqlite:///{tmp_path}/keys-{len(servers)}.db"
        values: dict[str, Any] = {
            "upstream_url": upstream_url,
            "upstream_dialect": dialect,
            "database_url": database_url,
            "first_byte_timeout": 10.0,
            "idle_timeout": 10.0,
            **overrides,
        }
        settings = Settings(**values)
        key_id, key = asyncio.run(store_key(database_url, "test-key"))
        protocol = CoalescingHttpToolsProtocol.with_limits(door_limits(settings, RLIM_INFINITY))
        server = LoopbackServer(create_app(settings), http=protocol)
        server.start()
        servers.append(server)
        return Gateway(server.url, key, key_id, settings, database_url)

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def scripted(
    stand_in: StandIn, front: Callable[..., Gateway]
) -> Callable[..., tuple[Script, Gateway]]:
    """A gateway in front of the stand-in; a test may pass more settings."""

    def make(**settings: Any) -> tuple[Script, Gateway]:
        return stand_in.script, front(stand_in.url, **settings)

    return make


# --- framing and UTF-8 cut at every byte position --------------------------------------------


@routes
@dialects
@pytest.mark.parametrize(
    ("piece", "ending", "stream"),
    [
        (1, "done", True),
        (1, "error", True),
        (None, "done", True),
        (None, "error", True),
        (1, "done", False),
    ],
    ids=["every-byte-done", "every-byte-error", "one-write-done", "one-write-error", "unstreamed"],
)
def test_lines_and_events_cut_anywhere_reach_the_client_whole_and_framed(
    scripted, surface, piece, ending, stream
):
    """Each byte of the upstream's answer in a write of its own (so every line or event is
    cut at every position, inside multi-byte characters too), or the whole answer in one; a
    `stream:false` answer is gathered from the cut stream into one object."""
    script, gw = scripted()
    script.piece, script.ending = piece, ending
    response = _post(gw, surface, stream=stream)
    if not stream:
        assert answer_text(surface, response) == "".join(TOKENS)
    elif ending == "done":
        assert_complete(surface, response, TOKENS)
    else:
        assert assert_cut(surface, response, "".join(TOKENS)) == UPSTREAM_ERROR
    assert len(script.calls) == 1


@routes
@pytest.mark.parametrize("dialect", ["openai"])
def test_sse_events_with_crlf_line_ends_cut_anywhere_reach_the_client_whole(scripted, surface):
    """sse-starlette (llama-cpp-python's server) ends its lines with CRLF: `\r` and `\n` can
    arrive in different reads."""
    script, gw = scripted()
    script.piece, script.newline = 1, "\r\n"
    assert_complete(surface, _post(gw, surface), TOKENS)


# --- errors before the first byte ------------------------------------------------------------

#: (upstream status, its headers) -> (client status, Retry-After, upstream tries).
STATUSES: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[int, str | None, int]] = {
    (500, ()): (502, None, 2),  # one more try (no other upstream), then the gateway's 502
    (503, ()): (503, "1", 3),  # Ollama's "server busy": retried, then a Retry-After of its own
    (503, (("Retry-After", "5"),)): (503, "5", 1),  # not sooner than asked: no retry
    (404, ()): (404, None, 1),  # the client's error, passed on
    (429, (("Retry-After", "7"),)): (429, "7", 1),
}


@all_routes
@dialects
def test_an_upstream_error_status_is_a_real_status_in_the_clients_shape(scripted, surface):
    """Each status in `STATUSES`, one request each through the same gateway (the circuit
    cannot open: one key's 500s, busy answers and 4xx are not the upstream's fault alone)."""
    script, gw = scripted(retry_backoff=0.01)
    for (status, headers), (expected, retry_after, tries) in STATUSES.items():
        case = f"upstream {status} {dict(headers)}"
        message = f"upstream says {status}: ünïcode"
        script.calls.clear()
        script.failures = [(status, message, dict(headers))] * 3
        response = _post(gw, surface)
        text = assert_error(surface, response, expected)
        if status < 500:
            assert text == message, case
        assert response.headers.get("retry-after") == retry_after, case
        assert len(script.calls) == tries, case


@routes
@dialects
@pytest.mark.parametrize("ending", ["error", "eof"])
def test_an_answer_that_fails_before_its_first_token_is_a_real_status(scripted, surface, ending):
    """Status 200 from upstream, then its error line (Ollama before v0.12.6 sends errors so)
    or the end of the body, before any token: nothing was sent yet, so a real status."""
    script, gw = scripted(retry_backoff=0.01)
    script.tokens, script.ending = [], ending
    message = assert_error(surface, _post(gw, surface), 502)
    if ending == "error":
        assert message == UPSTREAM_ERROR
    assert gauge(gw, "gateway_requests_total", route=surface.path, status_class="5xx") == 1


@all_routes
@dialects
def test_a_refused_connection_is_retried_then_a_502_in_the_clients_shape(front, surface):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    gw = front(closed, retry_backoff=0.01)
    response = _post(gw, surface)
    assert assert_error(surface, response, 502) == "upstream is unreachable"
    assert gauge(gw, "gateway_upstream_retries_total", reason="connect") == 2


@all_routes
@dialects
@pytest.mark.parametrize("hang", ["silent", "headers"])
def test_a_silent_upstream_is_a_504_in_the_clients_shape_and_its_request_is_closed(
    scripted, surface, hang
):
    """F-07 on every route; also when the upstream sent its headers at once (vLLM does) and
    then nothing: the first-byte deadline runs to the first chunk, not to the headers."""
    script, gw = scripted(first_byte_timeout=0.5)
    script.hang = hang
    response = _post(gw, surface)
    assert "0.5 s" in assert_error(surface, response, 504)
    # On a loaded machine the upstream's handler may run only after the deadline fired: the
    # request reaches it late, but it reaches it, once (a timeout is not retried: the
    # upstream may still be working), and it is closed.
    eventually(lambda: len(script.hung) >= 1, "the request reached the upstream")
    assert script.hung[0].wait(DEADLINE)
    assert len(script.hung) == 1


# --- errors after the first byte -------------------------------------------------------------

#: Emulator faults after `fault_after` tokens, and the outcome each is counted with.
MIDSTREAM = {
    "error_midstream": "upstream_error",
    "drop_midstream": "upstream_error",
    "eof_without_done": "upstream_error",
    "malformed": "upstream_error",
    "hang_midstream": "timeout",  # the idle timeout ends it
}
#: The idle timeout for each fault: short only where it is meant to run out (a short one
#: elsewhere could run out between two tokens on a loaded machine).
IDLE = dict.fromkeys(MIDSTREAM, 10.0) | {"hang_midstream": 0.5}


@routes
@dialects
@pytest.mark.parametrize("fault", list(MIDSTREAM))
def test_a_failure_after_the_first_byte_is_200_then_one_error_chunk_and_no_replay(
    front, emulator, surface, dialect, fault
):
    """F-04 and F-06 (a) on every route: retries are on (3 attempts), yet the emulator sees
    exactly one request."""
    gw = front(emulator.url, idle_timeout=IDLE[fault], retry_backoff=0.01)
    emulator.config.fault = fault
    response = _post(gw, surface)
    message = assert_cut(surface, response, EMULATED_PREFIX)
    if fault == "error_midstream" and dialect == "ollama":
        assert message == emulator.config.fault_message  # the upstream's own error line
    if fault == "hang_midstream":
        assert "0.5 s" in message
    record = one_generation(emulator)  # never replayed
    assert record.wait_ended(DEADLINE)
    if fault == "hang_midstream":
        assert record.outcome == "client_disconnect"  # the gateway closed the silent upstream
    metrics = gw.metrics_text()
    counted = metric_value(metrics, "gateway_requests_total", route=surface.path)
    assert counted == metric_value(metrics, "gateway_requests_total", outcome=MIDSTREAM[fault])
    assert counted == 1
    assert metric_value(metrics, "gateway_output_tokens_total") == 5  # what was relayed
    assert metric_value(metrics, "gateway_upstream_retries_total") == 0


# --- stream:false and OpenAI's non-streamed answers ------------------------------------------


@routes
@dialects
@pytest.mark.parametrize(
    ("fault", "status"),
    [
        ("error_midstream", 502),
        ("drop_midstream", 502),
        ("eof_without_done", 502),
        ("hang_midstream", 504),
    ],
)
def test_a_non_streamed_answer_that_fails_midway_is_a_real_5xx_not_a_200(
    front, emulator, surface, fault, status
):
    gw = front(emulator.url, idle_timeout=IDLE[fault], retry_backoff=0.01)
    emulator.config.fault = fault
    response = _post(gw, surface, stream=False)
    assert_error(surface, response, status)
    assert "tok" not in response.text  # the partial answer is dropped, as Ollama does
    record = one_generation(emulator)
    assert record.wait_ended(DEADLINE)


@pytest.mark.parametrize("surface", EMBEDDINGS)
@dialects
@pytest.mark.parametrize("embedding", ["dropped", "malformed"])
def test_an_embedding_answer_that_breaks_midway_is_a_502_in_the_clients_shape(
    scripted, surface, embedding
):
    script, gw = scripted(retry_attempts=1)
    script.embedding = embedding
    assert_error(surface, _post(gw, surface), 502)
    assert len(script.calls) == 1


# --- retries: before the first byte only -----------------------------------------------------


@routes
@dialects
def test_a_failure_before_the_first_byte_is_retried_into_one_clean_stream(scripted, surface):
    """F-06 (b) on every route; (a), no replay after the first byte, is tested above."""
    script, gw = scripted(retry_backoff=0.01)
    script.failures = [(502, "bad gateway", {})]
    assert_complete(surface, _post(gw, surface), TOKENS)
    assert script.calls == [script.calls[0]] * 2  # the same request, twice
    assert gauge(gw, "gateway_upstream_retries_total", reason="status") == 1


# --- the client leaving, at every phase ------------------------------------------------------


class RawClient:
    """One request written on a raw socket, so that the test decides when the client leaves."""

    def __init__(self, gw: Gateway, path: str, body: dict[str, Any]) -> None:
        host, port = gw.url.removeprefix("http://").split(":")
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {gw.key}\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self._sock = socket.create_connection((host, int(port)), timeout=DEADLINE)
        self._sock.sendall(head.encode() + payload)
        self.received = b""

    def read_until(self, marker: bytes, start: int = 0) -> int:
        """Read until `marker` arrives at or after `start`; return where it ends."""
        while (found := self.received.find(marker, start)) < 0:
            data = self._sock.recv(65536)
            assert data, f"closed before {marker!r}: {self.received!r}"
            self.received += data
        return found + len(marker)

    def first_frame(self, openai: bool) -> None:
        """Read the status line, the headers and the first whole line or event of the body."""
        head_end = self.read_until(b"\r\n\r\n")
        assert self.received.startswith(b"HTTP/1.1 200 "), self.received
        self.read_until(b"}\n\n" if openai else b"}\n", head_end)

    def leave(self) -> None:
        self._sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.leave()


def _freed(gw: Gateway, route: str, disconnects: int = 1) -> None:
    """In flight back to 0, the slot and the connection given back, the leaving counted."""
    eventually(lambda: gauge(gw, "gateway_requests_in_flight") == 0, "in flight back to 0")
    eventually(
        lambda: gauge(gw, "gateway_upstream_connections_in_use") == 0, "connection given back"
    )
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_upstream_slots_in_use") == 0
    assert metric_value(metrics, "gateway_upstream_in_flight") == 0
    left = metric_value(metrics, "gateway_requests_total", route=route, outcome="client_disconnect")
    assert left == disconnects


#: Settings of the disconnect tests: one slot, so a leaked one makes the next request a 503.
ONE_SLOT = {"upstream_max_concurrent": 1, "upstream_queue_timeout": 3}


@routes
@dialects
@pytest.mark.parametrize(
    ("phase", "stream"),
    [
        ("before_first_byte", True),
        ("before_first_byte", False),
        ("gathering", False),  # a stream:false answer being gathered from upstream tokens
        ("mid_stream", True),
    ],
)
def test_a_client_leaving_frees_the_upstream_request_and_its_slot(
    front, emulator, surface, phase, stream
):
    """F-13 (a), (b), (c) on every route: the upstream's record ends `client_disconnect`."""
    gw = front(emulator.url, **ONE_SLOT)
    if phase == "before_first_byte":
        emulator.config.fault = "hang_before"
    else:
        emulator.config.tokens, emulator.config.inter_token = 400, 0.05  # a 20 s answer
    with RawClient(gw, surface.path, surface.body(stream=stream)) as client:
        record = one_generation(emulator)
        if phase == "mid_stream":
            client.first_frame(surface.openai)
        elif phase == "gathering":
            eventually(lambda: record.tokens_sent >= 2, "tokens are being gathered")
    assert record.wait_ended(DEADLINE)
    assert record.outcome == "client_disconnect"
    _freed(gw, surface.path)
    emulator.config.fault, emulator.config.tokens = None, 3
    assert _post(gw, surface, stream=False).status_code == 200


@routes
@dialects
def test_a_client_leaving_the_queue_takes_no_slot_and_sends_nothing_upstream(
    front, emulator, surface
):
    gw = front(emulator.url, **ONE_SLOT)
    emulator.config.fault = "hang_before"
    with RawClient(gw, surface.path, surface.body(stream=True)) as holder:
        held = one_generation(emulator)  # holds the one slot
        with RawClient(gw, surface.path, surface.body(stream=True)):
            eventually(lambda: gauge(gw, "gateway_upstream_queue_length") == 1, "queued")
        eventually(lambda: gauge(gw, "gateway_upstream_queue_length") == 0, "left the queue")
        eventually(
            lambda: gauge(gw, "gateway_requests_total", outcome="client_disconnect") == 1,
            "the queued request ended",
        )
        assert gauge(gw, "gateway_requests_in_flight") == 1  # the holder only
        assert generations(emulator) == [held]  # the queued request never went upstream
        holder.leave()
    assert held.wait_ended(DEADLINE)
    assert held.outcome == "client_disconnect"
    _freed(gw, surface.path, disconnects=2)
    emulator.config.fault = None
    assert _post(gw, surface, stream=False).status_code == 200


#: The phases the stand-in plays: an embedding request silent upstream or queued (the emulator
#: plays the others), and any request whose upstream sent its headers at once (as vLLM does)
#: but no token yet.
STAND_IN_PHASES: list[tuple[Surface | str, str]] = [
    *((route, phase) for phase in ("silent", "queued") for route in EMBEDDINGS),
    *((route, "headers") for route in ALL_ROUTES),
]


@pytest.mark.parametrize(
    ("surface", "phase"), STAND_IN_PHASES, ids=[f"{_ids(r)}-{p}" for r, p in STAND_IN_PHASES]
)
@dialects
def test_a_client_leaving_before_any_token_frees_the_upstream_request_and_its_slot(
    scripted, surface, phase
):
    script, gw = scripted(**ONE_SLOT)
    script.hang = "headers" if phase == "headers" else "silent"
    body = _body(surface)
    with RawClient(gw, _path(surface), body) as first:
        eventually(lambda: len(script.hung) == 1, "the request reached the upstream")
        if phase == "queued":
            with RawClient(gw, _path(surface), body):
                eventually(lambda: gauge(gw, "gateway_upstream_queue_length") == 1, "queued")
            eventually(lambda: gauge(gw, "gateway_upstream_queue_length") == 0, "left the queue")
            assert len(script.calls) == 1  # the queued request never went upstream
        first.leave()
    assert script.hung[0].wait(DEADLINE)  # the upstream request was closed
    _freed(gw, _path(surface), disconnects=2 if phase == "queued" else 1)
    script.hang = ""
    assert _post(gw, surface, stream=False).status_code == 200
