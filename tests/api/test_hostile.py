"""Hostile clients and broken upstreams get clear answers, never a 500 or a broken gateway."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.testing.server import LoopbackServer
from tests.support.client import MODEL
from tests.support.lookalikes import OllamaLookalike, OpenAILookalike, ndjson, served, sse
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway


class WeirdUpstream(OllamaLookalike):
    """An Ollama look-alike whose answers a test sets: model lists, final chunks, cookies."""

    def __init__(self) -> None:
        super().__init__(tags={"models": [{"model": MODEL, "modified_at": "2025-01-01T00:00:00Z"}]})
        self.final: dict[str, Any] = {"done": True, "done_reason": "stop", "eval_count": 2}
        self.error: tuple[int, bytes] | None = None
        self.encoding: str | None = None  # a Content-Encoding to claim (the body stays as is)
        self.linger = 0.0  # seconds the body stays open after the final line
        self.tail: bytes | None = None  # sent instead of the final line
        self.headers_seen: list[dict[str, str]] = []

    async def generate(self, request: Request) -> Response:
        self.headers_seen.append(dict(request.headers))
        if self.error is not None:
            status, body = self.error
            return Response(body, status, media_type="application/json")
        body = ndjson(
            {"model": MODEL, "response": "a", "done": False},
            {"model": MODEL, "response": "b", "done": False},
            {"model": MODEL, "response": "", **self.final},
        )
        if self.tail is not None:
            body = body[: body.rindex("{")] + self.tail.decode()
        if self.linger:

            async def lingering() -> AsyncIterator[bytes]:
                yield body.encode()
                await asyncio.sleep(self.linger)

            return StreamingResponse(lingering(), media_type="application/x-ndjson")
        response = PlainTextResponse(body, media_type="application/x-ndjson")
        response.set_cookie("session", f"s{len(self.headers_seen)}")
        if self.encoding:
            response.headers["content-encoding"] = self.encoding
        return response


@pytest.fixture
def weird() -> Iterator[tuple[WeirdUpstream, str]]:
    yield from served(WeirdUpstream())


@pytest.fixture
def weird_gateway(
    weird: tuple[WeirdUpstream, str], make_gateway: Callable[..., Gateway]
) -> tuple[WeirdUpstream, Gateway]:
    upstream, url = weird
    return upstream, make_gateway(upstream_url=url, upstream_poll_interval=0.1)


def _generate(gw: Gateway, **body: Any) -> httpx.Response:
    payload = {"model": MODEL, "prompt": "x", **body}
    return httpx.post(f"{gw.url}/v1/generate", json=payload, headers=gw.headers(), timeout=10)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize(
    ("tags", "ps"),
    [
        (["not", "an", "object"], {"models": []}),
        ({"models": [1, "x", None]}, {"models": [7, {"model": MODEL, "size": "abc"}]}),
        ({"models": "nope"}, ["list"]),
        # Nested past Python's recursion limit: RecursionError, which no `except ValueError`
        # caught (a 500 on /api/tags, a traceback from every poll).
        (b'{"models": ' + b"[" * 5000 + b"]" * 5000 + b"}", b"[" * 5000 + b"]" * 5000),
        (b'{"models": [' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"]}", {"models": []}),
    ],
)
def test_malformed_model_lists_do_not_break_the_gateway(weird_gateway, caplog, tags, ps):
    upstream, gw = weird_gateway
    upstream.tags, upstream.ps = tags, ps
    time.sleep(0.5)  # several polls of the malformed answers
    assert _generate(gw).status_code == 200
    assert httpx.get(f"{gw.url}/readyz").status_code == 200
    models = httpx.get(f"{gw.url}/v1/models", headers=gw.headers())
    assert models.status_code in (200, 502)
    assert "error" in models.json() or "data" in models.json()
    for path in ("/api/tags", "/api/ps"):
        listed = httpx.get(f"{gw.url}{path}", headers=gw.headers())
        assert listed.status_code in (200, 502), listed.text
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


class ListingOnly(OpenAILookalike):
    """An OpenAI-compatible server whose only use here is its `/v1/models`."""

    async def complete(self, request: Request) -> Response:
        return Response(status_code=404)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize(
    "models",
    [
        b'{"object": "list", "data": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"object": "list", "data": [' + b'{"id":' * 3000 + b'"m"' + b"}" * 3000 + b"]}",
    ],
)
def test_a_deeply_nested_openai_model_list_does_not_break_the_gateway(
    make_gateway: Callable[..., Gateway], caplog: pytest.LogCaptureFixture, models: bytes
) -> None:
    upstream = ListingOnly(models=models)
    with LoopbackServer(upstream.app) as server:
        gw = make_gateway(
            upstream_url=server.url, upstream_dialect="openai", upstream_poll_interval=0.1
        )
        time.sleep(0.5)  # several polls of the nested answer
        listed = httpx.get(f"{gw.url}/v1/models", headers=gw.headers(), timeout=10)
    assert listed.status_code in (200, 502), listed.text
    assert "error" in listed.json() or "data" in listed.json()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


#: Tool-call arguments (a JSON document inside a JSON string) nested past the recursion limit.
DEEP_ARGUMENTS = "[" * 5000 + "]" * 5000


class ToolCaller(OpenAILookalike):
    """An OpenAI-compatible server that answers every chat with one call of a tool whose
    `arguments` are `DEEP_ARGUMENTS`, streamed or not."""

    async def complete(self, request: Request) -> Response:
        call = {"id": "c1", "type": "function"}
        call["function"] = {"name": "f", "arguments": DEEP_ARGUMENTS}
        head = {"id": "x", "created": 0, "model": MODEL}
        if not (await request.json()).get("stream"):
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            answer = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            return JSONResponse(answer)
        delta = {"role": "assistant", "tool_calls": [{**call, "index": 0}]}
        chunk = {**head, "object": "chat.completion.chunk"}
        events = [
            {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            "[DONE]",
        ]
        return Response(sse(*events), media_type="text/event-stream")


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("stream", [False, True])
def test_deeply_nested_tool_arguments_from_an_upstream_are_relayed_as_text(
    make_gateway: Callable[..., Gateway], caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    # Ollama's tool calls carry `arguments` as an object, so an OpenAI upstream's string is
    # parsed for an Ollama client: at this depth that raised RecursionError (a 500, or a
    # stream cut off without its last chunk). Arguments that cannot be parsed within bounds
    # are passed on as text (`_raw`), as invalid JSON arguments always were.
    with LoopbackServer(ToolCaller().app) as server:
        gw = make_gateway(upstream_url=server.url, upstream_dialect="openai")
        response = httpx.post(
            f"{gw.url}/api/chat",
            headers=gw.headers(),
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": stream,
            },
            timeout=10,
        )
    assert response.status_code == 200, response.text
    lines = [json.loads(line) for line in response.text.splitlines()]
    calls = [call for line in lines for call in line["message"].get("tool_calls", [])]
    assert [call["function"]["arguments"] for call in calls] == [{"_raw": DEEP_ARGUMENTS}]
    assert lines[-1]["done"] is True
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_deeply_nested_tool_arguments_from_a_client_reach_ollama_as_text(
    gateway: Gateway, emulator: Emulator
) -> None:
    # The same string in a client's own history (an assistant turn it sends back) was refused
    # as "the ollama upstream cannot take this request": the RecursionError was taken for the
    # dialect's refusal. Now it is passed on as text, as invalid JSON arguments are.
    call = {"id": "c1", "type": "function"}
    call["function"] = {"name": "f", "arguments": DEEP_ARGUMENTS}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        headers=gateway.headers(),
        json={"model": MODEL, "messages": messages},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


class BrokenShow(OllamaLookalike):
    """An Ollama look-alike whose `/api/show` fails with the body a test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.show: tuple[int, bytes] = (500, b"{}")
        self.app.router.routes.append(Route("/api/show", self._show, methods=["POST"]))

    async def _show(self, _: Request) -> Response:
        status, body = self.show
        return Response(body, status, media_type="application/json")


