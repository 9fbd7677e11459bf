"""Answers a request makes large: the request's fault, and never a stall of the event loop.

Found by the attack on bc17182 (issue 29, item 6). An embeddings request with many inputs on a
high-dimension model makes an answer over the 32 MiB the gateway holds; it was blamed on the
upstream, opened its circuit for every key, and batch lines of it held the circuit open. Parsing
and translating an answer near that size held the event loop for a second per request.

Over real loopback sockets: the upstream is a look-alike serving prebuilt answers (a
high-dimension model's vectors); the gateway runs in a thread of this process (`LoopbackServer`),
or, for the stalls, as `gateway serve` in its own process while a victim key streams a
generation. Time bounds are generous and relative:
the code before the fix stalled the loop 1-2 s per request on this machine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import anyio
import httpx
import openai
import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.neutral import GenerationRequest
from gateway.testing.server import LoopbackServer
from gateway.upstream.dialects.base import requested_vectors
from gateway.upstream.dialects.framing import JsonList, encode_json_stepwise
from gateway.upstream.dialects.json_codec import encode_json
from tests.support.batch import FAST, batch_line, chat_line, read_jsonl, upload_lines, wait_batch
from tests.support.client import MODEL, worst_stream_gap
from tests.support.lookalikes import OllamaLookalike, OpenAILookalike, served, sse
from tests.support.metrics import metric_value, wait_polled
from tests.support.stack import Gateway

#: A high-dimension embedding model's vector length (Qwen3-Embedding-8B, NV-Embed).
DIMENSIONS = 4096
#: Vectors whose answer is over the 32 MiB cap (about 36 MB written as float64 text).
OVER_CAP = 420
#: Vectors whose answer is just under it (about 31 MB): served, and costly to parse.
UNDER_CAP = 360
#: One failure the upstream is to blame for opens its circuit (so a wrong blame shows at once).
OPEN_AT_ONE = {"circuit_failures": 1, "circuit_cooldown": 60}
#: Worst pause of the victim's stream allowed while two answers are handled at once, in seconds.
#: Measured on a loaded 2-core machine (load 6-10): 1.0-6.0 s before the fix, 0.19-0.39 s after.
STALL_BOUND = 0.6


@cache
def _vector_text() -> str:
    rng = random.Random(29)  # noqa: S311 - test data, not a secret
    return json.dumps([rng.uniform(-1, 1) for _ in range(DIMENSIONS)], separators=(",", ":"))


@cache
def _ollama_embeddings(count: int) -> bytes:
    """Ollama's `/api/embed` answer with `count` vectors of `DIMENSIONS` float64 values."""
    vectors = ",".join([_vector_text()] * count)
    return f'{{"model":"{MODEL}","embeddings":[{vectors}],"prompt_eval_count":{count}}}'.encode()


@cache
def _openai_embeddings(count: int) -> bytes:
    """`/v1/embeddings`' answer with `count` vectors, as llama.cpp or vLLM write it."""
    vector = _vector_text()
    data = ",".join(
        f'{{"object":"embedding","index":{i},"embedding":{vector}}}' for i in range(count)
    )
    usage = f'"usage":{{"prompt_tokens":{count},"total_tokens":{count}}}'
    return f'{{"object":"list","model":"{MODEL}","data":[{data}],{usage}}}'.encode()


@cache
def _chat_with_logprobs(lines: int) -> bytes:
    """An Ollama chat stream of `lines` tokens, each with 20 top logprobs (~0.9 KB a line)."""
    top = [{"token": f"t{i}", "logprob": -0.5 - i, "bytes": [116]} for i in range(20)]
    line = json.dumps(
        {
            "model": MODEL,
            "message": {"role": "assistant", "content": "a"},
            "logprobs": [{"token": "a", "logprob": -0.1, "top_logprobs": top}],
            "done": False,
        }
    )
    done = json.dumps(
        {
            "model": MODEL,
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "eval_count": lines,
            "prompt_eval_count": 1,
        }
    )
    return ((line + "\n") * lines + done + "\n").encode()


