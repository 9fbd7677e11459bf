"""The benchmark's pure parts: rows against their baselines, the targets, SSE chunk counting.

Fast: no process is started. The benchmark itself is `python -m benchmarks.gateway`
(docs/performance.md).
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gateway import (
    SURFACES,
    Proxy,
    _baseline_gateway,
    _surfaces,
    api_targets,
    build_parser,
    least_cpu,
    tree_surfaces,
)
from benchmarks.measure import summarise
from benchmarks.report import add_relative, baseline_of, check_targets, find_regressions
from benchmarks.servers import Target
from benchmarks.stream import Reader, Spec
from gateway.api.anthropic.codec import MessagesCodec
from gateway.api.openai.codec import CompletionCodec
from gateway.api.responses.codec import ResponsesCodec
from gateway.neutral import Chunk, GenerationRequest
from gateway.testing.emulator.dialect import Piece, Summary
from gateway.testing.emulator.openai import ChatCompletionDialect
from gateway.testing.emulator.openai_request import OpenAIAsk
from gateway.testing.emulator.wire import encode_json


def _row(
    target: str,
    n: int,
    *,
    ttft: float,
    chunks: float,
    baseline: str | None = None,
    legacy: bool = False,
    cpu: float | None = None,
    tokens: float = 0.0,
) -> dict[str, Any]:
    """A sweep row as `benchmarks.measure.summarise` makes it; `legacy`: without `baseline`
    (old)."""
    row: dict[str, Any] = {
        "target": target,
        "concurrency": n,
        "ttft_ms": {"p50": ttft, "p95": ttft + 1, "p99": ttft + 2},
        "chunks_per_second": chunks,
        "tokens_per_second": tokens,
        "requests_per_second": chunks / 65,
        "proxy_cpu_ms_per_request": cpu,
    }
    if not legacy:
        row["baseline"] = baseline
    return row


def test_each_gateway_row_is_compared_with_its_own_baseline() -> None:
    rows = [
        _row("direct", 16, ttft=50.0, chunks=1000.0, baseline=None),
        _row("gateway", 16, ttft=51.0, chunks=990.0, baseline="direct"),
        _row("direct-chat", 16, ttft=60.0, chunks=2000.0, baseline=None),
        _row("gw-chat", 16, ttft=62.0, chunks=1900.0, baseline="direct-chat"),
        _row("direct-sse", 16, ttft=70.0, chunks=500.0, baseline=None),
        _row("gw-sse", 16, ttft=73.5, chunks=400.0, baseline="direct-sse"),
    ]
    add_relative(rows)
    by = {row["target"]: row for row in rows}
    assert by["gateway"]["added_ttft_ms"] == {"p50": 1.0, "p95": 1.0, "p99": 1.0}
    assert by["gateway"]["chunks_vs_direct"] == pytest.approx(0.99)
    assert by["gw-chat"]["added_ttft_ms"]["p50"] == pytest.approx(2.0)
    assert by["gw-chat"]["chunks_vs_direct"] == pytest.approx(0.95)
    assert by["gw-sse"]["added_ttft_ms"]["p99"] == pytest.approx(3.5)
    assert by["gw-sse"]["chunks_vs_direct"] == pytest.approx(0.8)
    for name in ("direct", "direct-chat", "direct-sse"):
        assert "added_ttft_ms" not in by[name]
        assert "chunks_vs_direct" not in by[name]


def test_baselines_are_matched_by_concurrency() -> None:
    rows = [
        _row("direct-chat", 1, ttft=50.0, chunks=100.0, baseline=None),
        _row("direct-chat", 64, ttft=55.0, chunks=6000.0, baseline=None),
        _row("gw-chat", 1, ttft=52.0, chunks=100.0, baseline="direct-chat"),
        _row("gw-chat", 64, ttft=56.0, chunks=5700.0, baseline="direct-chat"),
    ]
    add_relative(rows)
    assert rows[2]["added_ttft_ms"]["p50"] == pytest.approx(2.0)
    assert rows[2]["chunks_vs_direct"] == pytest.approx(1.0)
    assert rows[3]["added_ttft_ms"]["p50"] == pytest.approx(1.0)
    assert rows[3]["chunks_vs_direct"] == pytest.approx(0.95)


def test_a_row_whose_baseline_did_not_run_gets_no_relative_numbers() -> None:
    rows = [
        _row("direct", 16, ttft=50.0, chunks=1000.0, baseline=None),
        _row("gw-sse", 16, ttft=51.0, chunks=990.0, baseline="direct-sse"),
    ]
    add_relative(rows)
    assert "added_ttft_ms" not in rows[1]
    assert "chunks_vs_direct" not in rows[1]


def test_rows_of_earlier_runs_without_a_baseline_field_compare_with_direct() -> None:
    rows = [
        _row("direct", 16, ttft=50.0, chunks=1000.0, legacy=True),
        _row("gateway", 16, ttft=51.5, chunks=980.0, legacy=True),
        _row("nginx", 16, ttft=50.1, chunks=1000.0, legacy=True),
    ]
    assert [baseline_of(row) for row in rows] == [None, "direct", "direct"]
    add_relative(rows)
    assert rows[1]["added_ttft_ms"]["p50"] == pytest.approx(1.5)
    assert rows[1]["chunks_vs_direct"] == pytest.approx(0.98)
    assert rows[2]["added_ttft_ms"]["p50"] == pytest.approx(0.1)


def test_a_row_naming_itself_as_baseline_is_a_baseline() -> None:
    assert baseline_of(_row("direct", 1, ttft=1.0, chunks=1.0, baseline="direct")) is None


def test_the_share_uses_tokens_when_the_baseline_counted_tokens() -> None:
    rows = [
        _row("direct", 1, ttft=15.0, chunks=80.0, tokens=70.0, baseline=None),
        _row("gateway", 1, ttft=17.0, chunks=80.0, tokens=63.0, baseline="direct"),
    ]
    add_relative(rows)
    assert rows[1]["chunks_vs_direct"] == pytest.approx(0.9)


def test_summarise_records_the_targets_baseline() -> None:
    report = {
        "window_seconds": 2.0,
        "ttft_seconds": [0.05],
        "decode_tokens_per_second": [],
        "tokens_per_request": [],
        "completed": 1,
        "requests": 1,
        "chunks": 65,
        "tokens": 0,
        "errors": 0,
        "error_examples": [],
        "cpu_fraction": 0.01,
    }

    def baseline(target: Target) -> Any:
        return summarise(target, 1, [report], 2.0, 0.01, 0.0, 0.0)["baseline"]

    assert baseline(Target("direct", "u", "/api/generate", {})) is None
    assert baseline(Target("direct-sse", "u", "/v1/chat/completions", {}, baseline=None)) is None
    assert baseline(Target("gateway", "u", "/v1/generate", {}, pids=(1,))) == "direct"
    assert baseline(Target("gw-sse", "u", "/", {}, baseline="direct-sse")) == "direct-sse"


def _sweep(name: str, base: str, *, added: float, share: float, cpu: float) -> list[dict[str, Any]]:
    rows = []
    for n in (1, 16, 64):
        rows.append(_row(base, n, ttft=50.0, chunks=1000.0, baseline=None))
        rows.append(_row(name, n, ttft=50.0 + added, chunks=1000.0 * share, baseline=base, cpu=cpu))
    return rows


def test_targets_are_checked_for_every_gateway_row_of_the_run() -> None:
    rows = _sweep("gateway", "direct", added=0.5, share=0.99, cpu=3.0)
    rows += _sweep("gw-sse", "direct-sse", added=2.0, share=0.90, cpu=6.0)
    add_relative(rows)
    checks = {goal: met for goal, _, met in check_targets({"rows": rows})}
    assert checks["gateway: added TTFT @16: p50 <= 1 ms, p99 <= 5 ms"] is True
    assert checks["gateway: chunks/s @64 >= 95 % of direct"] is True
    assert checks["gateway: CPU @16 <= 5 ms/request"] is True
    assert checks["gw-sse: added TTFT @16: p50 <= 1 ms, p99 <= 5 ms"] is False
    assert checks["gw-sse: chunks/s @64 >= 95 % of direct-sse"] is False
    assert checks["gw-sse: CPU @16 <= 5 ms/request"] is False
    assert not any(goal.startswith("gw-chat") for goal in checks)  # not in this run
    assert checks["gateway RSS < 64 KiB per idle stream"] is None


def test_the_generate_targets_are_listed_as_not_run_without_that_surface() -> None:
    rows = _sweep("gw-chat", "direct-chat", added=0.5, share=0.99, cpu=3.0)
    add_relative(rows)
    checks = {goal: (measured, met) for goal, measured, met in check_targets({"rows": rows})}
    assert checks["gateway: CPU @16 <= 5 ms/request"] == ("not run", None)
    assert checks["gw-chat: chunks/s @64 >= 95 % of direct-chat"] == ("99.0%", True)


def test_new_rows_are_not_regressions_against_a_run_without_them() -> None:
    old = _sweep("gateway", "direct", added=0.5, share=0.99, cpu=3.0)
    new = old + _sweep("gw-sse", "direct-sse", added=9.0, share=0.5, cpu=20.0)
    add_relative(old)
    add_relative(new)
    assert find_regressions({"rows": new}, {"rows": old}, 0.1) == []


def test_surfaces_default_to_all_five_and_keep_their_order() -> None:
    assert build_parser().parse_args([]).surfaces == list(SURFACES)
    assert set(SURFACES) == {"generate", "chat", "sse", "responses", "messages"}
    assert _surfaces("sse, generate") == ["generate", "sse"]
    assert _surfaces("messages,responses") == ["responses", "messages"]
    with pytest.raises(argparse.ArgumentTypeError):
        _surfaces("generate,embed")
    with pytest.raises(argparse.ArgumentTypeError):
        _surfaces(",")


def test_a_baseline_tree_without_a_gateway_package_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    args = build_parser().parse_args(["--baseline-tree", str(tmp_path)])
    assert args.baseline_tree == tmp_path
    with ExitStack() as stack, pytest.raises(SystemExit, match="no gateway/ package"):
        _baseline_gateway(args, tmp_path / "work", "http://127.0.0.1:9", stack)
    assert not (tmp_path / "work").exists()  # no key store made, no process started


GATEWAY = Proxy("http://gw", "gw-key", (11,))


def _rows(targets: list[Target]) -> dict[str, tuple[str, str | None, str | None]]:
    """Row name -> (path, baseline, SSE event set or None for NDJSON)."""
    return {t.name: (t.path, t.baseline, t.events if t.sse else None) for t in targets}


def test_the_agent_surfaces_are_measured_against_the_chat_request_they_become() -> None:
    targets, notes = api_targets(list(SURFACES), "http://emu", GATEWAY, None)
    assert _rows(targets) == {
        "direct-chat": ("/api/chat", None, None),
        "gw-chat": ("/api/chat", "direct-chat", None),
        "gw-responses": ("/v1/responses", "direct-chat", "responses"),
        "gw-messages": ("/v1/messages", "direct-chat", "messages"),
        "direct-sse": ("/v1/chat/completions", None, "chat"),
        "gw-sse": ("/v1/chat/completions", "direct-sse", "chat"),
    }
    assert notes == []
    by = {t.name: t for t in targets}
    assert by["direct-chat"].url == "http://emu"
    assert by["direct-chat"].key is None
    assert by["direct-chat"].pids == ()
    for name in ("gw-chat", "gw-responses", "gw-messages", "gw-sse"):
        assert (by[name].url, by[name].key, by[name].pids) == ("http://gw", "gw-key", (11,))
    # The same prompt on every row of direct-chat's family: only the API's shape differs.
    prompt = by["direct-chat"].body["messages"]
    assert by["gw-messages"].body["messages"] == prompt
    assert [{"role": "user", "content": by["gw-responses"].body["input"]}] == prompt


def test_direct_chat_runs_once_for_any_surface_that_needs_it() -> None:
    for surfaces in (["responses"], ["messages"], ["chat", "responses", "messages"]):
        targets, _ = api_targets(surfaces, "http://emu", GATEWAY, None)
        names = [t.name for t in targets]
        assert names.count("direct-chat") == 1
        assert names[0] == "direct-chat"  # measured before the rows compared with it
        assert "gw-chat" not in names or "chat" in surfaces
    assert api_targets(["sse"], "http://emu", GATEWAY, None)[0][0].name == "direct-sse"
    assert api_targets(["generate"], "http://emu", GATEWAY, None) == ([], [])


def test_a_baseline_tree_gets_the_rows_of_the_surfaces_it_serves(tmp_path: Path) -> None:
    (tmp_path / "gateway" / "api" / "ollama").mkdir(parents=True)
    assert tree_surfaces(tmp_path) == {"generate", "chat", "sse"}  # before issue 26
    base = Proxy("http://base", "base-key", (12,), tree_surfaces(tmp_path))
    targets, notes = api_targets(list(SURFACES), "http://emu", GATEWAY, base)
    rows = _rows(targets)
    assert rows["base-chat"] == ("/api/chat", "direct-chat", None)
    assert rows["base-sse"] == ("/v1/chat/completions", "direct-sse", "chat")
    assert "base-responses" not in rows
    assert "base-messages" not in rows
    assert notes == [
        "base-responses row skipped: the --baseline-tree does not serve /v1/responses",
        "base-messages row skipped: the --baseline-tree does not serve /v1/messages",
    ]
    (tmp_path / "gateway" / "api" / "responses").mkdir()
    (tmp_path / "gateway" / "api" / "anthropic").mkdir()
    assert tree_surfaces(tmp_path) == set(SURFACES)
    base = Proxy("http://base", "base-key", (12,), tree_surfaces(tmp_path))
    rows = _rows(api_targets(list(SURFACES), "http://emu", GATEWAY, base)[0])
    assert rows["base-responses"] == ("/v1/responses", "direct-chat", "responses")
    assert rows["base-messages"] == ("/v1/messages", "direct-chat", "messages")


def test_the_targets_are_checked_for_the_agent_rows_against_direct_chat() -> None:
    rows = _sweep("gw-responses", "direct-chat", added=0.5, share=0.99, cpu=3.0)
    messages = _sweep("gw-messages", "direct-chat", added=2.0, share=0.9, cpu=6.0)
    rows += [row for row in messages if row["target"] == "gw-messages"]  # one direct-chat
    add_relative(rows)
    checks = {goal: met for goal, _, met in check_targets({"rows": rows})}
    assert checks["gw-responses: chunks/s @64 >= 95 % of direct-chat"] is True
    assert checks["gw-responses: CPU @16 <= 5 ms/request"] is True
    assert checks["gw-messages: added TTFT @16: p50 <= 1 ms, p99 <= 5 ms"] is False
    assert checks["gw-messages: chunks/s @64 >= 95 % of direct-chat"] is False


def _count(body: bytes, *, sse: bool, events: str = "chat", step: int | None = None) -> Reader:
    """Read `body` as the load generator does: whole, or in pieces of `step` bytes."""
    spec = Spec("127.0.0.1", 1, "/", b"{}", {}, sse=sse, parse_all=True, events=events)
    reader = Reader(spec, lambda _: True)
    size = step or len(body)
    for at in range(0, len(body), size):
        reader.feed(body[at : at + size])
    return reader


TOKENS = ["tok0 ", "tok1 ", "tok2 "]


def _emulator_sse() -> bytes:
    """What the emulator's own `/v1/chat/completions` sends (the `direct-sse` row)."""
    ask = OpenAIAsk(model="bench", stream=True, max_tokens=None, include_usage=False)
    dialect = ChatCompletionDialect(ask, number=1, created=0, omit_usage=False)
    events = [e for i, text in enumerate(TOKENS) for e in dialect.chunk(Piece(text), i)]
    events += dialect.finish(Summary("stop", 12, len(TOKENS), 1, 1, 1, 1))
    texts = (event if isinstance(event, str) else encode_json(event) for event in events)
    return "".join(f"data: {text}\n\n" for text in texts).encode()


