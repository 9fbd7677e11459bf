"""`gateway.bench.document`: loading a run file, refusing what is none, reading optional values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.bench.document import RunFileError, check_run, load_run, nested, points, stat
from tests.bench_docs import run_doc


def test_a_saved_run_loads_back_unchanged(tmp_path: Path) -> None:
    doc = run_doc()
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    assert load_run(path) == doc


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON (line 1 column 2"),
        ("[]", "not a run document"),
        ('{"schema": "gateway-bench/2", "models": []}', "schema 'gateway-bench/2' is not"),
        ('{"schema": "gateway-bench/1"}', "no 'models' list"),
        ('{"schema": "gateway-bench/1", "models": [{"points": []}]}', "models[0] has no model"),
        (
            '{"schema": "gateway-bench/1", "models": [{"model": "m", "points": [{"level": 1}]}]}',
            "models[0].points[0] has no summary",
        ),
        (
            '{"schema": "gateway-bench/1", "models": [{"model": "m", "points": '
            '[{"level": true, "summary": {}}]}]}',
            "no numeric level",
        ),
        ('{"schema": "gateway-bench/1", "models": [], "fingerprint": 3}', "'fingerprint' is not"),
    ],
)
def test_a_file_that_is_no_run_document_is_refused_with_its_name(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(RunFileError) as caught:
        load_run(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_a_missing_or_binary_file_is_a_run_file_error(tmp_path: Path) -> None:
    with pytest.raises(RunFileError, match="cannot read"):
        load_run(tmp_path / "nope.json")
    binary = tmp_path / "run.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(RunFileError, match="not UTF-8"):
        load_run(binary)


def test_values_are_optional_when_read() -> None:
    point = {"level": 2, "summary": {"ttft_seconds.p50": {"median": 0.1, "min": None}}}
    assert stat(point, "ttft_seconds.p50") == 0.1
    assert stat(point, "ttft_seconds.p50", "min") is None
    assert stat(point, "goodput_requests_per_second") is None
    assert stat({"summary": {"x": "text"}}, "x") is None
    assert nested({"a": {"b": 1}}, "a", "b") == 1
    assert nested({"a": None}, "a", "b") is None
    assert [p["level"] for p in points({"points": [{"level": 4}, {"level": 1}]})] == [1, 4]
    assert check_run(run_doc()) is None


def test_nan_and_infinity_read_as_unknown() -> None:
    point = {"summary": {"a": {"median": float("nan")}, "b": {"median": float("inf")}}}
    assert stat(point, "a") is None
    assert stat(point, "b") is None