@pytest.mark.parametrize("status", [400, 500])
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 30_000 + b"]" * 30_000,  # within the 64 KiB read of an error body
        b'{"error": ' + b'{"a":' * 6000 + b"1" + b"}" * 6000 + b"}",
    ],
)
def test_a_deeply_nested_error_body_on_a_passthrough_route_is_a_clean_error(
    make_gateway: Callable[..., Gateway], status: int, body: bytes
) -> None:
    upstream = BrokenShow()
    upstream.show = (status, body)
    with LoopbackServer(upstream.app) as server:
        gw = make_gateway(upstream_url=server.url)
        response = httpx.post(
            f"{gw.url}/api/show", headers=gw.headers(), json={"model": MODEL}, timeout=10
        )
    assert response.status_code in (400, 502), response.text  # the request's, or the upstream's
    assert isinstance(response.json()["error"], str)


def test_upstream_cookies_are_never_replayed(weird_gateway):
    upstream, gw = weird_gateway
    for _ in range(3):
        assert _generate(gw).status_code == 200
    assert all("cookie" not in headers for headers in upstream.headers_seen)


@pytest.mark.parametrize(
    "final",
    [
        {"done": True, "prompt_eval_count": -5, "eval_count": "abc", "eval_duration": -1},
        {"done": True, "prompt_eval_count": 1.5, "eval_count": None, "eval_duration": "x"},
        # Beyond 2**53: would overflow the decode rate (a float) and used to abort the finish.
        {"done": True, "prompt_eval_count": 10**400, "eval_count": 10**30, "eval_duration": 1},
    ],
)
@pytest.mark.parametrize("stream", [True, False])
def test_nonsense_final_metrics_are_not_trusted(weird_gateway, final, stream):
    upstream, gw = weird_gateway
    upstream.final = final
    response = _generate(gw, stream=stream)
    assert response.status_code == 200
    text = gw.metrics_text()
    assert metric_value(text, "gateway_requests_total", outcome="completed") == 1
    assert metric_value(text, "gateway_output_tokens_total") == 2  # the relayed chunks
    assert metric_value(text, "gateway_input_tokens_total") == 0


