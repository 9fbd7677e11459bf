"""The emulator as a GPU server: residency, memory and eviction, the prefix cache, its counters.

Pure tests of the cache and of eviction, then the emulator on a loopback port; the assertions
read the durations and counters the emulator reports, not the wall clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest

from gateway.testing.emulator.app import (
    EmulatorConfig,
    EmulatorState,
    create_emulator_app,
    parse_args,
)
from gateway.testing.emulator.capacity import Capacity
from gateway.testing.emulator.prefix import BLOCK_TOKENS, PrefixCache, render, tokenize
from gateway.testing.emulator.profiles import GPU_PROFILES
from gateway.testing.server import LoopbackServer

MODELS = ["a:latest", "b:latest", "c:latest"]
SYSTEM = "You are a careful assistant. " * 40  # ~1,200 bytes: ~300 tokens


def chat(*turns: str, model: str = "a") -> dict[str, object]:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user", "content": text} for text in turns]
    return {"model": model, "messages": messages, "stream": False}


# --- pure: tokens and the prefix cache --------------------------------------------------------


def test_the_three_faces_render_a_prompt_alike():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    native = render({"model": "a", "messages": messages})
    assert native == "<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>"
    parts = [
        {"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in messages
    ]
    assert render({"model": "a", "messages": parts}) == native  # OpenAI content parts
    assert render({"model": "a", "system": "be brief", "prompt": "hi"}) == native  # generate
    assert tokenize({"messages": messages}).count == -(-len(native.encode()) // 4)


def test_a_repeated_prompt_hits_all_but_its_last_token_and_a_shared_prefix_its_blocks():
    cache = PrefixCache(capacity_tokens=10_000)
    first = tokenize(chat("What is a hash table?"))
    assert cache.admit(first) == 0
    assert cache.admit(first) == min(len(first.blocks) * BLOCK_TOKENS, first.count - 1)
    other = tokenize(chat("Something else entirely."))
    shared = cache.admit(other)
    # the system prompt's whole blocks match; the first differing block and later do not
    assert (len(SYSTEM) // 4) - BLOCK_TOKENS <= shared <= len(SYSTEM) // 4 + 8
    assert shared < other.count - BLOCK_TOKENS


def test_the_cache_drops_least_recently_used_blocks_past_its_capacity():
    one = tokenize(chat("one"))
    small = PrefixCache(capacity_tokens=len(one.blocks) * BLOCK_TOKENS)
    small.admit(one)
    assert len(small) == len(one.blocks)
    unrelated = tokenize({"prompt": "x" * 4 * BLOCK_TOKENS * len(one.blocks)})
    small.admit(unrelated)
    assert len(small) == len(one.blocks)  # bounded
    assert small.admit(one) == 0  # pushed out
    small.clear()
    assert len(small) == 0
    assert PrefixCache(0).admit(one) == 0  # no capacity: never a hit


# --- pure: residency and eviction -------------------------------------------------------------


def test_a_load_evicts_the_least_recently_used_idle_model_never_a_busy_one():
    config = EmulatorConfig(models=MODELS, memory=5.0, model_size=2.0, load_rate=1e12)
    capacity = Capacity()
    a, b, c = (capacity.runner(name) for name in MODELS)
    for runner in (a, b):
        assert capacity._try_load(runner, config) is not None
    b.last_used = a.last_used - 1  # b was used longest ago
    assert capacity._try_load(c, config) is not None
    assert (a.holds_memory, b.holds_memory, c.holds_memory) == (True, False, True)
    assert b.counters.evictions == 1

    a.admit(config)  # a holds a slot; c is idle
    c.last_used = a.last_used - 1
    assert capacity._try_load(b, config) is not None
    assert (a.holds_memory, c.holds_memory) == (True, False)
    c.admit(config)  # both loaded models busy: the load must wait
    config.memory = 4.0
    assert capacity._try_load(c, config) is not None  # c is loaded already: no wait
    c2 = capacity.runner("c2")
    assert capacity._try_load(c2, config) is None


@pytest.mark.anyio
async def test_a_load_with_every_loaded_model_busy_waits_until_one_is_idle():
    config = EmulatorConfig(models=MODELS, memory=2.0, model_size=2.0, load_rate=1e12)
    capacity = Capacity()
    seat = capacity.seat("a", config)
    assert seat is not None
    await seat.take(arrived=0.0)  # a is loaded and busy
    b = capacity.runner("b")
    loaded_b: list[float] = []

    async def load_b() -> None:
        loaded_b.append(await capacity.load(b, config))

    async with anyio.create_task_group() as group:
        group.start_soon(load_b)
        await anyio.sleep(0.05)
        assert loaded_b == []  # waiting for memory, not failing
        seat.leave()  # a is idle: evicted, and b loads
    assert len(loaded_b) == 1
    assert capacity.runner("a").counters.evictions == 1


def test_preload_and_the_gpu_profile_flags():
    config, _ = parse_args(["--gpu-profile", "rtx3090-llama3.1-8b", "--preload", "a,b"])
    for field, value in GPU_PROFILES["rtx3090-llama3.1-8b"].items():
        assert getattr(config, field) == value
    assert config.preload == ["a", "b"]
    assert config.resident
    assert not parse_args(["--gpu-profile=rtx3090-llama3.1-8b", "--no-prefill-shared"])[
        0
    ].prefill_shared
    flags = [
        "--gpu-profile=rtx3090-llama3.1-8b",
        "--parallel=2",
        "--model-size=7",
        "--model-size=b=3",
    ]
    config, _ = parse_args([*flags, "--memory=10", "--cache-tokens=99", "--keep-alive=-1"])
    assert (config.parallel, config.model_size, config.size_of("B")) == (2, 7.0, 3.0)
    assert (config.memory, config.cache_tokens, config.keep_alive) == (10.0, 99, -1.0)
    default, _ = parse_args([])
    assert not default.resident
    assert (default.prefill_rate, default.cache_tokens, default.model_size) == (0.0, 0, 0.0)


# --- over a real socket -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[LoopbackServer, EmulatorState]]:
    app = create_emulator_app(EmulatorConfig(models=MODELS))
    with LoopbackServer(app) as server:
        yield server, app.state.emulator


def gpu(**changes: object) -> EmulatorConfig:
    """A small fast GPU: 2 GB models loading in 0.2 s, 5 GB of memory, 20,000 tokens/s."""
    knobs: dict[str, object] = {
        "models": MODELS,
        "ttft": 0.0,
        "inter_token": 0.001,
        "tokens": 3,
        "model_size": 2.0,
        "memory": 5.0,
        "load_rate": 10.0,
        "prefill_rate": 20_000.0,
        "cache_tokens": 50_000,
        "preload": [],
    }
    return EmulatorConfig(**(knobs | changes))  # type: ignore[arg-type]


@pytest.fixture
async def client(served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served[0].url, timeout=20) as client:
        yield client


def configure(served, config: EmulatorConfig) -> EmulatorState:
    state = served[1]
    state.config = config
    state.reset()
    return state


async def loaded(client: httpx.AsyncClient) -> list[str]:
    return [entry["name"] for entry in (await client.get("/api/ps")).json()["models"]]


@pytest.mark.anyio
async def test_a_cold_load_then_warm_and_what_ps_reports(served, client):
    configure(served, gpu(preload=["b"]))
    assert await loaded(client) == ["b:latest"]
    cold = (await client.post("/api/chat", json=chat("hi"))).json()
    assert cold["load_duration"] == pytest.approx(0.2e9 + 1e6, abs=0.05e9)  # 2 GB at 10 GB/s
    warm = (await client.post("/api/chat", json=chat("hi again"))).json()
    assert warm["load_duration"] <= 1_000_000
    [first, second] = (await client.get("/api/ps")).json()["models"]
    assert first["name"] == "a:latest"  # used last: expires last, listed first
    assert second["name"] == "b:latest"
    assert first["size"] == first["size_vram"] == 2_000_000_000
    assert first["expires_at"] > second["expires_at"]
    stats = (await client.get("/emulator/stats")).json()
    assert stats["models"]["a:latest"]["cold_loads"] == 1
    assert stats["models"]["b:latest"]["cold_loads"] == 0  # preloaded
    assert stats["loaded"] == ["a:latest", "b:latest"]


@pytest.mark.anyio
async def test_a_full_memory_evicts_the_least_recently_used_model(served, client):
    configure(served, gpu(preload=["a", "b"]))
    await client.post("/api/chat", json=chat("x", model="b"))  # a is now the LRU
    reply = (await client.post("/api/chat", json=chat("x", model="c"))).json()
    assert reply["load_duration"] >= 0.15e9
    assert await loaded(client) == ["c:latest", "b:latest"]
    again = (await client.post("/api/chat", json=chat("x", model="a"))).json()  # evicts b
    assert again["load_duration"] >= 0.15e9
    assert sorted(await loaded(client)) == ["a:latest", "c:latest"]
    stats = (await client.get("/emulator/stats")).json()
    assert stats["models"]["a:latest"]["evictions"] == 1
    assert stats["models"]["b:latest"]["evictions"] == 1
    assert stats["total"]["cold_loads"] == 2
    kinds = [event["kind"] for event in (await client.get("/emulator/events")).json()["events"]]
    assert kinds.count("evict") == 2
    assert kinds.count("load") == 2


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.anyio
async def test_an_idle_model_unloads_when_its_keep_alive_ends(served, client):
    configure(served, gpu(keep_alive=0.3))
    await client.post("/api/chat", json=chat("x"))
    assert await loaded(client) == ["a:latest"]
    with anyio.fail_after(10):
        while await loaded(client):  # noqa: ASYNC110 - the server decides, over HTTP
            await anyio.sleep(0.05)
    again = (await client.post("/api/chat", json=chat("x"))).json()
    assert again["load_duration"] >= 0.15e9  # a cold load again
    stats = (await client.get("/emulator/stats")).json()
    assert stats["models"]["a:latest"]["cold_loads"] == 2


@pytest.mark.anyio
async def test_a_model_larger_than_memory_fails_like_ollama(served, client):
    configure(served, gpu(model_sizes={"c": 9.0}))
    answer = await client.post("/api/chat", json=chat("x", model="c"))
    assert answer.status_code == 500
    assert "requires more system memory" in answer.json()["error"]


@pytest.mark.anyio
async def test_a_repeated_prefix_is_prefilled_faster_and_counted(served, client):
    configure(served, gpu(preload=["a"], prefill_rate=2_000.0))
    history = chat("Tell me about caches. " * 20)
    first = (await client.post("/api/chat", json=history)).json()
    longer = {**history, "messages": [*history["messages"], {"role": "user", "content": "more"}]}
    second = (await client.post("/api/chat", json=longer)).json()
    tokens = tokenize(history).count
    # prompt_eval_count is the whole prompt, as Ollama >= v0.30.1; the duration only the new part
    assert first["prompt_eval_count"] == tokens
    assert second["prompt_eval_count"] == tokenize(longer).count
    assert first["prompt_eval_duration"] == pytest.approx(tokens / 2_000 * 1e9, rel=0.2)
    assert second["prompt_eval_duration"] < first["prompt_eval_duration"] / 5
    body = {**longer, "stream": False}
    openai = await client.post("/v1/chat/completions", json=body)
    usage = openai.json()["usage"]
    assert usage["prompt_tokens"] == tokenize(longer).count
    assert usage["prompt_tokens_details"]["cached_tokens"] >= tokens - BLOCK_TOKENS
    stats = (await client.get("/emulator/stats")).json()
    model = stats["models"]["a:latest"]
    assert model["requests"] == 3
    assert model["prompt_tokens"] == tokens + 2 * tokenize(longer).count
    replay = PrefixCache(50_000)  # the same prompts through a pure cache
    expected = sum(replay.admit(tokenize(prompt)) for prompt in (history, longer, longer))
    assert model["cached_tokens"] == expected
    assert expected >= 2 * (tokens - BLOCK_TOKENS)
    assert 0 < stats["prefix_hit_rate"] < 1
    assert model["busy_seconds"] > 0
    await client.post("/emulator/reset")
    reset = (await client.get("/emulator/stats")).json()
    assert reset["total"]["requests"] == 0
    assert reset["loaded"] == ["a:latest"]  # the preload again


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.anyio
async def test_a_shared_prefill_rate_makes_prompts_prefilled_together_take_longer(served, client):
    configure(served, gpu(preload=["a", "b"], prefill_rate=4_000.0, prefill_shared=True))

    def unique(tag: str, model: str) -> dict[str, object]:
        return {"model": model, "prompt": f"{tag} " + "word " * 1600, "stream": False}

    alone = (await client.post("/api/generate", json=unique("first", "a"))).json()
    together: list[dict[str, object]] = []

    async def one(tag: str, model: str) -> None:
        together.append((await client.post("/api/generate", json=unique(tag, model))).json())

    async with anyio.create_task_group() as group:  # two models, one GPU
        group.start_soon(one, "second", "a")
        group.start_soon(one, "third", "b")
    single = alone["prompt_eval_duration"]
    assert single == pytest.approx(alone["prompt_eval_count"] / 4_000 * 1e9, rel=0.25)
    for reply in together:
        assert reply["prompt_eval_duration"] >= 1.5 * single


@pytest.mark.anyio
async def test_llamacpp_timings_count_only_the_prefilled_tokens(served, client):
    configure(served, gpu(preload=["a"], llamacpp_timings=True))
    body = {**chat("hello there"), "stream": False}
    await client.post("/v1/chat/completions", json=body)
    timings = (await client.post("/v1/chat/completions", json=body)).json()["timings"]
    total = tokenize(body).count
    assert timings["cache_n"] > 0
    assert timings["prompt_n"] + timings["cache_n"] == total
    assert timings["prompt_n"] >= 1
