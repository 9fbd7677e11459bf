"""`gateway.clients.bench.document`: loading a run file, refusing what is none, reading optional
values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.clients.bench import document
from gateway.clients.bench.document import (
    RunFileError,
    check_run,
    load_run,
    mapping,
    models,
    nested,
    points,
    real,
    sequence,
    stat,
)
from tests.clients.bench.bench_docs import run_doc


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


_OK = (
    '{"schema":"gateway-bench/1","models":[{"model":"m","points":[{"level":LEVEL,"summary":{}}]}]}'
)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"schema":"gateway-bench/1","x":1' + "0" * 5000 + ',"models":[]}', "not a readable"),
        (
            '{"schema":"gateway-bench/1","models":[],"x":' + "[" * 100000 + "]" * 100000 + "}",
            "nested too deeply",
        ),
        (_OK.replace("LEVEL", "1" + "0" * 400), "finite positive"),
        (_OK.replace("LEVEL", "Infinity"), "finite positive"),
        (_OK.replace("LEVEL", "NaN"), "finite positive"),
        (_OK.replace("LEVEL", "0"), "finite positive"),
        (_OK.replace("LEVEL", "-1"), "finite positive"),
        (_OK.replace("LEVEL", "true"), "finite positive"),
    ],
)
def test_hostile_json_is_a_run_file_error(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "hostile.json"
    path.write_text(text)
    with pytest.raises(RunFileError, match=says):
        load_run(path)


def test_a_file_over_the_size_limit_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps(run_doc()))
    monkeypatch.setattr(document, "MAX_BYTES", 100)
    with pytest.raises(RunFileError, match="too large"):
        load_run(path)
    assert document.MAX_BYTES == 100
    monkeypatch.undo()
    assert document.MAX_BYTES == 64 * 1024 * 1024


def test_the_lenient_readers_treat_huge_and_wrong_values_as_missing() -> None:
    point = {"level": 1, "summary": {"a": {"median": 10**400}, "b": {"median": "1"}, "c": [1]}}
    assert stat(point, "a") is None
    assert stat(point, "b") is None
    assert stat(point, "c") is None
    assert stat({"level": 1, "summary": [1]}, "a") is None
    assert real(10**400) is None
    assert real(True) is None
    assert real(2) == 2.0
    assert mapping([1]) == {}
    assert sequence(5) == []
    entry = {"points": [{"level": 2}, {"level": float("nan")}, 7, {"level": 1}]}
    assert [p["level"] for p in points(entry)] == [1, 2]
    assert models({"models": [{"model": "m"}, 3]}) == [{"model": "m"}]
