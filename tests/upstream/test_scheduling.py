"""The routing policy's scores, balance guard, prefix index and residency as pure units."""

from __future__ import annotations

import random
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError

from gateway.metering.metrics import Metrics
from gateway.neutral import GenerationRequest
from gateway.policies import PoolPolicy, SchedulingPolicy
from gateway.settings import Settings
from gateway.upstream.monitor import LoadedModel
from gateway.upstream.pool import UpstreamPool, open_pool
from gateway.upstream.reported import ServerReport
from gateway.upstream.scheduling.prefixes import (
    PrefixIndex,
    SessionIndex,
    prompt_blocks,
    text_blocks,
)
from gateway.upstream.scheduling.residency import (
    DEFAULT_LOAD_RATE,
    LOAD_GRACE,
    MAX_SERVED,
    SERVED_TTL,
    Residency,
    slot_key,
)
from gateway.upstream.scheduling.scheduler import (
    HOLD_MAX_SECONDS,
    HOLD_MIN_SECONDS,
    Scheduler,
    prompt_limit,
)
from gateway.upstream.scheduling.scores import (
    DEFAULT_HOLD_SECONDS,
    has_free_slot,
    imbalanced,
    load_costs,
    pick,
    prefix_costs,
    queue_cost,
    residency_cost,
    server_load,
)
from gateway.upstream.scheduling.ticket import MAX_TICKET_TOKENS, RouteTicket, capped, session_of
from tests.support.metrics import metric_value

MODEL = "qwen3:8b"


def block_hashes(text: str, block_chars: int, limit: int) -> list[int]:
    return text_blocks(text, block_chars, limit).hashes


@dataclass
class FakeServer:
    name: str
    in_flight: int = 0
    tokens_in_flight: int = 0
    prefills: list[int] = field(default_factory=list)
    weight: float = 1.0
    capacity: int = 0
    loaded: list[LoadedModel] | None = None
    loaded_at: float = 0.0
    downs: int = 0
    report: ServerReport | None = None
    extra: dict = field(default_factory=dict)
    #: Requests in flight per model; a model not listed has all of `in_flight`.
    by_model: dict[str, int] = field(default_factory=dict)
    #: What it reports of its own load on `/metrics` (tests/upstream/test_reported.py).
    report: ServerReport | None = None

    def model_in_flight(self, model: str) -> int:
        return self.by_model.get(model, self.in_flight)


def _loaded(*models: str, size: int = 4_000_000_000) -> list[LoadedModel]:
    return [LoadedModel(model, size, size, None) for model in models]


def _chat(*messages: str, model: str = MODEL, **body) -> GenerationRequest:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text}
        for i, text in enumerate(messages)
    ]
    return GenerationRequest("openai", "chat", {"model": model, "messages": turns, **body}, model)


SYSTEM = "You are a careful coding agent. " * 40  # ~1.3 kB, several blocks


# --- scores ---------------------------------------------------------------------------------


def test_load_costs_are_each_servers_work_in_tokens_and_the_wait_for_a_slot():
    servers = [FakeServer("a"), FakeServer("b", in_flight=2, tokens_in_flight=1000)]
    assert load_costs(servers, MODEL) == [0.0, 1000 + 2 * 256]
    full = FakeServer("c", in_flight=2, capacity=2)
    # One request ahead: a slot frees every hold (10 s before one is measured) / 2 slots.
    assert load_costs([full], MODEL) == [2 * 256 + 10 / 2 * 2000]
    assert load_costs([full], MODEL, {"c": 1.0}) == [2 * 256 + 1.0 / 2 * 2000]  # learned
    # Without a gate, the slots are Ollama's per model: another model's requests wait apart.
    mixed = FakeServer("d", in_flight=6, by_model={MODEL: 2, "other": 4})
    assert load_costs([mixed], MODEL) == [6 * 256]
    assert load_costs([mixed], "other") == [6 * 256 + 1 * 2.5 * 2000]


def test_load_costs_are_server_load_and_queue_cost_to_the_bit():
    rng = random.Random(3)  # noqa: S311 - test data, not secrets
    servers = [
        FakeServer(
            f"s{n}",
            in_flight=rng.randint(0, 12),
            tokens_in_flight=rng.randint(0, 50_000),
            weight=rng.choice([0.5, 1.0, 3.0]),
            capacity=rng.choice([0, 0, 2, 8]),
            by_model={MODEL: rng.randint(0, 8)},
            prefills=[rng.randint(0, 9000) for _ in range(rng.randint(0, 4))],
        )
        for n in range(200)
    ]
    holds = {f"s{n}": rng.uniform(0.5, 60) for n in range(0, 200, 3)}
    unrolled = load_costs(servers, MODEL, holds)
    expected = [
        server_load(s) + queue_cost(s, MODEL, holds.get(s.name, DEFAULT_HOLD_SECONDS))
        for s in servers
    ]
    assert unrolled == expected  # exact: the choice compares these totals
    own = [rng.randint(0, 8000) for _ in servers]
    unrolled = load_costs(servers, MODEL, holds, own)
    expected = [
        server_load(s, own[i]) + queue_cost(s, MODEL, holds.get(s.name, DEFAULT_HOLD_SECONDS))
        for i, s in enumerate(servers)
    ]
    assert unrolled == expected
    assert unrolled != load_costs(servers, MODEL, holds)  # the clamp was exercised
    assert any(queue_cost(s, MODEL) > 0 for s in servers)  # the wait was exercised