def _gateway_sse() -> bytes:
    """What the gateway writes for `/v1/chat/completions` from Ollama chunks (`gw-sse`)."""
    request = GenerationRequest("openai", "chat", {"model": "bench"}, "bench")
    codec = CompletionCodec(request)
    chunks = [Chunk(text=text) for text in TOKENS] + [Chunk(done=True, done_reason="stop")]
    return b"".join(codec.encode([chunk]) for chunk in chunks)


def test_both_sse_rows_count_the_same_chunks_per_answer() -> None:
    direct, via = _count(_emulator_sse(), sse=True), _count(_gateway_sse(), sse=True)
    # One event per token (the role rides on the first), the finish event; [DONE] is no chunk.
    assert direct.window_chunks == via.window_chunks == len(TOKENS) + 1
    assert direct.tokens == via.tokens == len(TOKENS)
    assert direct.done
    assert via.done


def test_an_sse_answer_counts_as_many_chunks_as_its_ndjson_twin() -> None:
    lines = [
        b'{"message":{"role":"assistant","content":"%s"},"done":false}' % t.encode() for t in TOKENS
    ]
    lines.append(b'{"message":{"role":"assistant","content":""},"done":true}')
    ndjson = _count(b"\n".join(lines) + b"\n", sse=False)
    assert ndjson.window_chunks == _count(_gateway_sse(), sse=True).window_chunks
    assert ndjson.done


