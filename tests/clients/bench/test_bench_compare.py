"""`gateway.clients.bench.compare`: the noise rule, the verdicts, and `gateway bench compare`'s
exits."""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from gateway.clients.bench.compare import (
    POINT_METRICS,
    Comparison,
    Metric,
    Row,
    Span,
    add_arguments,
    compare,
    judge,
    main_compare,
    parse_threshold,
    render_comparison,
)
from tests.clients.bench.bench_docs import model_entry, run_doc

LATENCY = Metric("ttft_seconds.p50", "TTFT p50 (ms)", scale=1000.0)
THROUGHPUT = Metric("output_tokens_per_second", "output (tok/s)", higher_is_better=True)
ERRORS = Metric("error_rate", "error rate (%)", scale=100.0, absolute=True)


def one(value: float) -> Span:
    """A value measured once: no range."""
    return Span(value, value, value)


def test_with_one_repeat_the_threshold_alone_decides() -> None:
    assert judge(LATENCY, one(1.0), one(1.04), 0.05).verdict == "same"
    assert judge(LATENCY, one(1.0), one(1.06), 0.05).verdict == "worse"
    assert judge(LATENCY, one(1.0), one(0.94), 0.05).verdict == "better"
    row = judge(LATENCY, one(1.0), one(1.2), 0.05)
    assert row.change == pytest.approx(0.2)
    assert row.noise == 0.0


def test_with_repeats_a_change_inside_the_overlapping_ranges_is_noise() -> None:
    base = Span(1.0, 0.95, 1.10)
    # +8% beyond the 5% threshold, but NEW's best repeat (1.05) is within BASE's range.
    noisy = judge(LATENCY, base, Span(1.08, 1.05, 1.12), 0.05)
    assert noisy.verdict == "noise"
    assert noisy.noise == pytest.approx(0.15)
    # The same median with a range that clears BASE's: a real change.
    assert judge(LATENCY, base, Span(1.08, 1.11, 1.12), 0.05).verdict == "worse"


def test_throughput_down_is_worse_and_up_is_better() -> None:
    assert judge(THROUGHPUT, one(100.0), one(80.0), 0.05).verdict == "worse"
    assert judge(THROUGHPUT, one(100.0), one(125.0), 0.05).verdict == "better"


def test_the_error_rate_changes_in_percentage_points() -> None:
    # From 0 errors a relative change is infinite; 1 point is under a 5% threshold.
    assert judge(ERRORS, one(0.0), one(0.01), 0.05).verdict == "same"
    row = judge(ERRORS, one(0.0), one(0.10), 0.05)
    assert (row.verdict, row.change) == ("worse", pytest.approx(0.10))


def test_a_zero_base_is_an_infinite_change_and_a_missing_side_no_verdict() -> None:
    row = judge(THROUGHPUT, one(0.0), one(3.0), 0.05)
    assert (row.change, row.verdict) == (math.inf, "better")
    assert judge(THROUGHPUT, one(0.0), one(0.0), 0.05).verdict == "same"
    missing = judge(THROUGHPUT, None, one(3.0), 0.05)
    assert (missing.verdict, missing.change) == ("missing", None)


def test_a_twenty_percent_slowdown_is_a_regression() -> None:
    base, slow = run_doc(seed=1), run_doc(seed=2, slowdown=1.2)
    result = compare(base, slow)
    assert result.verdict == "regression"
    assert result.exit_code == 1
    assert result.mismatches == []
    by_key = {(row.level, row.metric.key): row for row in result.rows}
    for level in (1, 2, 4, 8):
        ttft = by_key[(level, "ttft_seconds.p50")]
        assert ttft.verdict == "worse"
        assert ttft.change == pytest.approx(0.2, abs=0.07)  # x1.2, with a few % of noise
        tokens = by_key[(level, "output_tokens_per_second")]
        assert tokens.verdict == "worse"
        assert tokens.change == pytest.approx(1 / 1.2 - 1, abs=0.06)
        assert by_key[(level, "error_rate")].verdict == "same"
    assert {row.metric.key for row in result.regressions} >= {
        "ttft_seconds.p99",
        "tpot_seconds.p50",
        "itl_seconds.p99",
        "e2e_seconds.p50",
        "decode_tokens_per_second.p50",
        "requests_per_second",
    }
    # The knee did not move, and quality is the same build's.
    assert by_key[(None, "knee")].verdict == "same"
    assert by_key[(None, "quality")].verdict == "same"