def test_server_load_counts_tokens_and_requests_per_weight():
    light = FakeServer("a", in_flight=1, tokens_in_flight=100, weight=2.0)
    assert server_load(light) == (100 + 256) / 2


def test_a_long_prompt_being_prefilled_delays_a_newcomer_by_the_newcomers_size_at_most():
    # 6,000 tokens of a moved history being prefilled, and 200 of answers decoding.
    busy = FakeServer("a", in_flight=2, tokens_in_flight=6200, prefills=[6000])
    assert server_load(busy) == 6200 + 2 * 256
    assert server_load(busy, prefill=700) == 900 + 2 * 256  # a turn's tail: shares the GPU
    assert server_load(busy, prefill=9000) == 6200 + 2 * 256  # a longer one waits it all
    idle = FakeServer("b", in_flight=1, tokens_in_flight=700, prefills=[700])
    costs = load_costs([busy, idle], MODEL, prefills=[700, 6700])
    assert costs == [900 + 2 * 256, 700 + 256]


def test_prefix_costs_are_the_prompt_tokens_left_to_prefill():
    assert prefix_costs([0, 400, 800], 800) == [200.0, 100.0, 0.0]
    assert prefix_costs([0, 0], 0) == [0.0, 0.0]


def test_residency_costs_warm_under_unknown_and_a_longer_load_costs_more():
    quick, slow = residency_cost(False, 1.0), residency_cost(False, 60.0)
    assert residency_cost(True, 0) == 0 < quick < slow
    assert 0 < residency_cost(None, 0) < slow


def test_a_free_slot_is_below_the_gate_or_below_ollamas_default_parallel():
    assert has_free_slot(FakeServer("a", in_flight=3), MODEL)
    assert not has_free_slot(FakeServer("a", in_flight=4), MODEL)
    assert has_free_slot(FakeServer("a", in_flight=7, capacity=8), MODEL)
    assert not has_free_slot(FakeServer("a", in_flight=2, capacity=2), MODEL)
    # Ollama's OLLAMA_NUM_PARALLEL counts per model: four of another model leave room.
    busy = FakeServer("a", in_flight=6, by_model={MODEL: 2, "other": 4})
    assert has_free_slot(busy, MODEL)
    assert not has_free_slot(busy, "other")
    # A gate counts the server's requests, whatever their models.
    assert not has_free_slot(FakeServer("a", in_flight=2, capacity=2, by_model={"x": 2}), MODEL)


def test_the_balance_guard_needs_both_the_absolute_and_the_relative_gap():
    def servers(*loads: int) -> list[FakeServer]:
        return [FakeServer(str(i), in_flight=n) for i, n in enumerate(loads)]

    assert imbalanced(servers(6, 1), 4, 1.5)  # 5 more, and 6x
    assert not imbalanced(servers(5, 1), 4, 1.5)  # only 4 more
    assert not imbalanced(servers(20, 15), 4, 1.5)  # 5 more, but only 1.33x
    assert imbalanced(servers(23, 15), 4, 1.5)


def test_pick_takes_the_cheapest_weighted_sum_and_names_the_term_that_decided():
    # Server 0 holds the prompt's prefix (no prefill left) but is busier.
    terms = {"prefix": [0.0, 1000.0], "load": [600.0, 0.0]}
    assert pick(terms, {"prefix": 1, "load": 1}) == (0, "prefix")
    assert pick(terms, {"prefix": 1, "load": 2}) == (1, "load")
    assert pick(terms, {"prefix": 0, "load": 1}) == (1, "load")  # weight 0: off
    assert pick({"load": [1.0, 1.0]}, {"load": 2}) == (0, "load")  # a tie
    assert pick({"load": [1.0]}, {"load": 2}) == (0, "only")


def test_pick_picks_the_first_cheapest_and_the_first_runner_up_among_ties():
    # Ties on the best and on the runner-up: the first of each counts.
    terms = {"load": [5.0, 1.0, 3.0, 1.0, 3.0], "prefix": [0.0, 2.0, 0.0, 2.0, 0.0]}
    assert pick(terms, {"load": 1, "prefix": 1}) == (1, "load")  # 3.0 vs 3.0 (index 2)
    # Best last, runner-up before it: the term that saves most against index 0.
    terms = {"load": [4.0, 9.0, 1.0], "prefix": [0.0, 0.0, 2.0]}
    assert pick(terms, {"load": 1, "prefix": 1}) == (2, "load")
    assert pick({"prefix": [0.0, 8.0, 0.0]}, {"prefix": 1}) == (0, "load")  # tied best


def test_a_prefix_every_server_holds_decides_nothing_so_load_spreads_the_conversations():
    """Two conversations behind one shared system prompt go to two servers, each staying."""
    scheduler, _ = _scheduler()
    servers = [FakeServer("a"), FakeServer("b")]
    first = _choose(scheduler, servers, RouteTicket(MODEL, request=_chat(SYSTEM + "one")))
    first.in_flight, first.tokens_in_flight = 1, 400
    ticket = RouteTicket(MODEL, request=_chat(SYSTEM + "two"))
    second = _choose(scheduler, servers, ticket)
    assert second is not first  # not piled behind the first for a prefix both could cache
    second.in_flight, second.tokens_in_flight = 1, 400
    for server, text in ((first, "one"), (second, "two")):
        ticket = RouteTicket(MODEL, request=_chat(SYSTEM + text, "ok", "more"))
        assert _choose(scheduler, servers, ticket) is server
        assert ticket.reason == "prefix"