@cache
def _long_generation() -> bytes:
    """An Ollama generate stream of 34 lines of 1 MiB text each: over 32 MiB in all."""
    text = "word " * (1024 * 1024 // 5)
    line = json.dumps({"model": MODEL, "response": text, "done": False})
    done = json.dumps({"model": MODEL, "response": "", "done": True, "eval_count": 34})
    return ((line + "\n") * 34 + done + "\n").encode()


class LargeAnswers(OllamaLookalike):
    """An Ollama look-alike whose answers are as large as a high-dimension model makes them.

    `/api/embed` answers `embed_answer`; `/api/chat` the logprobs stream; `/api/generate` the
    long generation for the prompt `long`, else a paced stream of `victim_tokens` tokens (the
    victim's). `calls` counts requests per path.
    """

    def __init__(self) -> None:
        super().__init__(generate_paths=("/api/generate", "/api/chat", "/api/embed"))
        self.embed_answer = _ollama_embeddings(OVER_CAP)
        self.victim_tokens = 20
        self.calls: dict[str, int] = {}

    async def generate(self, request: Request) -> Response:
        path = request.url.path
        self.calls[path] = self.calls.get(path, 0) + 1
        body = await request.json()
        if path == "/api/embed":
            return Response(self.embed_answer, media_type="application/json")
        if path == "/api/chat":
            return Response(_chat_with_logprobs(28_000), media_type="application/x-ndjson")
        if body.get("prompt") == "long":
            return Response(_long_generation(), media_type="application/x-ndjson")
        return StreamingResponse(self._paced(), media_type="application/x-ndjson")

    async def _paced(self) -> Any:
        for _ in range(self.victim_tokens):
            yield json.dumps({"model": MODEL, "response": "a", "done": False}) + "\n"
            await anyio.sleep(0.02)
        yield json.dumps({"model": MODEL, "response": "", "done": True, "eval_count": 1}) + "\n"


class LargeOpenAIAnswers(OpenAILookalike):
    """An OpenAI-compatible look-alike: `/v1/embeddings` answers `embed_answer`, and a chat
    completion is a paced stream of `victim_tokens` tokens. `calls` counts embeddings requests.
    """

    def __init__(self) -> None:
        super().__init__(complete_paths=("/v1/embeddings", "/v1/chat/completions"))
        self.embed_answer = _openai_embeddings(OVER_CAP)
        self.victim_tokens = 20
        self.calls = 0

    async def complete(self, request: Request) -> Response:
        await request.body()
        if request.url.path == "/v1/embeddings":
            self.calls += 1
            return Response(self.embed_answer, media_type="application/json")
        return StreamingResponse(self._paced(), media_type="text/event-stream")

    async def _paced(self) -> Any:
        for _ in range(self.victim_tokens):
            delta = {"choices": [{"index": 0, "delta": {"content": "a"}}]}
            yield sse(delta)
            await anyio.sleep(0.02)
        yield sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "[DONE]")


@pytest.fixture
def upstream() -> Iterator[tuple[LargeAnswers, str]]:
    yield from served(LargeAnswers())


@pytest.fixture
def openai_upstream() -> Iterator[tuple[LargeOpenAIAnswers, str]]:
    upstream = LargeOpenAIAnswers()
    with LoopbackServer(upstream.app) as server:
        yield upstream, server.url


def _gateway(
    make_gateway: Callable[..., Gateway], url: str, dialect: str = "ollama", **settings: Any
) -> Gateway:
    gw = make_gateway(upstreams=[{"url": url, "dialect": dialect}], **settings)
    wait_polled(gw, 1)
    return gw


def _inputs(count: int) -> list[str]:
    return [f"input number {i}" for i in range(count)]


def _embed(gw: Gateway, path: str, count: int, key: str | None = None) -> httpx.Response:
    return httpx.post(
        f"{gw.url}{path}",
        json={"model": MODEL, "input": _inputs(count)},
        headers=gw.headers(key),
        timeout=60,
    )


def _circuit(gw: Gateway, url: str) -> float:
    name = url.removeprefix("http://")
    return metric_value(gw.metrics_text(), "gateway_upstream_circuit_state", upstream=name)


def _victim_served(gw: Gateway, key: str) -> bool:
    response = httpx.post(
        f"{gw.url}/api/generate",
        json={"model": MODEL, "prompt": "x", "stream": False},
        headers=gw.headers(key),
        timeout=30,
    )
    return response.status_code == 200 and response.json()["done"] is True


def _message(response: httpx.Response) -> str:
    error = response.json()["error"]
    return error["message"] if isinstance(error, dict) else error