def test_a_run_against_itself_passes_with_every_row_the_same() -> None:
    doc = run_doc()
    result = compare(doc, copy.deepcopy(doc))
    assert result.verdict == "pass"
    assert {row.verdict for row in result.rows} == {"same"}
    # Every point metric of every level, plus knee and quality.
    assert len(result.rows) == 4 * len(POINT_METRICS) + 2


def test_two_runs_differing_within_their_spread_pass() -> None:
    base, again = run_doc(seed=1), run_doc(seed=3)
    assert compare(base, again).verdict == "pass"
    # With a 1% threshold the repeats' noise exceeds it, yet the ranges overlap: noise.
    strict = compare(base, again, threshold=0.01)
    assert strict.verdict == "pass"
    assert "noise" in {row.verdict for row in strict.rows}
    assert strict.regressions == []


def test_with_one_repeat_a_small_slowdown_passes_and_a_larger_one_fails() -> None:
    base = run_doc(repeat=1, noise=0.0)
    assert compare(base, run_doc(repeat=1, noise=0.0, slowdown=1.03)).verdict == "pass"
    assert compare(base, run_doc(repeat=1, noise=0.0, slowdown=1.08)).verdict == "regression"


def test_a_faster_run_passes_with_better_rows() -> None:
    result = compare(run_doc(seed=1), run_doc(seed=2, slowdown=0.8))
    assert result.verdict == "pass"
    assert "better" in {row.verdict for row in result.rows}


def test_a_fingerprint_mismatch_is_refused_unless_allowed() -> None:
    base = run_doc()
    other = run_doc(slowdown=1.2, digests={"llama3.2:1b": "sha256:other"})
    refused = compare(base, other)
    assert refused.verdict == "refused"
    assert refused.exit_code == 2
    assert refused.mismatches == [
        "model 'llama3.2:1b' digest: 'sha256:a80c4f17acd5' in BASE, 'sha256:other' in NEW"
    ]
    allowed = compare(base, other, allow_mismatch=True)
    assert allowed.verdict == "regression"
    assert allowed.mismatches == refused.mismatches


def test_two_single_model_runs_are_paired_whatever_their_names() -> None:
    base = run_doc([model_entry("qwen2.5:7b-q4")])
    new = run_doc([model_entry("qwen2.5:7b-q8", slowdown=1.2, seed=5)])
    result = compare(base, new, allow_mismatch=True)
    assert result.rows[0].model == "qwen2.5:7b-q4 vs qwen2.5:7b-q8"
    assert result.verdict == "regression"
    assert compare(base, new).verdict == "refused"  # the fingerprint's models differ


def test_models_and_levels_in_one_run_only_are_noted_not_judged() -> None:
    base = run_doc([model_entry("a", levels=(1, 2)), model_entry("b")])
    new = run_doc([model_entry("a", levels=(1, 2, 4)), model_entry("b"), model_entry("c")])
    result = compare(base, new)  # more in NEW is no fingerprint mismatch either
    assert result.notes == [
        "model c measured only in NEW",
        "a: level 4 (concurrency) measured only in NEW",
    ]
    assert {row.model for row in result.rows} == {"a", "b"}
    assert result.refusals == []
    assert result.verdict == "pass"