# --- prompt blocks and the prefix index -------------------------------------------------------


def test_block_hashes_are_chained_so_a_block_stands_for_its_whole_prefix():
    one = block_hashes("a" * 64 + "b" * 64, 64, 100)
    other = block_hashes("c" * 64 + "b" * 64, 64, 100)
    assert len(one) == 2
    assert one[1] != other[1]  # same second block, different prefix
    assert block_hashes("a" * 64 + "b" * 64 + "tail", 64, 100) == one  # partial block left out
    assert block_hashes("a" * 640, 64, 3) == block_hashes("a" * 192, 64, 3)  # at most `limit`
    assert text_blocks("a" * 130, 64, 100).ends == [64, 128]


def test_message_blocks_group_whole_messages_and_the_next_turn_repeats_them():
    first = prompt_blocks(_chat(SYSTEM, "ok"), 64, 100)
    second = prompt_blocks(_chat(SYSTEM, "ok", "and now? " * 10), 64, 100)
    assert first.hashes == [second.hashes[0]]  # the system message, 1.3 kB: one block
    assert len(second.hashes) == 2  # "ok" is short: it joins the next message's block
    assert second.ends == [len(SYSTEM), second.chars]
    swapped = prompt_blocks(_chat("ok" * 40, SYSTEM), 64, 100)
    assert swapped.hashes[-1] != second.hashes[-1]
    assert prompt_blocks(_chat(SYSTEM, "ok", "x" * 100), 64, 1).hashes == first.hashes
    roles = _chat(SYSTEM)
    roles.body["messages"][0]["role"] = "system"
    assert prompt_blocks(roles, 64, 100).hashes != first.hashes  # the role counts


def test_every_request_shape_has_its_prompt_blocks():
    parts = _chat("x")
    parts.body["messages"][0]["content"] = [{"type": "text", "text": SYSTEM}]
    assert prompt_blocks(parts, 64, 100).chars == len(SYSTEM)
    generate = GenerationRequest("ollama", "generate", {"prompt": SYSTEM, "system": "s"}, MODEL)
    assert len(prompt_blocks(generate, 64, 100).hashes) == (len(SYSTEM) + 2) // 64
    embed = GenerationRequest("openai", "embed", {"input": SYSTEM}, MODEL)
    assert prompt_blocks(embed, 64, 100).hashes == []
    calls = _chat(SYSTEM, "")
    calls.body["messages"][1]["tool_calls"] = [{"function": {"name": "a"}}]
    other = _chat(SYSTEM, "")
    other.body["messages"][1]["tool_calls"] = [{"function": {"name": "b"}}]
    calls.body["messages"].append({"role": "tool", "content": "y" * 100})
    other.body["messages"].append({"role": "tool", "content": "y" * 100})
    assert prompt_blocks(calls, 64, 100).hashes[-1] != prompt_blocks(other, 64, 100).hashes[-1]


@pytest.mark.parametrize(
    ("one", "two"),
    [
        # OpenAI's shape (the Anthropic and Responses surfaces' translation): id, name, arguments
        (
            {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "a", "arguments": "{}"}},
        ),
        (
            {"id": "call_1", "function": {"name": "a", "arguments": '{"path": "x"}'}},
            {"id": "call_1", "function": {"name": "a", "arguments": '{"path": "y"}'}},
        ),
        # Ollama's: arguments an object
        (
            {"function": {"name": "a", "arguments": {"p": 1}}},
            {"function": {"name": "a", "arguments": {"p": 2}}},
        ),
        # odd shapes a client may send: still hashable, still told apart
        (
            {"id": ["x"], "function": {"name": "a", "arguments": "{}"}},
            {"id": ["y"], "function": {"name": "a", "arguments": "{}"}},
        ),
        ("call", ["call"]),
    ],
)
def test_tool_calls_that_differ_give_different_chains(one: object, two: object):
    chains = []
    for call in (one, two):
        request = _chat(SYSTEM, "")
        request.body["messages"][1]["tool_calls"] = [call]
        request.body["messages"].append({"role": "tool", "content": "y" * 100})
        chains.append(prompt_blocks(request, 64, 100).hashes)
    assert chains[0][-1] != chains[1][-1]
    again = _chat(SYSTEM, "")
    again.body["messages"][1]["tool_calls"] = [one]
    again.body["messages"].append({"role": "tool", "content": "y" * 100})
    assert prompt_blocks(again, 64, 100).hashes == chains[0]


def test_the_index_finds_the_longest_match_per_server():
    index = PrefixIndex(1000)
    history = block_hashes(SYSTEM, 64, 1000)
    index.record(history[:10], "a")
    index.record(history[:4], "b")
    assert index.match(history, ["a", "b", "c"]) == {"a": 10, "b": 4}
    assert index.match(block_hashes("other " * 100, 64, 100), ["a", "b"]) == {}
    index.record(history, "c")
    assert index.match(history, ["a", "c"]) == {"a": 10, "c": len(history)}