# --- the request's fault: 413 in the client's format, no breaker, no retry, no failover --------


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
@pytest.mark.parametrize("path", ["/api/embed", "/v1/embeddings"])
def test_embeddings_too_large_for_their_many_inputs_are_the_requests_fault(
    make_gateway, upstream, path
):
    lookalike, url = upstream
    second = LargeAnswers()
    with LoopbackServer(second.app) as other:  # a second GPU node: nothing fails over to it
        gw = make_gateway(upstreams=[{"url": url}, {"url": other.url}], **OPEN_AT_ONE)
        wait_polled(gw, 2)
        _, victim = gw.create_key("victim")
        for _ in range(3):
            response = _embed(gw, path, OVER_CAP)
            assert response.status_code == 413, response.text[:300]
            assert "send fewer inputs" in _message(response)
            assert "32 MiB" in _message(response)
            if path.startswith("/v1/"):
                assert response.json()["error"]["code"] == "request_too_large"
        # Each request reached one upstream once: neither retried nor tried elsewhere.
        assert lookalike.calls.get("/api/embed", 0) + second.calls.get("/api/embed", 0) == 3
        assert _circuit(gw, url) == 0
        assert _circuit(gw, other.url) == 0
        assert _victim_served(gw, victim)
        metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_requests_total", outcome="client_error") >= 3
    assert metric_value(metrics, "gateway_requests_total", outcome="upstream_error") == 0
    assert metric_value(metrics, "gateway_upstream_failovers_total") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_an_openai_upstreams_answer_too_large_for_many_inputs_is_the_requests_fault(
    make_gateway, openai_upstream
):
    lookalike, url = openai_upstream
    gw = _gateway(make_gateway, url, dialect="openai", **OPEN_AT_ONE)
    for path in ("/api/embed", "/v1/embeddings"):
        response = _embed(gw, path, OVER_CAP)
        assert response.status_code == 413, response.text[:300]
        assert "send fewer inputs" in _message(response)
    assert lookalike.calls == 2
    assert _circuit(gw, url) == 0


def test_an_over_long_answer_to_a_small_request_is_still_the_upstreams_fault(
    make_gateway, upstream
):
    # One input cannot ask for 32 MiB: no embedding model makes that much. The upstream is
    # broken, and one such answer opens its circuit (OPEN_AT_ONE), as before.
    _, url = upstream
    gw = _gateway(make_gateway, url, **OPEN_AT_ONE)
    response = _embed(gw, "/api/embed", 1)
    assert response.status_code == 502
    assert _circuit(gw, url) == 2


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_non_streamed_answer_over_the_cap_is_the_requests_fault(make_gateway, upstream):
    lookalike, url = upstream
    gw = _gateway(make_gateway, url, **OPEN_AT_ONE)
    body = {"model": MODEL, "prompt": "long", "stream": False}
    response = httpx.post(f"{gw.url}/api/generate", json=body, headers=gw.headers(), timeout=60)
    assert response.status_code == 413
    assert '"stream": true' in response.json()["error"]
    assert _circuit(gw, url) == 0
    assert lookalike.calls["/api/generate"] == 1
    # Streamed, the same answer has no cap: the client reads it as it comes.
    with httpx.stream(
        "POST",
        f"{gw.url}/api/generate",
        json={**body, "stream": True},
        headers=gw.headers(),
        timeout=60,
    ) as streamed:
        lines = [json.loads(line) for line in streamed.iter_lines() if line]
    assert streamed.status_code == 200
    assert lines[-1]["done"] is True
    assert len(lines) == 35


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_batch_lines_too_large_for_their_inputs_fail_at_once_and_leave_the_circuit_closed(
    make_gateway, upstream
):
    lookalike, url = upstream
    gw = _gateway(make_gateway, url, **OPEN_AT_ONE, **FAST, batch_max_attempts=5)
    _, victim = gw.create_key("victim")
    body = {"model": MODEL, "input": _inputs(OVER_CAP)}
    lines = [batch_line(f"e-{i}", body, "/v1/embeddings") for i in range(4)]
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0) as client:
        file_id = upload_lines(client, lines)
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
        )
        done = wait_batch(client, batch.id, timeout=60)
        errors = read_jsonl(client, done.error_file_id)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 4)
    assert {e["response"]["status_code"] for e in errors} == {413}
    assert lookalike.calls["/api/embed"] == 4  # each line tried once
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="retried") == 0
    assert _circuit(gw, url) == 0
    assert _victim_served(gw, victim)


# --- the event loop goes on serving other keys while a large answer is parsed or written -------