def test_a_base_model_or_level_missing_from_new_is_refused_not_passed() -> None:
    base = run_doc([model_entry("a"), model_entry("b")])
    new = run_doc([model_entry("a", levels=(1, 2, 4)), model_entry("c")])
    result = compare(base, new, allow_mismatch=True)
    assert result.notes == [
        "model b measured only in BASE",
        "model c measured only in NEW",
        "a: level 8 (concurrency) measured only in BASE",
    ]
    assert {row.model for row in result.rows} == {"a"}
    assert result.refusals == [
        "model b of BASE was not measured in NEW",
        "a: level 8 (concurrency) of BASE not in NEW",
    ]
    assert result.verdict == "refused"
    assert result.exit_code == 2
    text = render_comparison(result)
    assert "refused: NEW cannot be judged against BASE" in text
    assert "model b of BASE was not measured in NEW" in text
    assert text.rstrip().endswith("verdict: refused")


def test_a_new_run_that_measured_nothing_is_refused() -> None:
    base = run_doc()
    empty = copy.deepcopy(base)
    for point in empty["models"][0]["points"]:
        point["summary"] = {key: {"median": "NaN"} for key in point["summary"]}
    empty["models"][0]["knee"] = None
    empty["models"][0]["quality"] = None
    result = compare(base, empty)
    assert all(row.new is None for row in result.rows)
    assert result.verdict == "refused"
    assert any("no value was compared" in r for r in result.refusals)
    no_points = copy.deepcopy(base)
    no_points["models"][0]["points"] = []
    assert compare(base, no_points).verdict == "refused"
    nothing = copy.deepcopy(base)
    nothing["models"] = []
    assert compare(base, nothing).verdict == "refused"


def test_the_command_refuses_the_attack_gate_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = {"median": 100, "min": 100, "max": 100}
    point = {"level": 1, "shape": "concurrency", "summary": {"output_tokens_per_second": summary}}
    base = {"schema": "gateway-bench/1", "models": [{"model": "m", "points": [point]}]}
    missing = copy.deepcopy(base)
    missing["models"][0]["points"][0]["summary"] = {"output_tokens_per_second": {"median": "NaN"}}
    nopoints = {"schema": "gateway-bench/1", "models": [{"model": "m", "points": []}]}
    base_path = _save(tmp_path / "base.json", base)
    for name, doc in (("missing", missing), ("nopoints", nopoints)):
        new_path = _save(tmp_path / f"{name}.json", doc)
        assert main_compare(_cli(base_path, new_path)) == 2
        assert "refused" in capsys.readouterr().out
        assert main_compare(_cli(base_path, new_path, "--json")) == 2
        out, err = capsys.readouterr()
        assert json.loads(out)["verdict"] == "refused"
        assert "refused:" in err


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        compare(run_doc(), run_doc(), threshold=-0.1)


@pytest.mark.parametrize(
    ("text", "value"), [("5%", 0.05), ("0.05", 0.05), (" 12.5 % ", 0.125), ("0", 0.0)]
)
def test_the_threshold_is_a_percentage_or_a_fraction(text: str, value: float) -> None:
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "-1%", "abc", "nan", "inf%"])
def test_an_ambiguous_or_bad_threshold_is_an_argument_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_threshold(text)


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gateway bench compare")
    add_arguments(parser)
    return parser.parse_args(argv)


