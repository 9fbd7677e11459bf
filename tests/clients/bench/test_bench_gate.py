"""`gateway bench`'s statistics and honest exits (issue 30, items 2 and 4).

The intervals against the tables they must reproduce; the gate (Welch's t-test over repeats) on
the emulator, whose pacing is the truth: a +10% inter-token time is a regression at 95%
confidence with 3 repeats, the same setup twice is not, and single runs warn; the adaptive
repeats (`--until-ci`) on a simulated target; the exits: a run failing more requests than
`--max-error-rate` exits 3, and a run whose emulator process is killed mid-run stops, exits 1 and
leaves its partial document.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.clients.bench.cli import EXIT_TOO_MANY_ERRORS, main
from gateway.clients.bench.compare import POINT_METRICS, Span, compare, gate_warnings, judge
from gateway.clients.bench.health import DownWatch, TargetLost
from gateway.clients.bench.intervals import (
    mean_interval,
    parse_confidence,
    quantile_interval,
    t_cdf,
    t_quantile,
    welch,
)
from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.report import render_table
from gateway.clients.bench.shapes import Measurement, ShapeOptions, run_fixed
from gateway.testing.stack import ManagedProcess, free_port
from tests.clients.bench.bench_docs import run_doc
from tests.support.emulator import emulator_process
from tests.support.stack import Emulator

ITL = next(m for m in POINT_METRICS if m.key == "itl_seconds.p50")

# --- the intervals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [  # two-sided 95% and 90% critical values (NIST e-Handbook 1.3.6.7.2)
        (0.975, 1, 12.706),
        (0.975, 2, 4.303),
        (0.975, 4, 2.776),
        (0.975, 9, 2.262),
        (0.975, 30, 2.042),
        (0.95, 3, 2.353),
        (0.95, 20, 1.725),
        (0.995, 5, 4.032),
        (0.975, 5000, 1.960),  # past NORMAL_DF: the normal quantile
    ],
)
def test_student_t_quantiles_match_the_tables(p: float, df: int, table: float) -> None:
    assert t_quantile(p, df) == pytest.approx(table, abs=5e-4)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)
    assert t_quantile(1 - p, df) == pytest.approx(-table, abs=5e-4)


def test_welchs_fractional_degrees_of_freedom_round_down() -> None:
    # Rounding down widens the interval: never narrower than the exact fractional quantile.
    assert t_quantile(0.975, 2.9) == t_quantile(0.975, 2)


def test_the_mean_interval_is_students() -> None:
    found = mean_interval([90.0, 120.0, 100.0])
    assert found is not None
    s = statistics.stdev([90.0, 120.0, 100.0])
    assert found.half_width == pytest.approx(4.3027 * s / 3**0.5, rel=1e-4)
    assert mean_interval([5.0]) is None


def test_the_order_statistic_interval_covers_the_median_as_promised() -> None:
    # Seeded draws of an exponential (median ln 2): the 95% interval must hold it in about
    # 95% of 2000 samples of 40 (at least 95% by construction; 93% leaves room for chance).
    rng = random.Random(7)  # noqa: S311 - reproducible draws, not secrets
    truth, held = 0.6931471805599453, 0
    for _ in range(2000):
        found = quantile_interval(sorted(rng.expovariate(1.0) for _ in range(40)), 0.5)
        assert found is not None
        held += found[0] <= truth <= found[1]
    assert held / 2000 >= 0.93
    # A p99 of 50 samples has no upper rank: no interval rather than a false one.
    assert quantile_interval(sorted(range(50)), 0.99) is None


def test_welch_on_a_hand_computed_case() -> None:
    # BASE 1.00, 1.01, 0.99 (s^2 = 1e-4), NEW 1.10, 1.11, 1.09: diff 0.1, se = sqrt(2e-4/3),
    # df = 4 exactly, t(0.975, 4) = 2.776.
    found = welch([1.0, 1.01, 0.99], [1.1, 1.11, 1.09])
    assert found is not None
    assert found.difference == pytest.approx(0.1)
    assert found.df == pytest.approx(4.0)
    assert found.high - found.difference == pytest.approx(2.7764 * (2e-4 / 3) ** 0.5, rel=1e-4)
    assert found.significant
    assert found.p_value < 0.001
    same = welch([1.0, 1.01, 0.99], [1.0, 1.02, 0.98])
    assert same is not None
    assert not same.significant
    assert same.p_value == pytest.approx(1.0)
    assert welch([1.0], [1.0, 1.1]) is None


@pytest.mark.parametrize(
    ("text", "value"), [("95%", 0.95), ("0.99", 0.99), ("90", 0.9), ("99.9%", 0.999)]
)
def test_the_confidence_is_a_percentage_or_a_fraction(text: str, value: float) -> None:
    assert parse_confidence(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["50%", "100%", "abc", "0.3", "99.9999999%", "99.95"])
def test_a_confidence_outside_50_to_100_percent_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="confidence"):
        parse_confidence(text)


# --- the gate's rule ----------------------------------------------------------------------------


def _span(*values: float) -> Span:
    return Span(statistics.median(values), min(values), max(values), values)


def test_with_repeats_the_gate_is_welchs_test() -> None:
    base = _span(50.0, 50.2, 49.9)
    slower = judge(ITL, base, _span(55.0, 55.1, 54.9), 0.05)
    assert (slower.verdict, slower.test) == ("worse", "welch")
    assert slower.change_low is not None
    assert slower.change_low > 0.05  # certainly beyond the threshold too
    # +8% on the means, but the repeats scatter over 20%: not significant, so "noise" although
    # the min-max ranges do not overlap... and "worse" needs both.
    scattered = judge(ITL, base, _span(45.0, 58.0, 59.0), 0.05)
    assert scattered.verdict == "noise"
    assert scattered.unresolved  # its interval is wider than the threshold


def test_a_single_run_gate_warns_and_require_repeats_refuses() -> None:
    base, new = run_doc(repeat=1), run_doc(repeat=1, slowdown=1.2, seed=2)
    result = compare(base, new)
    assert result.verdict == "regression"  # the threshold alone decides, as before
    (warning,) = [w for w in result.warnings if "repeat at" in w]
    assert "BASE has 1 repeat at" in warning
    assert "no measured noise" in warning
    assert "--require-repeats 3" in warning
    refused = compare(base, new, require_repeats=3)
    assert refused.verdict == "refused"
    assert any("fewer than --require-repeats 3" in r for r in refused.refusals)
    assert compare(run_doc(), run_doc(seed=3), require_repeats=3).verdict != "refused"


def test_the_single_run_warning_names_both_sides_and_skips_advice_already_taken() -> None:
    base, new = run_doc(repeat=1), run_doc(repeat=1, seed=2)
    (warning,) = [w for w in compare(base, new).warnings if "repeat at" in w]
    assert "BASE has 1 repeat at" in warning
    assert "NEW has 1 repeat at" in warning
    refused = compare(base, new, require_repeats=3)
    (again,) = [w for w in refused.warnings if "repeat at" in w]
    assert "--require-repeats" not in again  # given already: no advice to pass it
    assert "--repeat 3" in again
    (one_sided,) = [w for w in compare(run_doc(), new).warnings if "repeat at" in w]
    assert "NEW has 1 repeat at" in one_sided
    assert "BASE" not in one_sided


def test_a_noisy_tail_percentile_is_informational_not_a_strict_stats_refusal() -> None:
    tail = next(m for m in POINT_METRICS if m.tail)
    spans = Span(1.0, 0.5, 1.5, (0.5, 1.0, 1.5)), Span(1.0, 0.4, 1.6, (0.4, 1.0, 1.6))
    wide = judge(tail, *spans, threshold=0.05)
    assert wide.unresolved
    median = judge(ITL, *spans, threshold=0.05)
    assert median.unresolved
    warnings, informational = gate_warnings([wide], ((3, "a"), (3, "b")), 0.05, 0.95)
    assert warnings == []
    assert "informational" in informational[0]
    assert tail.label in informational[0]
    warned, _ = gate_warnings([median, wide], ((3, "a"), (3, "b")), 0.05, 0.95)
    assert ITL.label in warned[0]
    assert tail.label not in warned[0]


def test_strict_stats_refuses_what_would_only_warn() -> None:
    base, new = run_doc(repeat=1), run_doc(repeat=1, seed=2)
    assert compare(base, new).warnings
    assert compare(base, new, strict_stats=True).verdict == "refused"


def test_a_partial_run_is_refused() -> None:
    partial = run_doc()
    partial["partial"], partial["partial_reason"] = True, "the target stopped answering"
    result = compare(run_doc(), partial)
    assert result.verdict == "refused"
    assert result.refusals[0].startswith("NEW is a partial run")


# --- the adaptive repeats -----------------------------------------------------------------------


def _measurement(ttft: float) -> Measurement:
    record = RequestRecord(
        start=0.0,
        end=1.0,
        ok=True,
        status=200,
        error=None,
        first_token=ttft,
        chunk_times=(ttft, 0.5, 1.0),
        output_tokens=3,
        output_source="ollama",
        model="m",
        prompt_id="p",
    )
    return Measurement([record], 0.0, 1.0)


@pytest.mark.anyio
async def test_until_ci_stops_once_the_intervals_converge() -> None:
    calls = 0

    async def steady(_level: float) -> Measurement:
        nonlocal calls
        calls += 1
        return _measurement(0.2 + 0.001 * (calls % 2))  # TTFT 0.201, 0.200, 0.201: +-0.5%

    options = ShapeOptions(until_ci=0.02, max_repeats=8)
    (point,) = (await run_fixed(steady, 1, options=options)).points
    assert point["convergence"]["converged"] is True
    assert calls == point["convergence"]["repeats"] == len(point["repeats"])
    assert 2 <= calls < 8
    ttft = point["summary"]["ttft_seconds.p50"]
    assert (ttft["ci_high"] - ttft["ci_low"]) / 2 <= 0.02 * ttft["mean"]


@pytest.mark.anyio
async def test_until_ci_gives_up_at_max_repeats_and_says_what_stayed_wide() -> None:
    draws = iter([0.1, 0.3] * 10)

    async def noisy(_level: float) -> Measurement:
        return _measurement(next(draws))

    options = ShapeOptions(until_ci=0.02, max_repeats=4)
    (point,) = (await run_fixed(noisy, 1, options=options)).points
    assert len(point["repeats"]) == 4
    assert point["convergence"]["converged"] is False
    assert any(w.startswith("ttft_seconds.p50 +-") for w in point["convergence"]["wide"])


def test_until_ci_needs_room_for_two_repeats() -> None:
    with pytest.raises(ValueError, match="max_repeats"):
        ShapeOptions(until_ci=0.02, max_repeats=1)


# --- the down watch -----------------------------------------------------------------------------


def _failed(at: float, status: int | None) -> RequestRecord:
    return RequestRecord(
        start=at,
        end=at,
        ok=False,
        status=status,
        error="connection refused",
        first_token=None,
        chunk_times=(),
        output_tokens=None,
        output_source="client",
        model="m",
        prompt_id="p",
    )


def test_the_down_watch_stops_on_silence_not_on_a_busy_server() -> None:
    watch = DownWatch(after=5.0, started=0.0)
    for at in range(20):  # 503s are a live server's answer: never an outage
        watch(_failed(float(at), 503))
    watch(_failed(20.0, None))  # the seconds count from the first failure without an answer
    watch(_failed(21.0, None))
    watch(_failed(24.0, None))  # 3 in a row, but over 4 s only
    with pytest.raises(TargetLost, match="stopped answering: 4 requests in a row"):
        watch(_failed(26.0, None))


# --- on the emulator ------------------------------------------------------------------------


def _emulator(tmp_path: Path, name: str, *options: str) -> ManagedProcess:
    return emulator_process(tmp_path / f"{name}.log", *options, name=f"emulator {name}")


def _bench(tmp_path: Path, target: str, out: str, *extra: str) -> int:
    return main(
        [
            "run",
            "--target",
            target,
            "--model",
            "llama3.2",
            "--no-gpu",
            "--quiet",
            "--out",
            str(tmp_path / out),
            *extra,
        ]
    )


def _itl_row(out: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in out["rows"] if r["metric"] == "itl_seconds.p50")


@pytest.mark.processes
def test_the_gate_calls_a_ten_percent_slower_decode_a_regression_with_three_repeats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 50 ms against 55 ms between tokens, paced by the emulator's own deadlines: a loaded
    # machine's late wake-ups (about 1 ms) stay well inside the 5 ms difference.
    pace = ["--ttft", "0.05", "--tokens", "20"]
    load = ["--concurrency", "2", "--requests", "2", "--repeat", "3"]
    with _emulator(tmp_path, "base", "--inter-token", "0.05", *pace) as base:
        assert _bench(tmp_path, base.url, "base.json", *load) == 0
        assert _bench(tmp_path, base.url, "same.json", *load) == 0
    with _emulator(tmp_path, "slow", "--inter-token", "0.055", *pace) as slow:
        assert _bench(tmp_path, slow.url, "slow.json", *load) == 0
    capsys.readouterr()

    def gate(new: str) -> tuple[int, dict[str, Any], str]:
        code = main(["compare", str(tmp_path / "base.json"), str(tmp_path / new), "--json"])
        captured = capsys.readouterr()
        return code, json.loads(captured.out), captured.err

    code, out, _ = gate("slow.json")
    row = _itl_row(out)
    assert (code, out["verdict"]) == (1, "regression")
    assert out["confidence"] == 0.95
    assert (row["verdict"], row["test"]) == ("worse", "welch")
    assert row["change"] == pytest.approx(0.10, abs=0.03)
    assert row["change_low"] > 0  # significant at 95%
    assert len(row["new"]["values"]) == 3

    code, out, _ = gate("same.json")
    row = _itl_row(out)
    assert row["verdict"] == "same"
    assert row["test"] == "welch"
    assert abs(row["change"]) < 0.05
    assert out["verdict"] != "regression" or all(
        r["metric"] != "itl_seconds.p50" for r in out["regressions"]
    )


@pytest.mark.processes
def test_single_runs_on_the_emulator_gate_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    load = ["--concurrency", "1", "--requests", "2"]
    with _emulator(tmp_path, "once", "--ttft", "0.01", "--inter-token", "0.01") as emulator:
        assert _bench(tmp_path, emulator.url, "a.json", *load) == 0
        assert _bench(tmp_path, emulator.url, "b.json", *load) == 0
    capsys.readouterr()
    code = main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    err = capsys.readouterr().err
    assert code in (0, 1)
    assert "gateway bench compare: warning: BASE has 1 repeat at llama3.2 level 1" in err
    assert "the 5.0% threshold alone decides" in err
    refused = ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert main([*refused, "--require-repeats", "2"]) == 2
    assert "fewer than --require-repeats 2" in capsys.readouterr().out


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_run_failing_more_requests_than_allowed_exits_3(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One slot and no queue: at concurrency 2 the second request at once is refused (503).
    emulator.config.parallel, emulator.config.max_queue = 1, 0
    emulator.config.ttft, emulator.config.inter_token, emulator.config.tokens = 0.01, 0.005, 8
    model = emulator.config.models[0]
    args = ["run", "--target", emulator.url, "--model", model, "--no-gpu", "--quiet"]
    args += ["--concurrency", "2", "--requests", "12", "--out", str(tmp_path / "run.json")]
    assert main(args) == EXIT_TOO_MANY_ERRORS
    err = capsys.readouterr().err
    assert "gateway bench: too many failed requests:" in err
    assert "more than the --max-error-rate of 1.0%" in err
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["partial"] is False  # measured to the end: the server was busy, not gone
    # Allowing the errors turns the same run into a success.
    assert main([*args, "--max-error-rate", "100%"]) == 0


@pytest.mark.processes
@pytest.mark.parametrize(
    "down_after",
    [
        pytest.param("2", id="within-the-level"),  # 2 s of refusals inside a 4 s level
        pytest.param("600", id="at-the-level-end"),  # only the probe at the level's end sees it
    ],
)
def test_a_target_killed_mid_run_stops_the_run_with_the_partial_document_saved(
    tmp_path: Path, down_after: str
) -> None:
    out = tmp_path / "run.json"
    with _emulator(
        tmp_path, "dies", "--ttft", "0.02", "--inter-token", "0.01", "--tokens", "10"
    ) as emulator:
        assert emulator.process is not None
        argv = [sys.executable, "-m", "gateway", "bench", "run", "--target", emulator.url]
        argv += ["--model", "llama3.2", "--no-gpu", "--concurrency", "1,2,4,8"]
        argv += ["--duration", "4", "--down-after", down_after, "--out", str(out)]
        with subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        ) as bench:
            assert bench.stderr is not None
            lines: Iterator[str] = iter(bench.stderr.readline, "")
            seen = []
            for line in lines:  # the first level's point line: level 1 is measured
                seen.append(line)
                if "concurrency 1 " in line:
                    break
            os.kill(emulator.process.pid, signal.SIGKILL)  # our emulator, by its id
            rest = bench.stderr.read()
            code = bench.wait(timeout=60)
    assert code == 1, [*seen, rest]
    assert "gateway bench: stopped: the target stopped answering" in rest
    assert f"the part measured is saved in {out} (marked partial)" in rest
    doc = json.loads(out.read_text())
    assert doc["partial"] is True
    assert doc["partial_reason"].startswith("the target stopped answering")
    (entry,) = doc["models"]
    levels = [p["level"] for p in entry["points"]]
    assert levels == [1, 2]  # the sweep did not go on to 4 and 8
    assert "partial" not in entry["points"][0]
    assert entry["points"][0]["repeats"][0]["completed"] > 0
    assert entry["points"][1]["partial"] is True
    assert entry["stopped"]["level"] == 2
    # The partial document is no baseline: compare refuses it.
    assert main(["compare", str(out), str(out)]) == 2


def test_the_report_prints_each_points_intervals() -> None:
    out = render_table(run_doc())
    assert "95% intervals at 1 (t over 3 repeats): TTFT p50 " in out
    once = render_table(run_doc(repeat=1))
    assert "95% intervals at 4 (within the run): TTFT p50 " in once


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-repeats", "5"], "--max-repeats applies only with --until-ci"),
        (["--until-ci", "2%", "--repeat", "12"], "max_repeats (10) must be at least 2"),
    ],
)
def test_adaptive_repeat_options_that_cannot_work_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    # Refused before anything is sent: the target is a port nothing listens on.
    target = f"http://127.0.0.1:{free_port()}"
    code = main(["run", "--target", target, "--api", "ollama", "--model", "m", *argv])
    assert code == 2
    assert message in capsys.readouterr().err
