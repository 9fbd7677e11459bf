"""The live board: requests in flight through the meter, and the sums of the last minute."""

from __future__ import annotations

import time

import pytest

from gateway.metering.live import LiveBoard
from gateway.metering.meter import RequestMeter
from gateway.metering.metrics import Metrics
from gateway.neutral import Outcome, RequestSummary


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _summary(
    model: str = "m",
    *,
    outcome: Outcome = "completed",
    status: int = 200,
    ttft: float | None = 0.1,
    tokens: int = 11,
    rate: float | None = 10.0,
    key_id: str = "k1",
) -> RequestSummary:
    return RequestSummary(
        route="/api/chat",
        model=model,
        key="all",
        upstream="u:1",
        outcome=outcome,
        status=status,
        duration_s=1.0,
        ttft_s=ttft,
        tokens_out=tokens,
        tokens_per_s=rate,
        key_id=key_id,
    )


def _meter(metrics: Metrics, model: str = "m", key_id: str = "k1") -> RequestMeter:
    return RequestMeter(
        metrics=metrics,
        route="/api/chat",
        model=model,
        key="all",
        arrival=time.perf_counter(),
        key_id=key_id,
    )


def _gauge(metrics: Metrics, model: str) -> float | None:
    return metrics.registry.get_sample_value("gateway_requests_in_flight", {"model": model})


def test_meters_count_in_flight_per_key_and_model_until_they_finish() -> None:
    metrics = Metrics()
    first, second = _meter(metrics, "a", "k1"), _meter(metrics, "a", "k2")
    third = _meter(metrics, "b", "k1")

    in_flight = metrics.live.in_flight()
    assert in_flight.total == 3
    assert in_flight.by_key == {"k1": 2, "k2": 1}
    assert in_flight.by_model == {"a": 2, "b": 1}

    first.finish("completed")
    second.finish("client_disconnect", 499)
    second.finish("completed")  # once only
    assert metrics.live.in_flight().by_key == {"k1": 1}
    assert metrics.live.recent().requests == 2
    third.drop()
    third.drop()
    assert metrics.live.in_flight().total == 0
    assert _gauge(metrics, "b") == 0  # dropped: out of the gauge too, once


def test_a_drop_after_the_finish_changes_nothing() -> None:
    metrics = Metrics()
    meter = _meter(metrics)
    meter.finish("completed")
    meter.drop()

    assert _gauge(metrics, "m") == 0
    assert metrics.live.recent().requests == 1


def test_recent_sums_the_window_only() -> None:
    clock = Clock()
    board = LiveBoard(window=60, clock=clock)
    board.finished(object(), _summary(ttft=5.0))  # type: ignore[arg-type]
    clock.now += 61  # out of the window
    board.finished(object(), _summary(ttft=0.1))  # type: ignore[arg-type]
    board.finished(object(), _summary(ttft=0.3))  # type: ignore[arg-type]
    board.finished(object(), _summary(ttft=None, tokens=0, rate=None))  # type: ignore[arg-type]

    recent = board.recent()

    assert (recent.requests, recent.errors, recent.output_tokens) == (3, 0, 22)
    assert recent.ttft_mean_s == pytest.approx(0.2)
    assert recent.ttft_p50_s == pytest.approx(0.2)
    assert recent.decode_tokens_per_s == pytest.approx(10.0)
    assert not recent.truncated


def test_decode_rate_weighs_each_answer_by_its_decode_time() -> None:
    board = LiveBoard(clock=Clock())
    # 10 tokens after the first at 10/s (1 s), 100 at 50/s (2 s): 110 tokens in 3 s.
    board.finished(object(), _summary("a", tokens=11, rate=10.0))  # type: ignore[arg-type]
    board.finished(object(), _summary("b", tokens=101, rate=50.0))  # type: ignore[arg-type]
    board.finished(object(), _summary("b", tokens=1, rate=None))  # type: ignore[arg-type]

    recent = board.recent()

    assert recent.decode_tokens_per_s == pytest.approx(110 / 3)
    assert [(m.model, m.requests) for m in recent.by_model] == [("b", 2), ("a", 1)]
    assert recent.by_model[0].decode_tokens_per_s == pytest.approx(50.0)


def test_errors_are_5xx_and_answers_that_broke_after_their_status() -> None:
    board = LiveBoard(clock=Clock())
    for outcome, status in [
        ("completed", 200),
        ("client_disconnect", 499),
        ("client_error", 404),
        ("upstream_error", 200),  # broke mid-stream
        ("timeout", 504),
        ("rejected_busy", 503),
    ]:
        board.finished(object(), _summary(outcome=outcome, status=status))  # type: ignore[arg-type]

    assert board.recent().errors == 3


def test_a_full_ring_says_the_window_is_truncated() -> None:
    board = LiveBoard(size=3, clock=Clock())
    for _ in range(5):
        board.finished(object(), _summary())  # type: ignore[arg-type]

    recent = board.recent()

    assert recent.requests == 3
    assert recent.truncated
