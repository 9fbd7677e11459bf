"""A large request body is parsed, checked and written upstream without stalling the event loop.

Found by the attack on c600ad9 (issue 29): bodies within the 16 MiB limit and the value limit,
made of many non-ASCII keys, text parts or inputs, held the loop 0.1-0.3 s each while they were
parsed, checked, translated and written again for the upstream. A body over 1 MiB is now handled
in a worker thread, its C-bound steps short (`gateway.wire.json.parse_request_body`).

Over real loopback sockets: `gateway serve` in its own process in front of an Ollama look-alike;
a victim key streams a generation while an attacker key sends large bodies on three connections.
The bound is generous: on a loaded 2-core machine the code before the fix paused the victim's
stream for well over a second on these bodies.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.settings import Settings
from gateway.wire import json as body
from tests.support.client import MODEL, worst_stream_gap
from tests.support.lookalikes import OllamaLookalike, served

#: Worst pause of the victim's stream allowed while the attacker's bodies are handled, seconds.
#: Measured on a loaded 2-core machine (load 7-8): 0.85-2.3 s before the fix, 0.13-0.35 s after.
STALL_BOUND = 0.6
#: How long the attacker keeps sending, seconds.
ATTACK_SECONDS = 6
#: The attacker's connections: one more than the threads that parse at once.
CONNECTIONS = 3


class SmallAnswers(OllamaLookalike):
    """An Ollama look-alike that reads a body without parsing it and answers briefly.

    `/api/embed` answers one short vector and `/api/chat` one done line; `/api/generate` is the
    victim's paced stream of 3,000 tokens (60 s at most: the victim stops reading first).
    """

    def __init__(self) -> None:
        super().__init__(generate_paths=("/api/generate", "/api/chat", "/api/embed"))

    async def generate(self, request: Request) -> Response:
        await request.body()  # not parsed: this process also times the victim
        path = request.url.path
        if path == "/api/embed":
            answer = {"model": MODEL, "embeddings": [[0.5, 0.25]], "prompt_eval_count": 1}
            return Response(json.dumps(answer), media_type="application/json")
        if path == "/api/chat":
            done = {"model": MODEL, "message": {"role": "assistant", "content": "a"}, "done": True}
            return Response(json.dumps(done) + "\n", media_type="application/x-ndjson")
        return StreamingResponse(self._paced(), media_type="application/x-ndjson")

    async def _paced(self) -> Any:
        for _ in range(3000):
            yield json.dumps({"model": MODEL, "response": "a", "done": False}) + "\n"
            await anyio.sleep(0.02)
        yield json.dumps({"model": MODEL, "response": "", "done": True, "eval_count": 1}) + "\n"


@pytest.fixture
def upstream() -> Iterator[tuple[SmallAnswers, str]]:
    yield from served(SmallAnswers())


def _collide() -> bytes:
    """15 MB: 49,000 non-ASCII keys, the last differing from the first only in case (a 400)."""
    keys = ",".join(f'"{i:06d}' + "\u00e9" * 150 + '":1' for i in range(49_000))
    tail = '"000000' + "\u00c9" * 150 + '":1'
    return f'{{"model":"{MODEL}","prompt":"x","options":{{{keys},{tail}}}}}'.encode()


def _keys() -> bytes:
    """15 MB: an embedding whose `options` has 49,000 non-ASCII keys."""
    keys = ",".join(f'"\u00e9{i:06d}' + "k" * 300 + '":1' for i in range(49_000))
    return f'{{"model":"{MODEL}","input":"x","options":{{{keys}}}}}'.encode()


def _parts() -> bytes:
    """16 MB: an OpenAI chat message of 33,000 text parts (translated for Ollama's /api/chat)."""
    parts = [{"type": "text", "text": "x" * 450} for _ in range(33_000)]
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": parts}]}).encode()


def _inputs() -> bytes:
    """16 MB: an embedding of 99,000 inputs."""
    return json.dumps({"model": MODEL, "input": ["a" * 160 for _ in range(99_000)]}).encode()


@pytest.mark.processes
@pytest.mark.parametrize(
    ("make_body", "path", "status"),
    [
        (_collide, "/api/generate", 400),
        (_keys, "/api/embed", 200),
        (_parts, "/v1/chat/completions", 200),
        (_inputs, "/api/embed", 200),
    ],
)
def test_a_large_body_does_not_stall_another_keys_stream(serve, upstream, make_body, path, status):
    _, url = upstream
    gateway_url, attacker, victim = serve(url, "ollama")
    raw = make_body()
    assert 8 * 1024 * 1024 < len(raw) <= Settings().max_body_bytes

    def attack() -> list[int]:
        headers = {"Authorization": f"Bearer {attacker}", "content-type": "application/json"}
        end = time.monotonic() + ATTACK_SECONDS

        def post(_: int) -> list[int]:
            statuses = []
            with httpx.Client(timeout=120) as client:
                while time.monotonic() < end:
                    response = client.post(f"{gateway_url}{path}", content=raw, headers=headers)
                    statuses.append(response.status_code)
                    if response.status_code == 400:  # the same message as on the event loop
                        assert "differ only in case" in response.json()["error"]
            return statuses

        with ThreadPoolExecutor(CONNECTIONS) as pool:
            return [code for codes in pool.map(post, range(CONNECTIONS)) for code in codes]

    worst, statuses = worst_stream_gap(gateway_url, victim, attack)
    assert set(statuses) == {status}, statuses
    assert worst < STALL_BOUND, worst


def _fit(make: Any) -> bytes:
    """The largest `make(n)` of at most 1 MiB (`body.INLINE_PARSE_BYTES`)."""
    low, high = 1, 400_000
    while low < high:
        mid = (low + high + 1) // 2
        if len(make(mid)) <= body.INLINE_PARSE_BYTES:
            low = mid
        else:
            high = mid - 1
    return bytes(make(low))


def _small_keys() -> bytes:
    """Just under 1 MiB: an embedding whose `options` has ~95,000 short keys."""
    return _fit(
        lambda n: (
            f'{{"model":"{MODEL}","input":"x","options":{{'
            + ",".join(f'"k{i}":1' for i in range(n))
            + "}}"
        ).encode()
    )


def _small_parts() -> bytes:
    """Under 1 MiB: an OpenAI chat message of 30,000 one-character text parts (90,000 values,
    within `GATEWAY_MAX_JSON_VALUES`)."""
    parts = [{"type": "text", "text": "x"}] * 30_000
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": parts}]}).encode()


@pytest.mark.processes
@pytest.mark.parametrize(
    ("make_body", "path"), [(_small_keys, "/api/embed"), (_small_parts, "/v1/chat/completions")]
)
def test_many_bodies_of_many_values_under_a_mebibyte_do_not_stall_another_keys_stream(
    serve, upstream, make_body, path
):
    """Bodies just under 1 MiB are parsed in a thread too when they hold many values: their
    cost is per value. Before, eight connections of them paused the victim for 1-4 s."""
    _, url = upstream
    gateway_url, attacker, victim = serve(url, "ollama")
    raw = make_body()
    assert len(raw) <= body.INLINE_PARSE_BYTES

    def attack() -> list[int]:
        headers = {"Authorization": f"Bearer {attacker}", "content-type": "application/json"}
        end = time.monotonic() + ATTACK_SECONDS

        def post(_: int) -> list[int]:
            with httpx.Client(timeout=120) as client:
                statuses = []
                while time.monotonic() < end:
                    response = client.post(f"{gateway_url}{path}", content=raw, headers=headers)
                    statuses.append(response.status_code)
                return statuses

        with ThreadPoolExecutor(8) as pool:
            return [code for codes in pool.map(post, range(8)) for code in codes]

    worst, statuses = worst_stream_gap(gateway_url, victim, attack)
    assert set(statuses) == {200}, statuses
    assert worst < STALL_BOUND, worst


# --- the pieces: small bodies stay on the loop, large ones share a few threads -----------------


def test_a_small_body_is_parsed_on_the_event_loop(monkeypatch):
    def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a small body went to a worker thread")

    monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
    loop_thread = threading.get_ident()
    seen: list[int] = []

    def parse(raw: bytes, settings: Settings) -> int:
        seen.append(threading.get_ident())
        return len(raw)

    raw = b" " * body.INLINE_PARSE_BYTES
    assert anyio.run(body.parse_request_body, parse, raw, Settings()) == len(raw)
    assert seen == [loop_thread]


def test_large_bodies_are_parsed_in_at_most_two_threads_at_once():
    running: list[int] = []
    most: list[int] = [0]
    lock = threading.Lock()

    def parse(raw: bytes, settings: Settings) -> int:
        with lock:
            running.append(threading.get_ident())
            most[0] = max(most[0], len(running))
        time.sleep(0.05)
        with lock:
            running.remove(threading.get_ident())
        return threading.get_ident()

    async def main() -> set[int]:
        raw = b" " * (body.INLINE_PARSE_BYTES + 1)
        idents: list[int] = []

        async def one() -> None:
            idents.append(await body.parse_request_body(parse, raw, Settings()))

        async with anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(one)
        return set(idents)

    idents = anyio.run(main)
    assert threading.get_ident() not in idents
    assert most[0] == body.JSON_THREADS == 2