@pytest.mark.processes
@pytest.mark.parametrize(
    ("dialect", "path"),
    [
        ("ollama", "/api/embed"),  # parsing the answer (relayed as the upstream sent it)
        ("ollama", "/v1/embeddings"),  # parsing, then writing it in OpenAI's shape
        ("openai", "/api/embed"),  # an OpenAI upstream's answer translated to Ollama's
        ("ollama", "/v1/chat/completions"),  # a non-streamed answer of 28,000 logprobs lines
    ],
)
def test_a_large_answer_does_not_stall_another_keys_stream(
    serve, upstream, openai_upstream, dialect, path
):
    if dialect == "openai":
        other, url = openai_upstream
        other.embed_answer = _openai_embeddings(UNDER_CAP)
        other.victim_tokens = 3000  # 60 s at most; the victim stops reading after the attack
    else:
        lookalike, url = upstream
        lookalike.embed_answer = _ollama_embeddings(UNDER_CAP)
        lookalike.victim_tokens = 3000
    gateway_url, attacker, victim = serve(url, dialect)

    def attack() -> list[int]:
        if path == "/v1/chat/completions":
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "logprobs": True,
                "top_logprobs": 20,
            }
        else:
            body = {"model": MODEL, "input": _inputs(UNDER_CAP)}
        headers = {"Authorization": f"Bearer {attacker}"}

        def post(_: int) -> int:
            url = f"{gateway_url}{path}"
            return httpx.post(url, json=body, headers=headers, timeout=120).status_code

        with ThreadPoolExecutor(2) as pool:  # two at once: the old code parsed them in turn
            return list(pool.map(post, range(2)))

    worst, statuses = worst_stream_gap(gateway_url, victim, attack)
    assert statuses == [200, 200]
    assert worst < STALL_BOUND, worst


# --- the pieces: whose fault by count, and writing without holding the GIL long ----------------


@pytest.mark.parametrize(
    ("surface", "body", "vectors"),
    [
        ("ollama", {"input": "one text"}, 1),
        ("ollama", {"input": ["a", "b", "c"]}, 3),
        ("openai", {"input": [1, 2, 3]}, 1),  # one tokenized input
        ("openai", {"input": [[1, 2], [3]]}, 2),
        ("openai", {"input": []}, 0),
    ],
)
def test_the_vectors_a_request_asks_for_are_counted_per_input(surface, body, vectors):
    request = GenerationRequest(surface, "embed", {"model": MODEL, **body}, MODEL)
    assert requested_vectors(request) == vectors


def test_a_generation_or_a_legacy_embedding_asks_for_at_most_one_vector():
    generation = GenerationRequest("ollama", "generate", {"model": MODEL}, MODEL)
    legacy = GenerationRequest(
        "ollama", "embed", {"model": MODEL, "prompt": "x"}, MODEL, legacy=True
    )
    assert (requested_vectors(generation), requested_vectors(legacy)) == (0, 1)


@pytest.mark.parametrize(
    "data",
    [
        [],
        {},
        [[]],
        {"a": [], "b": {}},
        {"embeddings": [[0.5, -1.25e-7, 3], [1e300]], "model": "é"},
        [{"token": "a", "top_logprobs": [{"token": "b", "bytes": [98]}]}] * 3000,
        list(range(100_000)),
        [[0.1] * 4096] * 20,
        {f"k\u00e9{i}": i for i in range(5000)},  # an object of many members, in steps
        {"model": "m", "options": {str(i): [i, {"a": "é"}] for i in range(3000)}},
    ],
)
def test_a_stepwise_encoding_writes_the_same_bytes(data):
    assert encode_json_stepwise(data) == encode_json(data)


def test_a_lone_surrogate_is_escaped_where_it_is_and_the_json_is_the_same():
    data = {"text": "\ud800", "list": ["é", [1, 2]]}
    assert json.loads(encode_json_stepwise(data)) == json.loads(encode_json(data))


def test_a_json_list_is_spliced_where_its_placeholder_is():
    kept = JsonList()
    assert not kept
    kept.extend([{"a": 1}])
    kept.extend([])
    kept.extend([2, "three"])
    answer = {"before": kept.placeholder, "text": "x"}
    assert json.loads(kept.splice(encode_json(answer))) == {
        "before": [{"a": 1}, 2, "three"],
        "text": "x",
    }
    assert JsonList().splice(b'{"a":1}') == b'{"a":1}'


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_batch_line_that_outruns_its_own_deadline_is_not_retried(make_gateway, emulator):
    # Tokens flow, but the answer is longer than GATEWAY_REQUEST_TIMEOUT: the same line runs
    # out of it on every try, so each try would only cost another generation.
    gw = make_gateway(request_timeout=0.5, **FAST, batch_max_attempts=5)
    emulator.config.tokens = 100
    emulator.config.inter_token = 0.05  # 5 s of answer
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0) as client:
        file_id = upload_lines(client, [chat_line(f"slow-{i}") for i in range(2)])
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_batch(client, batch.id, timeout=60)
        errors = read_jsonl(client, done.error_file_id)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 2)
    assert {e["response"]["status_code"] for e in errors} == {504}
    assert len([r for r in emulator.state.records if r.path.endswith("/chat")]) == 2
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="retried") == 0