def _agent_stream(events: str, *, error: str | None = None) -> bytes:
    """What the gateway writes for `/v1/responses` or `/v1/messages` from Ollama chunks."""
    request = GenerationRequest("openai", "chat", {"model": "bench"}, "bench")
    codec = ResponsesCodec(request) if events == "responses" else MessagesCodec(request)
    chunks = [Chunk(text=text) for text in TOKENS]
    chunks.append(Chunk(error=error) if error else Chunk(done=True, done_reason="stop"))
    return b"".join(codec.encode([chunk]) for chunk in chunks)


@pytest.mark.parametrize("events", ["responses", "messages"])
def test_an_agent_stream_counts_as_many_chunks_as_the_direct_chat_answer(events: str) -> None:
    lines = [
        b'{"message":{"role":"assistant","content":"%s"},"done":false}' % t.encode() for t in TOKENS
    ]
    lines.append(b'{"message":{"role":"assistant","content":""},"done":true}')
    ndjson = _count(b"\n".join(lines) + b"\n", sse=False)
    body = _agent_stream(events)
    framing = body.count(b"\nevent: ") + 1  # every event the API sends, counted or not
    assert framing > len(TOKENS) + 2  # created/in_progress/... or message_start/ping/...
    for step in (None, 1, 7):  # whole, and split at every byte and across events
        reader = _count(body, sse=True, events=events, step=step)
        # A chunk is an answer delta (one per token) or the last event: the NDJSON lines'
        # count, so chunks/s compares with direct-chat's.
        assert reader.window_chunks == ndjson.window_chunks == len(TOKENS) + 1
        assert reader.tokens == ndjson.tokens == len(TOKENS)
        assert reader.done
        assert reader.first is not None