def _chain(rng: random.Random, prompts: list[list[int]]) -> list[int]:
    """A new prompt's chained hashes: a random prefix of an earlier prompt, then new blocks."""
    base = rng.choice(prompts) if prompts and rng.random() < 0.8 else []
    hashes = base[: rng.randint(0, len(base))]
    for _ in range(rng.randint(0 if hashes else 1, 40)):
        hashes.append(hash((hashes[-1] if hashes else 0, rng.random())))
    return hashes


def _scanned(index: PrefixIndex, hashes: list[int], servers: list[str]) -> dict[str, int]:
    """The match as a linear scan of every block (what `PrefixIndex.match` did before)."""
    found = {}
    for server in servers:
        bit = index._bits.get(server, 0)
        count = 0
        while count < len(hashes) and index._blocks.get(hashes[count], 0) & bit:
            count += 1
        if count:
            found[server] = count
    return found


@pytest.mark.parametrize("seed", range(5))
def test_the_binary_search_match_equals_a_linear_scan_on_random_chains(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    index = PrefixIndex(300)  # small: the LRU evicts all along
    servers = ["a", "b", "c", "d"]
    prompts: list[list[int]] = []
    matched = 0
    for _ in range(600):
        prompt = _chain(rng, prompts)
        found = index.match(prompt, servers)
        assert found == _scanned(index, prompt, servers)
        matched += bool(found)
        index.record(prompt, rng.choice(servers))
        prompts.append(prompt)
        if rng.random() < 0.01:
            index.forget(rng.choice(servers))
    assert matched > 100  # the prompts shared prefixes: the search had work to do


def test_the_index_stays_bounded_under_a_flood_of_unique_prompts():
    index = PrefixIndex(500)
    keep = block_hashes(SYSTEM, 64, 1000)
    index.record(keep, "a")
    for n in range(2000):
        index.record(block_hashes(f"unique prompt {n} " * 40, 64, 1000), "b")
        assert len(index) <= 500
    assert len(index) == 500
    # What was sent longest ago went first: the old prompt is gone.
    assert index.match(keep, ["a"]) == {}
    size = sys.getsizeof(index._blocks)
    assert size < 200 * 500  # bytes: bounded with the entry count, not the traffic


def test_an_evicted_prompt_leaves_its_prefix_not_a_hole():
    index = PrefixIndex(10)
    prompt = block_hashes(SYSTEM, 64, 8)
    index.record(prompt, "a")
    index.record(block_hashes("other " * 100, 64, 4), "b")  # 12 > 10: two of `prompt` go
    assert len(index) == 10
    assert index.match(prompt, ["a"]) == {"a": 6}  # its first six, not a broken chain


def test_recently_sent_blocks_survive_the_lru_and_forget_drops_one_server_only():
    index = PrefixIndex(100)
    hot = block_hashes(SYSTEM, 64, 1000)[:10]
    index.record(hot, "a")
    index.record(hot, "b")
    for n in range(50):
        index.record(block_hashes(f"cold {n} " * 20, 64, 2), "c")
        index.record(hot, "a")  # kept fresh
    assert index.match(hot, ["a", "b"]) == {"a": 10, "b": 10}
    assert index.forget("a") == 10
    assert index.match(hot, ["a", "b"]) == {"b": 10}
    assert index.forget("nobody") == 0


def test_the_session_index_is_bounded_and_forgets_a_server():
    sessions = SessionIndex(2)
    sessions.record(1, "a")
    sessions.record(2, "b")
    sessions.record(3, "a")
    assert len(sessions) == 2
    assert sessions.get(1) is None
    sessions.forget("a")
    assert sessions.get(3) is None
    assert sessions.get(2) == "b"


def test_the_session_key_comes_from_the_header_then_the_body():
    assert session_of({}, "abc") == session_of({"user": "zzz"}, "abc")
    assert session_of({"prompt_cache_key": "k"}, None) == session_of({"user": "k"}, None)
    assert session_of({"user": "u"}, None) != session_of({"user": "v"}, None)
    assert session_of({"metadata": {"user_id": "m"}}, None) == session_of({"user": "m"}, None)
    assert session_of({"user": 5}, None) is None
    assert session_of({}, None) is None


def test_a_keys_prompts_and_sessions_never_match_another_keys():
    """The index is per key: one key cannot learn, or steer by, another key's prompts."""
    request = _chat(SYSTEM, "ok", "more")
    mine = prompt_blocks(request, 256, 100, scope="key-a")
    theirs = prompt_blocks(request, 256, 100, scope="key-b")
    assert mine.hashes
    assert theirs.hashes
    assert not set(mine.hashes) & set(theirs.hashes)
    assert prompt_blocks(request, 256, 100, scope="key-a").hashes == mine.hashes
    assert session_of({"user": "u"}, None, "key-a") != session_of({"user": "u"}, None, "key-b")
    scheduler, _ = _scheduler()
    servers = [FakeServer("a"), FakeServer("b")]
    first = _choose(scheduler, servers, RouteTicket(MODEL, request=_chat(SYSTEM), scope="key-b"))
    ticket = RouteTicket(MODEL, request=_chat(SYSTEM, "ok", "more"), scope="key-a")
    _choose(scheduler, servers, ticket)
    assert ticket.reason != "prefix"
    assert ticket.prefix_tokens == 0
    ticket = RouteTicket(MODEL, request=_chat(SYSTEM, "ok", "more"), scope="key-b")
    assert _choose(scheduler, servers, ticket) is first
    assert ticket.reason == "prefix"


def test_one_prompt_takes_at_most_a_sixteenth_of_the_index():
    assert prompt_limit(32768) == 512
    assert prompt_limit(1024) == 64
    assert prompt_limit(4) == 1
    scheduler, _ = _scheduler()
    huge = GenerationRequest(
        "ollama", "generate", {"model": MODEL, "prompt": "x" * 10_000_000}, MODEL
    )
    ticket = RouteTicket(MODEL, request=huge)
    _choose(scheduler, [FakeServer("a"), FakeServer("b")], ticket)
    assert len(ticket.blocks(1024, prompt_limit(32768)).hashes) <= 512


def test_a_ticket_counts_at_most_its_cap_of_tokens():
    assert capped(10**9) == MAX_TICKET_TOKENS
    assert capped(100) == 100


def test_the_ticket_hashes_the_prompt_once_and_only_when_asked():
    ticket = RouteTicket(MODEL, request=_chat(SYSTEM))
    assert ticket._blocks is None
    first = ticket.blocks(64, 100)
    assert first.hashes
    assert ticket.blocks(64, 100) is first


# --- residency -----------------------------------------------------------------------------


def test_residency_from_ps_then_from_what_was_served_since():
    residency = Residency()
    server = FakeServer("a", loaded=_loaded("qwen3:8b", "llama3:latest"), loaded_at=100.0)
    assert residency.state(server, "qwen3:8b", now=101) is True
    assert residency.state(server, "llama3", now=101) is True  # the implicit :latest
    assert residency.state(server, "gemma3:1b", now=101) is False
    residency.served("a", "gemma3:1b", now=99.0)  # before that /api/ps: it was unloaded since
    assert residency.state(server, "gemma3:1b", now=101) is False
    residency.served("a", "gemma3:1b", now=100.5)  # after it: loaded now
    assert residency.state(server, "gemma3:1b", now=101) is True


def test_residency_without_ps_is_what_was_served_within_the_ttl_else_unknown():
    residency = Residency()
    server = FakeServer("vllm:8000")
    assert residency.state(server, MODEL, now=10) is None
    residency.served("vllm:8000", MODEL, now=10)
    assert residency.state(server, MODEL, now=10 + SERVED_TTL - 1) is True
    assert residency.state(server, MODEL, now=10 + SERVED_TTL + 1) is None
    residency.served("vllm:8000", MODEL, now=10)
    residency.forget("vllm:8000")
    assert residency.state(server, MODEL, now=11) is None


def test_the_load_rate_is_learned_from_load_duration():
    residency = Residency()
    assert residency.rate("a") == DEFAULT_LOAD_RATE
    residency.learn("a", 4_000_000_000, 2_000_000_000)  # 4 GB in 2 s
    assert residency.rate("a") == 2e9
    residency.learn("a", 4_000_000_000, 1_000_000)  # 1 ms: no load, not a sample
    assert residency.rate("a") == 2e9
    residency.learn("a", 4_000_000_000, 4_000_000_000)  # 1 GB/s folds in
    assert 1e9 < residency.rate("a") < 2e9
    assert residency.load_seconds("a", None) > 0
    warm = FakeServer("b", loaded=_loaded(MODEL, size=123))
    assert residency.size([FakeServer("a"), warm], MODEL) == 123


# --- the scheduler -------------------------------------------------------------------------


def _scheduler(mode: str = "scored", **changes) -> tuple[Scheduler, Metrics]:
    metrics = Metrics()
    policy = SchedulingPolicy(mode=mode, prefix_block_chars=64, **changes)  # type: ignore[arg-type]
    return Scheduler(policy, metrics), metrics


def _choose(scheduler: Scheduler, servers: list[FakeServer], ticket: RouteTicket) -> FakeServer:
    order, reason = scheduler.order(list(servers), ticket)
    scheduler.chosen(order[0], ticket, reason)
    return order[0]


def test_scored_sends_the_next_turn_where_the_conversation_went():
    scheduler, metrics = _scheduler()
    servers = [FakeServer("a"), FakeServer("b"), FakeServer("c")]
    first = _choose(scheduler, servers, RouteTicket(MODEL, request=_chat(SYSTEM)))
    for _ in range(5):
        ticket = RouteTicket(MODEL, request=_chat(SYSTEM, "ok", "more"))
        assert _choose(scheduler, servers, ticket) is first
        assert ticket.reason == "prefix"
        assert ticket.prefix_tokens > 0
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, "gateway_route_decisions_total", reason="prefix") == 5