def test_deeply_nested_upstream_error_body_is_a_clean_error(weird_gateway):
    upstream, gw = weird_gateway
    upstream.error = (400, b"[" * 100_000 + b"]" * 100_000)
    response = _generate(gw)
    assert response.status_code == 400
    assert isinstance(response.json()["error"], str)


def test_lone_surrogates_are_relayed_not_a_500(gateway: Gateway, emulator: Emulator):
    raw = b'{"model": "llama3.2:latest", "prompt": "\\ud800", "stream": false}'
    response = httpx.post(
        f"{gateway.url}/v1/generate",
        content=raw,
        headers={**gateway.headers(), "content-type": "application/json"},
    )
    assert response.status_code == 200
    [record] = [r for r in emulator.state.records if r.path == "/api/generate"]
    assert record.body["prompt"] == "\ud800"


def test_numbers_that_overflow_are_refused(gateway: Gateway, emulator: Emulator):
    raw = b'{"model": "llama3.2:latest", "prompt": "x", "options": {"temperature": 1e999}}'
    response = httpx.post(
        f"{gateway.url}/v1/generate",
        content=raw,
        headers={**gateway.headers(), "content-type": "application/json"},
    )
    assert response.status_code == 400
    assert "out of range" in response.json()["error"]


def test_overlong_model_names_are_refused_not_echoed(gateway: Gateway):
    response = _generate(gateway, model="m" * 100_000)
    assert response.status_code == 422
    assert len(response.content) < 200


def test_trailing_slash_is_not_redirected(gateway: Gateway):
    response = httpx.post(f"{gateway.url}/v1/generate/", json={}, headers={"Host": "evil.example"})
    assert response.status_code == 404
    assert "location" not in response.headers


def test_basic_authorization_falls_back_to_x_api_key(gateway: Gateway):
    response = httpx.post(
        f"{gateway.url}/v1/generate",
        json={"model": MODEL, "prompt": "x", "stream": False},
        headers={"Authorization": "Basic dXNlcjpwYXNz", "X-API-Key": gateway.key},
    )
    assert response.status_code == 200