@pytest.mark.parametrize("events", ["responses", "messages"])
def test_an_error_event_fails_the_request(events: str) -> None:
    with pytest.raises(ValueError, match="error event"):
        _count(_agent_stream(events, error="upstream went away"), sse=True, events=events)


@pytest.mark.parametrize("events", ["responses", "messages"])
def test_a_stream_cut_before_its_last_event_is_not_done(events: str) -> None:
    body = _agent_stream(events)
    cut = body[: body.rindex(b"event: ")]
    reader = _count(cut, sse=True, events=events)
    assert reader.tokens == len(TOKENS)
    assert not reader.done  # the load generator counts it as "ended early"


def test_named_events_without_an_event_line_are_read_by_their_type() -> None:
    body = b"".join(
        line + b"\n"
        for line in _agent_stream("messages").split(b"\n")
        if not line.startswith(b"event:")
    )
    reader = _count(body, sse=True, events="messages")
    assert reader.window_chunks == len(TOKENS) + 1
    assert reader.done


def test_rounds_keep_each_rows_least_cpu_round_and_note_every_round() -> None:
    rounds = [
        {"name": "gateway", "proxy_cpu_ms_per_request": 5.0, "ttft_ms": {"p50": 52.0}},
        {"name": "gateway", "proxy_cpu_ms_per_request": 4.2, "ttft_ms": {"p50": 51.0}},
        {"name": "gateway", "proxy_cpu_ms_per_request": 4.6, "ttft_ms": {"p50": 50.5}},
    ]
    kept = least_cpu(rounds)
    assert kept["proxy_cpu_ms_per_request"] == 4.2
    assert kept["ttft_ms"] == {"p50": 51.0}  # the same round's, not a mix of rounds
    assert kept["cpu_ms_rounds"] == [5.0, 4.2, 4.6]


