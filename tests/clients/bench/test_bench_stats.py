"""`gateway.clients.bench.stats`: percentiles, one repeat's summary, the spread over repeats."""

from __future__ import annotations

from typing import Any

import pytest

import benchmarks.measure
from gateway.clients.bench.quantiles import percentile
from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.slo import parse_slo
from gateway.clients.bench.stats import (
    METRICS,
    across_repeats,
    client_decode_rate,
    distribution,
    escape_error,
    point_summary,
    summarize,
)


def _ok(
    start: float,
    chunks: tuple[float, ...],
    *,
    tokens: int | None = None,
    source: Any = "ollama",
    decode: float | None = None,
    prompt: int | None = 10,
    prefill: float | None = 0.5,
    warmup: bool = False,
) -> RequestRecord:
    """A successful request whose chunks arrive at `chunks` and that ends with the last one."""
    return RequestRecord(
        start=start,
        end=chunks[-1],
        ok=True,
        status=200,
        error=None,
        first_token=chunks[0],
        chunk_times=chunks,
        output_tokens=len(chunks) if tokens is None else tokens,
        output_source=source,
        prompt_tokens=prompt,
        prompt_source=None if prompt is None else source,
        decode_seconds=decode,
        prefill_seconds=prefill,
        timing_source=None if decode is None and prefill is None else source,
        warmup=warmup,
    )


def _failed(at: float, error: str | None, status: int | None = 503) -> RequestRecord:
    return RequestRecord(
        start=at,
        end=at,
        ok=False,
        status=status,
        error=error,
        first_token=None,
        chunk_times=(),
        output_tokens=None,
        output_source="client",
    )


def test_percentile_interpolates_linearly_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # sorted 1, 2, 3, 4: rank (n-1) q/100
    assert percentile(values, 50) == 2.5  # rank 1.5
    assert percentile(values, 90) == pytest.approx(3.7)  # rank 2.7: 3 + 0.7
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_bench_measure_uses_the_same_percentile() -> None:
    assert vars(benchmarks.measure)["percentile"] is percentile  # one definition for both tools


def test_distribution_has_every_statistic_and_extra_percentiles() -> None:
    d = distribution([1.0, 2.0, 3.0, 4.0, 5.0], extra=[99.9, 75.0])
    assert list(d) == ["mean", "p50", "p75", "p90", "p95", "p99", "p99.9", "min", "max", "count"]
    assert (d["mean"], d["p50"], d["p75"], d["min"], d["max"], d["count"]) == (3, 3, 4, 1, 5, 5)
    empty = distribution([])
    assert empty["count"] == 0
    assert all(v is None for k, v in empty.items() if k != "count")


def test_tokens_made_before_the_window_do_not_count() -> None:
    # Started during the warm-up: 2 of its 4 chunks arrived before the window opened at 0 s.
    straddling = _ok(-2.0, (-1.0, -0.5, 0.5, 1.0), tokens=8)
    repeat = summarize([straddling], 0.0, 2.0)
    assert repeat["completed"] == 1
    assert repeat["output_tokens_per_second"] == pytest.approx(2.0)  # 8 x 2/4 tokens / 2 s


def test_summarize_counts_throughput_in_the_window_and_leaves_out_warmup() -> None:
    records = [
        _ok(-1.0, (-0.5, 0.0), warmup=True),  # warm-up: nowhere
        _ok(0.0, (1.0, 2.0, 3.0, 4.0)),  # 4 tokens, in the window
        _ok(1.0, (1.5, 2.0, 3.0), tokens=6),  # 6 tokens (server), 3 chunks, in the window
        _ok(8.0, (9.0, 11.0)),  # ends after the window: its token at 9 s counts, not the one at 11
        _failed(5.0, "HTTP 503: queue full"),
    ]
    repeat = summarize(records, 0.0, 10.0)
    assert (repeat["requests"], repeat["completed"], repeat["errors"]) == (4, 2, 1)
    assert repeat["window_seconds"] == 10.0
    assert repeat["requests_per_second"] == pytest.approx(0.2)  # 2 completed / 10 s
    assert repeat["output_tokens_per_second"] == pytest.approx(1.1)  # (4 + 6 + 1) tokens / 10 s
    assert repeat["error_rate"] == pytest.approx(0.25)
    assert repeat["goodput_requests_per_second"] is None  # no SLO: not made up
    assert repeat["error_examples"] == ["HTTP 503: queue full"]
    metrics = repeat["metrics"]
    assert list(metrics) == list(METRICS)
    assert metrics["ttft_seconds"]["count"] == 3
    assert sorted([metrics["ttft_seconds"]["min"], metrics["ttft_seconds"]["max"]]) == [0.5, 1.0]
    assert metrics["e2e_seconds"]["max"] == 4.0
    # TPOT: (4 - 1) / 3 = 1.0, (3 - 1.5) / 5 = 0.3, (11 - 9) / 1 = 2.0
    assert metrics["tpot_seconds"]["p50"] == pytest.approx(1.0)
    assert metrics["tpot_seconds"]["min"] == pytest.approx(0.3)
    # ITL: every gap of every request: 1, 1, 1, 0.5, 1, 2
    assert metrics["itl_seconds"]["count"] == 6
    assert metrics["itl_seconds"]["mean"] == pytest.approx(6.5 / 6)
    assert metrics["prefill_tokens_per_second"]["p50"] == 20.0  # 10 tokens / 0.5 s