def test_client_leaving_while_sending_its_body_is_not_a_500(gateway: Gateway):
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {gateway.key}\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"model": "llama'
        )
        time.sleep(0.2)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        text = gateway.metrics_text()
        if metric_value(text, "gateway_requests_total", outcome="client_disconnect"):
            break
        time.sleep(0.05)
    assert metric_value(text, "gateway_requests_total", outcome="client_disconnect") == 1
    assert metric_value(text, "gateway_requests_total", status_class="5xx") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_an_upstream_that_never_answers_its_health_probe_is_unready_in_bounded_time(
    make_gateway: Callable[..., Gateway],
):
    """The probe has its own short timeout: /readyz says 503 instead of hanging."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    try:
        port = silent.getsockname()[1]
        gw = make_gateway(upstream_url=f"http://127.0.0.1:{port}", connect_timeout=0.5)
        start = time.perf_counter()
        ready = httpx.get(f"{gw.url}/readyz", timeout=10)
        assert ready.status_code == 503
        assert time.perf_counter() - start < 3
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
    finally:
        silent.close()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_an_upstream_that_trickles_its_probe_answer_cannot_hold_probes_or_connections(
    make_gateway: Callable[..., Gateway],
):
    """Found by attack: one byte every 0.2 s beats every per-read timeout; the probe's budget
    (GATEWAY_CONNECT_TIMEOUT) must still end it and give its pooled connection back."""
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            while not stop.is_set():
                try:
                    conn.sendall(b"1\r\nx\r\n")
                except OSError:
                    return
                time.sleep(0.2)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        port = listener.getsockname()[1]
        gw = make_gateway(
            upstream_url=f"http://127.0.0.1:{port}",
            connect_timeout=0.5,
            max_connections=1,
            upstream_poll_interval=3600,
        )
        for _ in range(3):  # one connection: a probe that kept it would starve the next ones
            start = time.perf_counter()
            ready = httpx.get(f"{gw.url}/readyz", timeout=10)
            assert ready.status_code == 503
            assert time.perf_counter() - start < 3
            assert "did not answer within 0.5 s" in json.dumps(ready.json())
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_compressed_answer_is_refused_not_inflated(weird_gateway, stream):
    upstream, gw = weird_gateway
    upstream.encoding = "gzip"
    response = _generate(gw, stream=stream)
    assert response.status_code == 502
    assert response.json() == {"error": "upstream sent a compressed answer (gzip)"}


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_an_upstream_lingering_after_done_does_not_hold_the_answer(weird_gateway):
    upstream, gw = weird_gateway
    upstream.linger = 8.0  # with the default 60 s idle timeout the answer used to wait it out
    started = time.monotonic()
    response = _generate(gw, stream=False)
    assert time.monotonic() - started < 5
    assert response.status_code == 200
    assert response.headers["content-length"] == str(len(response.content))
    assert response.json()["response"] == "ab"


def test_a_key_with_a_concurrency_cap_survives_upstream_garbage(weird_gateway):
    """The finish step settles the key's in-flight count even when the answer is nonsense."""
    upstream, gw = weird_gateway
    upstream.final = {"done": True, "eval_count": 10**400, "eval_duration": 10**400}
    _, capped = gw.create_key("capped", max_concurrent=1)
    for _ in range(3):
        response = httpx.post(
            f"{gw.url}/v1/generate",
            json={"model": MODEL, "prompt": "x"},
            headers=gw.headers(capped),
            timeout=10,
        )
        assert response.status_code == 200


def test_tokens_in_the_same_read_as_a_malformed_line_are_relayed_first(weird_gateway):
    upstream, gw = weird_gateway
    upstream.tail = b"{not json\n"
    response = _generate(gw)
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line.get("response") for line in lines[:2]] == ["a", "b"]
    assert lines[2:] == [{"error": "upstream sent a malformed NDJSON line"}]


class _CountingVersion(OllamaLookalike):
    """An Ollama look-alike that counts its readiness probes and answers each after 50 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.probes = 0

    async def _version(self, request: Request) -> Response:
        self.probes += 1
        await asyncio.sleep(0.05)
        return await super()._version(request)


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_an_anonymous_readyz_flood_shares_the_upstreams_probes(make_gateway):
    """/readyz is public: callers share one probe at a time, and a ready result for a second,
    so a flood of anonymous /readyz makes the upstream answer about one probe a second, not one
    per request (before: 80 requests, 80 probes)."""
    upstream = _CountingVersion()
    with LoopbackServer(upstream.app) as server:
        gw = make_gateway(upstream_url=server.url, upstream_poll_interval=3600)
        before = upstream.probes
        start = time.monotonic()
        with ThreadPoolExecutor(20) as pool:
            statuses = list(
                pool.map(lambda _: httpx.get(f"{gw.url}/readyz", timeout=10).status_code, range(40))
            )
        statuses += [httpx.get(f"{gw.url}/readyz", timeout=10).status_code for _ in range(40)]
        elapsed = time.monotonic() - start
        assert statuses == [200] * 80
        # One probe per started second of the flood at most, and one for the first callers.
        assert upstream.probes - before <= 2 + int(elapsed)