def test_a_row_without_a_proxy_or_a_single_round_is_kept_as_it_is() -> None:
    direct = [{"name": "direct", "proxy_cpu_ms_per_request": None, "errors": 0}] * 2
    assert least_cpu(direct)["name"] == "direct"
    assert "cpu_ms_rounds" not in least_cpu(direct)
    one = [{"name": "gateway", "proxy_cpu_ms_per_request": 3.0}]
    assert least_cpu(one) == one[0]
    assert "cpu_ms_rounds" not in least_cpu(one)


def test_no_round_s_failures_are_hidden_by_the_round_kept() -> None:
    rounds = [
        {"proxy_cpu_ms_per_request": None, "errors": 16, "error_examples": ["refused"]},
        {"proxy_cpu_ms_per_request": 4.0, "errors": 0, "error_examples": []},
        {"proxy_cpu_ms_per_request": 4.4, "errors": 2, "error_examples": ["reset"]},
    ]
    kept = least_cpu(rounds)
    assert kept["proxy_cpu_ms_per_request"] == 4.0  # a round that completed nothing is no least
    assert kept["cpu_ms_rounds"] == [None, 4.0, 4.4]
    assert kept["errors"] == 18
    assert kept["errors_rounds"] == [16, 0, 2]
    assert kept["error_examples"] == ["refused", "reset"]


def test_rounds_must_be_at_least_one() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rounds", "0"])
    with pytest.raises(ValueError, match="no round"):
        least_cpu([])