def _save(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_command_exits_0_on_pass_and_1_on_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _save(tmp_path / "base.json", run_doc(seed=1))
    same = _save(tmp_path / "same.json", run_doc(seed=3))
    slow = _save(tmp_path / "slow.json", run_doc(seed=2, slowdown=1.2))
    assert main_compare(_cli(base, same)) == 0
    assert "verdict: pass" in capsys.readouterr().out
    assert main_compare(_cli(base, slow, "--threshold", "5%")) == 1
    out = capsys.readouterr().out
    assert "verdict: regression" in out
    assert "TTFT p50 (ms)" in out
    # A threshold above the slowdown lets it through.
    assert main_compare(_cli(base, slow, "--threshold", "30%")) == 0


def test_the_command_exits_2_on_a_mismatch_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _save(tmp_path / "base.json", run_doc())
    other = _save(tmp_path / "other.json", run_doc(digests={"llama3.2:1b": "sha256:b"}))
    assert main_compare(_cli(base, other)) == 2
    out = capsys.readouterr().out
    assert "refused" in out
    assert "--allow-mismatch" in out
    assert main_compare(_cli(base, other, "--allow-mismatch")) == 0
    assert "mismatch (allowed)" in capsys.readouterr().out
    # With --json the reason goes to stderr too, so a CI log shows it without parsing.
    assert main_compare(_cli(base, other, "--json")) == 2
    assert "refused: fingerprints differ: model" in capsys.readouterr().err


def test_the_command_exits_2_on_a_bad_file_with_one_line_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _save(tmp_path / "good.json", run_doc())
    (tmp_path / "bad.json").write_text("{not json")
    assert main_compare(_cli(good, str(tmp_path / "bad.json"))) == 2
    err = capsys.readouterr().err
    assert err.startswith("gateway bench compare: ")
    assert "bad.json: not JSON" in err
    assert "Traceback" not in err
    assert main_compare(_cli(str(tmp_path / "missing.json"), good)) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_json_form_is_valid_json_without_infinities(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base_doc = run_doc()
    new_doc = copy.deepcopy(base_doc)
    # goodput from 0 to something: an infinite relative change, which JSON cannot hold; and
    # an infinite noise from a median of 0 between repeats that differ.
    new_doc["models"][0]["points"][3]["summary"]["goodput_requests_per_second"] = {
        "median": 1.0,
        "min": 1.0,
        "max": 1.0,
        "spread": 0.0,
    }
    for repeat in new_doc["models"][0]["points"][3]["repeats"]:
        repeat["goodput_requests_per_second"] = 1.0  # the test reads the repeats
    base_doc["models"][0]["points"][3]["summary"]["error_rate"] = {
        "median": 0.0,
        "min": 0.0,
        "max": 0.01,
        "spread": None,
    }
    base, new = _save(tmp_path / "b.json", base_doc), _save(tmp_path / "n.json", new_doc)
    assert main_compare(_cli(base, new, "--json")) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=pytest.fail)
    assert out["verdict"] == "pass"
    goodput = [r for r in out["rows"] if r["metric"] == "goodput_requests_per_second"]
    assert goodput[-1]["verdict"] == "better"
    assert goodput[-1]["change"] is None
    assert out["rows"][0]["label"] == "TTFT p50 (ms)"
    errors = [r for r in out["rows"] if r["metric"] == "error_rate"]
    assert errors[-1]["noise"] is None


def _hostile_docs() -> list[dict[str, Any]]:
    base = run_doc()
    docs = []
    huge = copy.deepcopy(base)
    huge["models"][0]["points"][0]["summary"]["ttft_seconds.p50"] = {
        "median": 10**400,
        "min": -(10**400),
        "max": 1e308,
    }
    huge["models"][0]["knee"] = {"level": 10**400}
    huge["models"][0]["quality"] = {"score": float("nan")}
    docs.append(huge)
    extreme = copy.deepcopy(base)
    extreme["models"][0]["points"][0]["summary"]["ttft_seconds.p50"] = {
        "median": 1e308,
        "min": -1e308,
        "max": 1e308,
    }
    docs.append(extreme)
    wrong = copy.deepcopy(base)
    wrong["fingerprint"]["models"] = [{}]
    wrong["models"][0]["points"][0]["repeats"] = 5
    wrong["models"][0]["size"] = [1]
    docs.append(wrong)
    return docs


def test_hostile_values_neither_crash_the_comparison_nor_its_json() -> None:
    base = run_doc()
    for doc in _hostile_docs():
        for left, right in ((base, doc), (doc, base), (doc, doc)):
            result = compare(left, right, allow_mismatch=True)
            render_comparison(result)
            text = json.dumps(result.as_dict(), allow_nan=False)
            assert "NaN" not in text
            assert "Infinity" not in text


def test_the_json_form_turns_every_non_finite_number_into_null() -> None:
    base = run_doc()
    result = compare(base, base)
    result.threshold = math.inf
    result.rows[0] = Row(
        "m",
        math.nan,
        POINT_METRICS[0],
        Span(math.inf, -math.inf, math.nan),
        None,
        None,
        None,
        "missing",
    )
    item = json.loads(json.dumps(result.as_dict(), allow_nan=False))
    assert item["threshold"] is None
    assert item["rows"][0]["level"] is None
    assert item["rows"][0]["base"] == {"median": None, "low": None, "high": None, "values": []}


def test_the_command_exits_2_not_1_on_an_unexpected_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save(tmp_path / "run.json", run_doc())

    def explode(*args: object, **kwargs: object) -> None:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr("gateway.clients.bench.compare.compare", explode)
    assert main_compare(_cli(path, path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert "OverflowError" in err


def test_a_p99_measured_once_does_not_gate_but_a_p50_does():
    from gateway.clients.bench.compare import POINT_METRICS, Span, judge

    by_key = {m.key: m for m in POINT_METRICS}
    once_base, once_new = Span(0.052, 0.052, 0.052), Span(0.062, 0.062, 0.062)  # +19%
    assert judge(by_key["ttft_seconds.p99"], once_base, once_new, 0.05).verdict == "noise"
    assert judge(by_key["ttft_seconds.p50"], once_base, once_new, 0.05).verdict == "worse"
    repeated_base, repeated_new = Span(0.052, 0.051, 0.053), Span(0.062, 0.061, 0.063)
    assert judge(by_key["ttft_seconds.p99"], repeated_base, repeated_new, 0.05).verdict == "worse"


def test_a_value_base_measured_and_new_lost_is_worse_not_missing() -> None:
    """NEW with no first token or no rate (an empty-answer server) must not pass the gate."""
    lost = judge(THROUGHPUT, one(120.0), None, 0.05)
    assert lost.verdict == "worse"
    assert judge(THROUGHPUT, None, one(120.0), 0.05).verdict == "missing"  # NEW measured more


def test_a_throughput_gone_to_zero_is_worse_whatever_the_test_says() -> None:
    wide = Span(2550.0, 100.0, 5000.0, (100.0, 5000.0))  # repeats too wide for Welch to decide
    zero = Span(0.0, 0.0, 0.0, (0.0, 0.0))
    row = judge(THROUGHPUT, wide, zero, 0.05)
    assert (row.verdict, row.change) == ("worse", -1.0)


@pytest.mark.parametrize("partial", ["yes", 1, None, "false"])
def test_any_partial_value_but_false_is_refused(partial: object) -> None:
    base = run_doc()
    new = copy.deepcopy(base)
    new["partial"] = partial
    assert compare(base, new).verdict == "refused"
    clean = copy.deepcopy(base)
    clean["partial"] = False
    assert compare(base, clean).verdict == "pass"


def test_a_pass_with_rows_too_noisy_to_decide_says_inconclusive() -> None:
    base = Span(100.0, 90.0, 110.0, (90.0, 100.0, 110.0))
    new = Span(120.0, 60.0, 180.0, (60.0, 120.0, 180.0))
    row = judge(THROUGHPUT, base, new, 0.05)
    assert row.verdict == "noise"
    result = Comparison([row], [], [], "pass", 0.05)
    assert result.exit_code == 0  # a warning, not a refusal (--strict-stats refuses)
    line = render_comparison(result).rstrip().splitlines()[-1]
    assert line.startswith("verdict: pass at 95% confidence (inconclusive for 1 value(s):")