def test_scored_prefers_the_server_holding_the_model_and_never_starts_a_cold_load_beside_room():
    scheduler, metrics = _scheduler()
    warm = FakeServer("warm", loaded=_loaded(MODEL), in_flight=3)
    cold = FakeServer("cold", loaded=[])
    ticket = RouteTicket(MODEL)
    assert _choose(scheduler, [cold, warm], ticket) is warm
    assert ticket.reason == "residency"
    warm.in_flight = 4  # full: one more waits for a slot (2.5 s), less than the cold load (4 s)
    assert _choose(scheduler, [cold, warm], RouteTicket(MODEL)) is warm
    warm.in_flight = 6  # three would wait: the cold load costs less now
    assert _choose(scheduler, [cold, warm], RouteTicket(MODEL)) is cold
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, "gateway_route_cold_loads_total", upstream="cold") == 1


def test_a_full_warm_server_keeps_its_conversation_until_its_queue_outweighs_the_history():
    # The routing benchmark's `agents` near saturation: the session's server has its slots
    # taken, another has room. Waiting a slot there (answers of half a second) is cheaper than
    # prefilling the whole history elsewhere, and evicting other sessions from that cache.
    scheduler, _ = _scheduler(balance_abs_threshold=1000)  # the guard has its own test
    for name in ("home", "other"):
        for _ in range(50):
            scheduler.held(name, 0.5)
    history = (SYSTEM, "tool output " * 2000, "ok")  # about 6,300 tokens
    home = FakeServer("home", loaded=_loaded(MODEL))
    other = FakeServer("other", loaded=_loaded(MODEL), in_flight=1)
    cold = FakeServer("cold", loaded=[])
    scheduler.chosen(home, RouteTicket(MODEL, request=_chat(*history)), "load")
    home.in_flight = 6  # 4 running, 2 waiting: 2 x 0.5 s / 4 slots = 0.25 s of wait
    ticket = RouteTicket(MODEL, request=_chat(*history, "more"))
    assert _choose(scheduler, [cold, other, home], ticket) is home
    assert ticket.reason == "prefix"
    home.in_flight = 24  # 20 waiting: 2.5 s, longer than prefilling the history elsewhere
    ticket = RouteTicket(MODEL, request=_chat(*history, "more"))
    assert _choose(scheduler, [cold, other, home], ticket) is other  # never the cold one
    assert ticket.reason == "residency"  # the warm servers' load decided (the operations table)


