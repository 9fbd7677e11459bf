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

from benchmarks.gateway import SURFACES, _baseline_gateway, _surfaces, build_parser
from benchmarks.measure import summarise
from benchmarks.report import add_relative, baseline_of, check_targets, find_regressions
from benchmarks.servers import Target
from benchmarks.stream import Reader, Spec
from gateway.api.openai.codec import CompletionCodec
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


def test_surfaces_default_to_all_three_and_keep_their_order() -> None:
    assert build_parser().parse_args([]).surfaces == list(SURFACES)
    assert _surfaces("sse, generate") == ["generate", "sse"]
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


def _count(body: bytes, *, sse: bool) -> Reader:
    spec = Spec("127.0.0.1", 1, "/", b"{}", {}, sse=sse, parse_all=True)
    reader = Reader(spec, lambda _: True)
    reader.feed(body)
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