def test_summarize_with_an_slo_counts_goodput_and_adds_its_percentiles() -> None:
    fast = [_ok(0.0, (0.1, 0.2)) for _ in range(3)]  # TTFT 0.1 s
    slow = [_ok(0.0, (2.0, 2.1))]  # TTFT 2 s: not good
    repeat = summarize(fast + slow, 0.0, 4.0, parse_slo("ttft_p99.9<=1s"))
    assert repeat["goodput_requests_per_second"] == pytest.approx(3 / 4)
    assert repeat["requests_per_second"] == pytest.approx(4 / 4)
    assert repeat["metrics"]["ttft_seconds"]["p99.9"] == pytest.approx(2.0 - 1.9 * 0.003)


def test_summarize_records_where_each_metric_came_from() -> None:
    ollama = _ok(0.0, (1.0, 2.0, 3.0), decode=2.0)
    usage = _ok(0.0, (1.0, 2.0, 3.0), source="openai.usage", prompt=None)
    both = summarize([ollama, usage], 0.0, 5.0)["sources"]
    assert both["output_tokens"] == "mixed"
    assert both["prompt_tokens"] == "ollama"  # only the Ollama record reported it
    assert both["ttft_seconds"] == "client"
    assert both["itl_seconds"] == "client"
    # The OpenAI record has no server durations: its decode rate falls back to the client's.
    assert both["decode_tokens_per_second"] == "mixed"
    one = summarize([ollama], 0.0, 5.0)["sources"]
    assert one["output_tokens"] == "ollama"
    assert one["decode_tokens_per_second"] == "ollama"
    nothing = summarize([_failed(1.0, "boom")], 0.0, 5.0)
    assert nothing["sources"]["ttft_seconds"] is None
    assert nothing["metrics"]["ttft_seconds"]["p50"] is None


def test_summarize_puts_the_clients_own_measures_beside_the_servers() -> None:
    # The server says 8 tokens in 1 s (8 tokens/s); the client saw 5 chunks over 2 s.
    record = _ok(0.0, (1.0, 1.5, 2.0, 2.5, 3.0), tokens=8, decode=1.0)
    repeat = summarize([record], 0.0, 5.0)
    assert repeat["metrics"]["decode_tokens_per_second"]["p50"] == pytest.approx(8.0)
    assert repeat["client"]["decode_tokens_per_second"]["p50"] == pytest.approx(2.0)  # 4 / 2 s
    assert repeat["client"]["output_chunks"]["p50"] == 5
    assert client_decode_rate(_ok(0.0, (1.0,))) is None


def test_error_examples_are_escaped_cut_and_distinct() -> None:
    long = "x" * 500
    records = [
        _failed(1.0, "bad\nline\x1b[31m"),
        _failed(1.0, "bad\nline\x1b[31m"),
        _failed(1.0, long),
        _failed(1.0, None, status=None),
        *[_failed(1.0, f"error {i}") for i in range(5)],
    ]
    examples = summarize(records, 0.0, 2.0)["error_examples"]
    assert examples[0] == "bad\\nline\\x1b[31m"
    assert len(examples[1]) == 200
    assert examples[1].endswith("…")
    assert examples[2] == "HTTP None"
    assert len(examples) == 5
    assert escape_error("中文 ok") == "中文 ok"  # printable text is kept as is


def test_summarize_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="window must be positive"):
        summarize([], 3.0, 3.0)


def test_across_repeats_gives_median_min_max_and_spread() -> None:
    assert across_repeats([90.0, 120.0, 100.0]) == {
        "median": 100.0,
        "min": 90.0,
        "max": 120.0,
        "spread": pytest.approx(0.3),  # (120 - 90) / 100
    }
    assert across_repeats([5.0])["spread"] == 0.0
    assert across_repeats([None, 4.0, 2.0])["median"] == 3.0
    assert across_repeats([None, None]) == {
        "median": None,
        "min": None,
        "max": None,
        "spread": None,
    }
    assert across_repeats([-1.0, 0.0, 1.0])["spread"] is None  # median 0: no relative spread


def test_point_summary_keys_are_metric_dot_stat_and_bare_scalars() -> None:
    runs = [
        summarize([_ok(0.0, (t, t + 1.0))], 0.0, 10.0) for t in (0.1, 0.2, 0.4)
    ]  # TTFT 0.1, 0.2, 0.4 s
    summary = point_summary(runs)
    assert summary["ttft_seconds.p50"]["median"] == pytest.approx(0.2)
    assert summary["ttft_seconds.p50"]["spread"] == pytest.approx(1.5)  # (0.4 - 0.1) / 0.2
    assert summary["output_tokens_per_second"]["median"] == pytest.approx(0.2)
    assert "ttft_seconds.count" not in summary
    assert summary["goodput_requests_per_second"]["median"] is None
    assert point_summary([]) == {}
