"""The benchmark's pacing measures (issue 27): gaps between chunks, streams that hold, presets.

`benchmarks.load` times the gap between pieces of an answer that carry chunks and judges each
answer by the open rig's rule (no chunk lost, no gap over 10 times the pace); `benchmarks.report`
checks issue 27's targets for the run's `--preset`.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks.gateway import PRESETS, apply_preset, build_parser
from benchmarks.load import HOLD_FACTOR, Tally, gap_bin, gap_seconds
from benchmarks.measure import gap_percentile, summarise
from benchmarks.report import add_relative, check_speed_targets
from benchmarks.servers import Target
from benchmarks.stream import Reader, Spec

SPEC = Spec("127.0.0.1", 1, "/api/generate", b"{}", {}, sse=False, parse_all=False)
LINE = b'{"response":"a","done":false}\n'
DONE = b'{"response":"","done":true}\n'


def always(_: float) -> bool:
    return True


@pytest.mark.parametrize("seconds", [1e-6, 3.3e-5, 2e-4, 0.0101, 0.1, 2.5])
def test_a_gap_falls_in_a_bin_whose_upper_edge_is_within_two_percent_above_it(
    seconds: float,
) -> None:
    edge = gap_seconds(gap_bin(seconds))
    assert seconds <= edge * (1 + 1e-9)
    assert edge <= seconds * 1.02 * (1 + 1e-9)


def test_gap_percentiles_come_from_the_merged_bins() -> None:
    gaps = [0.001] * 98 + [0.050, 0.200]
    bins: dict[int, int] = {}
    for gap in gaps:
        bins[gap_bin(gap)] = bins.get(gap_bin(gap), 0) + 1
    p50 = gap_percentile(bins, 50)
    p99 = gap_percentile(bins, 99)
    assert p50 is not None
    assert p99 is not None
    assert math.isclose(p50, 1.0, rel_tol=0.021)
    assert math.isclose(p99, 50.0, rel_tol=0.021)
    assert gap_percentile({}, 99) is None


def feed(reader: Reader, pieces: list[tuple[float, bytes]], monkeypatch: Any) -> None:
    """Feed `pieces` as if each arrived at its time (perf_counter seconds)."""
    for moment, piece in pieces:
        monkeypatch.setattr("benchmarks.stream.time.perf_counter", lambda m=moment: m)
        reader.feed(piece)


def test_the_reader_times_gaps_between_pieces_carrying_chunks(monkeypatch: Any) -> None:
    reader = Reader(SPEC, always)
    # The first piece ends the TTFT (no gap); two lines in one piece arrived together.
    feed(
        reader,
        [(1.000, LINE), (1.010, LINE + LINE), (1.030, b"\n"), (1.050, DONE)],
        monkeypatch,
    )
    assert reader.chunk_count == 4
    assert [round(g, 6) for g in reader.gaps] == [0.010, 0.040]
    assert math.isclose(reader.max_gap, 0.040)


def judge(monkeypatch: Any, pieces: list[tuple[float, bytes]], expect: int) -> Tally:
    tally = Tally(window_start=0.0, window_end=100.0, pace=0.01, expect_chunks=expect)
    reader = Reader(SPEC, tally.in_window)
    feed(reader, pieces, monkeypatch)
    tally.record(reader, 0.9, 2.0)
    return tally


def test_an_answer_holds_when_no_gap_exceeds_ten_times_the_pace(monkeypatch: Any) -> None:
    held = judge(monkeypatch, [(1.0, LINE), (1.0 + HOLD_FACTOR * 0.01 - 1e-6, DONE)], expect=2)
    assert (held.held, held.judged) == (1, 1)
    stalled = judge(monkeypatch, [(1.0, LINE), (1.0 + HOLD_FACTOR * 0.01 + 0.001, DONE)], 2)
    assert (stalled.held, stalled.judged) == (0, 1)


def test_an_answer_that_lost_a_chunk_does_not_hold(monkeypatch: Any) -> None:
    tally = judge(monkeypatch, [(1.0, LINE), (1.01, DONE)], expect=3)
    assert (tally.held, tally.judged) == (0, 1)


def test_a_failed_request_is_judged_and_did_not_hold() -> None:
    tally = Tally(window_start=0.0, window_end=100.0, pace=0.01)
    tally.error("ConnectionResetError")
    report = tally.report(1, 0.0)
    assert (report["held"], report["judged"]) == (0, 1)


def test_summarise_merges_the_gap_bins_and_holds_of_every_load_process() -> None:
    def report(gaps: list[float], held: int, judged: int) -> dict[str, Any]:
        bins: dict[str, int] = {}
        for gap in gaps:
            bins[str(gap_bin(gap))] = bins.get(str(gap_bin(gap)), 0) + 1
        return {
            "window_seconds": 1.0,
            "ttft_seconds": [0.05],
            "decode_tokens_per_second": [],
            "tokens_per_request": [],
            "requests": 1,
            "chunks": 10,
            "tokens": 0,
            "completed": 1,
            "errors": 0,
            "error_examples": [],
            "cpu_fraction": 0.1,
            "gap_bins": bins,
            "held": held,
            "judged": judged,
        }

    target = Target("gateway", "http://127.0.0.1:1", "/v1/generate", {}, pids=())
    row = summarise(target, 2, [report([0.01] * 99, 3, 3), report([0.5], 1, 2)], 1.0, 0, 0, 0)
    assert (row["held"], row["judged"]) == (4, 5)
    assert math.isclose(row["gap_ms"]["p50"], 10.0, rel_tol=0.021)
    assert math.isclose(row["gap_ms"]["p99"], 10.0, rel_tol=0.021)
    assert row["gap_ms"]["p99"] < 500.0


def row(target: str, n: int, **values: Any) -> dict[str, Any]:
    base = None if target in ("direct", "nginx") else "direct"
    return {
        "target": target,
        "baseline": base,
        "concurrency": n,
        "ttft_ms": {"p50": values.get("ttft", 50.0), "p95": None, "p99": None},
        "chunks_per_second": values.get("chunks", 1000.0),
        "tokens_per_second": 0.0,
        "proxy_cpu_ms_per_request": values.get("cpu"),
        "gap_ms": {"p50": None, "p99": values.get("gap")},
    }


def test_the_today_preset_checks_cpu_against_nginx_and_the_256_stream_row() -> None:
    rows = [
        row("direct", 16),
        row("nginx", 16, cpu=1.0),
        row("gateway", 16, cpu=1.9),
        row("direct", 64),
        row("nginx", 64, cpu=1.0),
        row("gateway", 64, cpu=2.1),
        row("direct", 256, ttft=50.0, chunks=1000.0, gap=10.0),
        row("gateway", 256, ttft=56.0, chunks=960.0, gap=12.5),
    ]
    add_relative(rows)
    assert math.isclose(rows[-1]["added_gap_ms"]["p99"], 2.5)
    checks = {
        goal: met
        for goal, _, met in check_speed_targets({"meta": {"preset": "today"}, "rows": rows})
    }
    assert checks == {
        "gateway: CPU/request @16 <= 2x nginx's": True,
        "gateway: CPU/request @64 <= 2x nginx's": False,
        "gateway: chunks/s @256 >= 95% of its baseline": True,
        "gateway: added TTFT p50 @256 <= 5 ms": False,
    }


def test_the_100x_preset_checks_16_streams_and_one() -> None:
    rows = [row("direct", 1, ttft=5.0), row("gateway", 1, ttft=5.4)]
    rows += [row("direct", 16, ttft=5.0), row("gateway", 16, ttft=6.5, chunks=900.0)]
    add_relative(rows)
    checks = {
        goal: met
        for goal, _, met in check_speed_targets({"meta": {"preset": "100x"}, "rows": rows})
    }
    assert checks == {
        "gateway: chunks/s @16 >= 95% of its baseline": False,
        "gateway: added TTFT p50 @16 <= 1 ms": False,
        "gateway: added TTFT p50 @1 <= 0.5 ms": True,
    }
    assert check_speed_targets({"meta": {}, "rows": rows}) == []


def test_a_preset_sets_the_timing_and_levels_the_command_line_left_out() -> None:
    args = apply_preset(build_parser().parse_args(["--preset", "100x", "--concurrency", "2"]))
    assert (args.ttft, args.inter_token, args.tokens) == (0.005, 0.0002, 256)
    assert args.concurrency == [2]
    plain = apply_preset(build_parser().parse_args([]))
    today = PRESETS["today"]
    assert (plain.ttft, plain.inter_token, plain.tokens) == (
        today["ttft"],
        today["inter_token"],
        today["tokens"],
    )
    assert plain.concurrency == [1, 16, 64, 256]