def test_a_load_under_way_is_joined_not_started_again_on_another_server():
    scheduler, metrics = _scheduler()
    a = FakeServer("a", loaded=_loaded("other:1b", size=8_000_000_000), loaded_at=0.0)
    b = FakeServer("b", loaded=_loaded("other:2b", size=8_000_000_000), loaded_at=0.0)
    first = _choose(scheduler, [a, b], RouteTicket(MODEL))
    assert first.loaded is not None
    assert MODEL not in [m.model for m in first.loaded]
    first.in_flight += 2  # it loads; another request arrives before /api/ps lists the model
    other = b if first is a else a
    for _ in range(3):
        assert _choose(scheduler, [a, b], RouteTicket(MODEL)) is first
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, "gateway_route_cold_loads_total", upstream=first.name) == 1
    assert not metric_value(text, "gateway_route_cold_loads_total", upstream=other.name)
    scheduler.residency.served(first.name, MODEL)  # its first chunk: loaded, no longer loading
    assert scheduler.residency.loading(first.name, MODEL) is None


def test_a_load_under_way_counts_its_time_left_and_is_dropped_after_its_grace():
    residency = Residency()
    assert residency.loading("a", MODEL, now=0.0) is None
    residency.started("a", MODEL, 4.0, now=10.0)
    assert residency.loading("a", MODEL, now=11.0) == 3.0
    assert residency.loading("a", MODEL, now=15.0) == 0.0  # late: still under way
    assert residency.loading("a", MODEL, now=10.0 + LOAD_GRACE * 4.0 + 0.1) is None
    residency.started("a", MODEL, 4.0, now=20.0)
    residency.forget("a")
    assert residency.loading("a", MODEL, now=21.0) is None
    for i in range(3 * MAX_SERVED):
        residency.started("a", f"Model-{i}", 100.0, now=float(i))
    assert len(residency._loading) <= MAX_SERVED


def test_the_slot_hold_is_learned_per_server_and_short_answers_make_queueing_cheap():
    scheduler, _ = _scheduler()
    for _ in range(50):
        scheduler.held("warm", 0.8)  # 96-token answers at 120 tokens/s
    assert scheduler.holds["warm"] == pytest.approx(0.8, rel=0.01)
    warm = FakeServer("warm", loaded=_loaded(MODEL), in_flight=6)  # two wait for a slot
    cold = FakeServer("cold", loaded=[])
    ticket = RouteTicket(MODEL)
    assert _choose(scheduler, [cold, warm], ticket) is warm  # 0.4 s beats a load
    assert ticket.reason == "balance_guard"  # 6 to 0 in flight, but the guard counts the load
    unlearned, _ = _scheduler()
    assert _choose(unlearned, [cold, warm], RouteTicket(MODEL)) is cold  # 5 s did not
    least, _ = _scheduler("least_in_flight")
    least.held("warm", 0.8)
    assert least.holds == {}  # only the scored policy reads it


def test_one_request_moves_the_learned_hold_by_a_tenth_of_its_bounds_at_most():
    scheduler, _ = _scheduler()
    for _ in range(200):
        scheduler.held("a", 0.0)  # a flood of one-token answers
    assert scheduler.holds["a"] == pytest.approx(HOLD_MIN_SECONDS)
    scheduler.held("a", 3600.0)  # one hour-long answer
    assert scheduler.holds["a"] <= HOLD_MIN_SECONDS + 0.1 * HOLD_MAX_SECONDS


