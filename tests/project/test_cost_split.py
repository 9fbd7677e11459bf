"""The cost split's arithmetic: CPU at two answer lengths, into per request and per chunk."""

from __future__ import annotations

import pytest

from benchmarks.cost_split import LONG, ROWS, SHORT, main, split


def test_a_linear_cost_is_split_back_into_its_parts() -> None:
    def cpu(tokens: int) -> float:  # 1.5 ms a request, 80 µs a chunk (tokens + the final line)
        return 1.5 + (tokens + 1) * 0.080

    per_request, per_chunk = split(cpu(SHORT), cpu(LONG))
    assert per_request == pytest.approx(1.5)
    assert per_chunk == pytest.approx(80.0)


def test_the_long_answer_must_be_longer() -> None:
    with pytest.raises(ValueError, match="longer"):
        split(1.0, 2.0, short=64, long=8)


def test_unknown_rows_are_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--rows", "nginx,envoy"])
    assert "envoy" in capsys.readouterr().err
    assert "nginx" in ROWS


def test_a_steady_run_needs_a_token(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--steady", "0", "--rows", "nginx"])
    assert "--steady" in capsys.readouterr().err