def test_a_made_up_model_or_a_failed_load_leaves_no_load_under_way():
    scheduler, _ = _scheduler()
    cold = FakeServer("cold", loaded=[])
    scheduler.chosen(cold, RouteTicket("made-up"), "load", catalogued=False)
    assert scheduler.residency.loading("cold", "made-up") is None
    scheduler.chosen(cold, RouteTicket(MODEL), "load")
    assert scheduler.residency.loading("cold", MODEL) is not None
    assert scheduler.residency.loading("cold", MODEL.upper()) is not None  # one spelling
    scheduler.residency.failed("cold", MODEL)
    assert scheduler.residency.loading("cold", MODEL) is None


def test_the_balance_guard_overrides_affinity():
    scheduler, _ = _scheduler()
    servers = [FakeServer("a"), FakeServer("b")]
    first = _choose(scheduler, servers, RouteTicket(MODEL, request=_chat(SYSTEM)))
    other = next(s for s in servers if s is not first)
    first.in_flight = 6
    ticket = RouteTicket(MODEL, request=_chat(SYSTEM, "ok", "more"))
    assert _choose(scheduler, servers, ticket) is other
    assert ticket.reason == "balance_guard"


def test_a_session_key_keeps_short_prompts_together_when_no_prefix_matches():
    scheduler, _ = _scheduler()
    servers = [FakeServer("a"), FakeServer("b"), FakeServer("c")]
    first = _choose(scheduler, servers, RouteTicket(MODEL, session=7, request=_chat("hi")))
    for _ in range(5):
        ticket = RouteTicket(MODEL, session=7, request=_chat("hi", "yo", "?"))
        assert _choose(scheduler, servers, ticket) is first
        assert ticket.reason == "session"


def test_a_server_seen_down_loses_its_prefixes():
    scheduler, _ = _scheduler()
    servers = [FakeServer("a"), FakeServer("b")]
    first = _choose(scheduler, servers, RouteTicket(MODEL, request=_chat(SYSTEM)))
    first.downs += 1
    first.in_flight = 1  # a little busier: without its prefixes it loses on load
    ticket = RouteTicket(MODEL, request=_chat(SYSTEM, "ok", "more"))
    assert _choose(scheduler, servers, ticket) is not first
    assert ticket.reason == "load"


@pytest.mark.parametrize("off", ["prefix", "load", "residency"])
def test_each_score_can_be_turned_off(off):
    weights = tuple((name, 0.0 if name == off else 1.0) for name in ("prefix", "load", "residency"))
    scheduler, _ = _scheduler(weights=weights)
    warm = FakeServer("warm", loaded=_loaded(MODEL), in_flight=2)
    cold = FakeServer("cold", loaded=[])
    seen = set()
    for _ in range(4):
        ticket = RouteTicket(MODEL, request=_chat(SYSTEM))
        seen.add(_choose(scheduler, [warm, cold], ticket).name)
        assert ticket.reason != off
    if off == "residency":  # load alone then prefers the idle cold one
        assert "cold" in seen
    else:
        assert seen == {"warm"}


def test_least_in_flight_and_round_robin_orders():
    scheduler, _ = _scheduler("least_in_flight")
    servers = [FakeServer("a", in_flight=2), FakeServer("b", in_flight=0, weight=1)]
    servers.append(FakeServer("c", in_flight=2, weight=4))
    order, reason = scheduler.order(list(servers), RouteTicket(MODEL))
    assert [s.name for s in order] == ["b", "c", "a"]
    assert reason == "least_in_flight"
    ticket = RouteTicket(MODEL, request=_chat(SYSTEM))
    scheduler.chosen(order[0], ticket, reason)
    assert ticket._blocks is None  # the default policy never renders the prompt
    robin, _ = _scheduler("round_robin")
    firsts = [robin.order(list(servers), RouteTicket(MODEL))[0][0].name for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]


# --- settings ------------------------------------------------------------------------------


def test_routing_scores_parse_and_bad_ones_are_refused_naming_the_variable():
    settings = Settings(_env_file=None, routing="scored", routing_scores="prefix=1, load=0")
    assert SchedulingPolicy.of(settings).weights == (("prefix", 1.0), ("load", 0.0))
    assert SchedulingPolicy.of(settings).mode == "scored"
    for bad in ("prefix", "prefix=x", "kv=1", "load=-1"):
        with pytest.raises(ValidationError, match="GATEWAY_ROUTING_SCORES"):
            Settings(_env_file=None, routing_scores=bad)
    with pytest.raises(ValidationError, match="GATEWAY_ROUTING must be one of least_in_flight"):
        Settings(_env_file=None, routing="fastest")
    assert Settings(_env_file=None).routing == "scored"


def test_the_metrics_are_exposed():
    scheduler, metrics = _scheduler()
    _choose(
        scheduler, [FakeServer("a"), FakeServer("b")], RouteTicket(MODEL, request=_chat(SYSTEM))
    )
    text = generate_latest(metrics.registry).decode()
    assert metric_value(text, "gateway_route_prefix_hit_tokens_count") == 1
    assert "gateway_route_decisions_total" in text


def test_the_served_table_stays_bounded_however_many_names_a_client_varies():
    residency = Residency()
    for i in range(3 * MAX_SERVED):
        residency.served("a:1", f"Model-{i}", now=float(i))
    assert len(residency._served) <= MAX_SERVED
    assert residency.state(FakeServer("a:1"), f"Model-{3 * MAX_SERVED - 1}", now=3.0 * MAX_SERVED)


@pytest.mark.anyio
async def test_a_failure_one_key_may_have_caused_leaves_the_routing_state_alone():
    """Only the upstream's own failure (or one that opens its circuit) drops what it was sent."""
    async with AsyncExitStack() as stack:
        pool = await _scored_pool(stack)
        ticket = RouteTicket(MODEL, request=_chat(SYSTEM), scope="k")
        upstream = pool.choose(MODEL, set(), ticket=ticket)
        assert upstream is not None
        assert upstream.models_in_flight == {MODEL: 1}
        pool.finished(upstream, True, ticket=ticket)
        assert upstream.models_in_flight == {}  # no entry left behind at 0
        spelled = RouteTicket("Qwen3", scope="k")  # one model, however a client spells it
        chosen = pool.choose("Qwen3", set(), ticket=spelled)
        assert chosen is not None
        assert chosen.model_in_flight("qwen3:latest") == chosen.model_in_flight("qwen3") == 1
        pool.finished(chosen, True, ticket=spelled)
        assert chosen.models_in_flight == {}
        noted = _noted(pool, ticket)
        assert noted == {upstream.name}
        busy = pool.choose(MODEL, set(), ticket=ticket)
        assert busy is upstream
        pool.finished(upstream, False, "some-key", ticket=ticket)  # blamed on a key
        assert _noted(pool, ticket) == {upstream.name}
        again = pool.choose(MODEL, set(), ticket=ticket)
        assert again is upstream
        pool.finished(upstream, False, None, ticket=ticket)  # the upstream's own fault
        assert _noted(pool, ticket) == set()


async def _scored_pool(stack: AsyncExitStack) -> UpstreamPool:
    """A `scored` pool of two upstreams that are never reached (its choices are pure CPU)."""
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    settings = Settings(upstreams=[{"url": url} for url in urls], routing="scored")
    transport = httpx.MockTransport(lambda _: httpx.Response(500))
    return await open_pool(PoolPolicy.of(settings), Metrics(), stack, transport)


def _noted(pool: UpstreamPool, ticket: RouteTicket) -> set[str]:
    policy = pool.scheduler.policy
    blocks = ticket.blocks(policy.prefix_block_chars, prompt_limit(policy.prefix_blocks))
    found = pool.scheduler.prefixes.match(blocks.hashes, [u.name for u in pool.upstreams])
    return {name for name, count in found.items() if count}


@pytest.mark.anyio
async def test_a_request_weighs_its_prompt_until_its_first_chunk_then_its_output_only():
    async with AsyncExitStack() as stack:
        pool = await _scored_pool(stack)
        ticket = RouteTicket(MODEL, tokens=6048, output=48, request=_chat(SYSTEM), scope="k")
        upstream = pool.choose(MODEL, set(), ticket=ticket)
        assert upstream is not None
        assert upstream.tokens_in_flight == 6048  # nothing of it cached there yet
        assert upstream.prefills == [6000]
        pool.answering(upstream, MODEL, ticket)  # prefilled: a newcomer waits on its answer only
        assert upstream.tokens_in_flight == 48
        assert upstream.prefills == []
        pool.finished(upstream, True, ticket=ticket)
        assert upstream.tokens_in_flight == 0
        short = RouteTicket(MODEL, tokens=30, output=48, scope="k")  # less work than its output
        upstream = pool.choose(MODEL, set(), ticket=short)
        assert upstream is not None
        pool.answering(upstream, MODEL, short)
        pool.finished(upstream, True, ticket=short)
        assert upstream.tokens_in_flight == 0  # never below what it added
        failed = RouteTicket(MODEL, tokens=500, output=48, scope="k")
        upstream = pool.choose(MODEL, set(), ticket=failed)
        assert upstream is not None
        pool.finished(upstream, False, ticket=failed)  # never answered: its prefill ends too
        assert (upstream.tokens_in_flight, upstream.prefills) == (0, [])


@pytest.mark.parametrize(
    "spelling",
    [
        "ALPHA",
        " alpha ",
        "alpha:latest",
        "library/alpha",
        "registry.ollama.ai/library/Alpha:latest",
        "https://registry.ollama.ai/library/alpha",
    ],
)
def test_every_spelling_ollama_resolves_to_a_loaded_model_is_warm(spelling):
    # A client's spelling must not make a warm server look cold (a cold load, and an eviction
    # of another key's model) nor a full one look free (found by the review of this policy).
    residency = Residency()
    warm = FakeServer("warm", loaded=_loaded("alpha:latest"), loaded_at=time.monotonic())
    assert residency.state(warm, spelling) is True
    assert residency.size([warm], spelling) == 4_000_000_000
    assert slot_key(spelling) == slot_key("alpha") == "alpha:latest"
    answered = FakeServer("answered", loaded=[], loaded_at=0.0)
    residency.served("answered", spelling)
    assert residency.state(answered, "alpha") is True


@pytest.mark.parametrize("other", ["alpha:7b", "someone/alpha", "alphabet", "hf.co/x/alpha"])
def test_other_models_keep_their_own_name(other):
    assert slot_key(other) != slot_key("alpha")
    residency = Residency()
    warm = FakeServer("warm", loaded=_loaded("alpha:latest"), loaded_at=time.monotonic())
    assert residency.state(warm, other) is False
