"""`gateway.clients.bench.slo`: parsing `--slo`, judging a point on its medians, a request for
goodput."""

from __future__ import annotations

import pytest

from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.slo import parse_slo
from gateway.clients.bench.stats import point_summary, summarize


def _request(ttft: float, gaps: tuple[float, ...], *, ok: bool = True) -> RequestRecord:
    """A request sent at 0 whose first chunk comes at `ttft` and the next ones `gaps` apart."""
    times = [ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    return RequestRecord(
        start=0.0,
        end=times[-1],
        ok=ok,
        status=200 if ok else 500,
        error=None if ok else "HTTP 500",
        first_token=ttft,
        chunk_times=tuple(times),
        output_tokens=len(times),
        output_source="ollama",
    )


def test_parse_reads_metrics_statistics_units_and_directions() -> None:
    slo = parse_slo(
        "ttft_p99<=2s, tpot_p50<=100ms,e2e_p95<=30s,itl_p99.9<=200ms,decode_tps_mean>=20"
    )
    got = [(b.metric, b.stat, b.op, b.threshold) for b in slo.bounds]
    assert got == [
        ("ttft", "p99", "<=", 2.0),
        ("tpot", "p50", "<=", pytest.approx(0.1)),
        ("e2e", "p95", "<=", 30.0),
        ("itl", "p99.9", "<=", pytest.approx(0.2)),
        ("decode_tps", "mean", ">=", 20.0),
    ]
    assert [b.key for b in slo.bounds] == [
        "ttft_seconds.p99",
        "tpot_seconds.p50",
        "e2e_seconds.p95",
        "itl_seconds.p99.9",
        "decode_tokens_per_second.mean",
    ]
    assert slo.percentiles() == {
        "ttft_seconds": [99.0],
        "tpot_seconds": [50.0],
        "e2e_seconds": [95.0],
        "itl_seconds": [99.9],
    }
    assert parse_slo("TTFT_P99.0<=1.5S").bounds[0].stat == "p99"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the SLO is empty"),
        ("ttft_p99<=2s,", "empty bound"),
        ("ttft<=2s", "does not parse"),
        ("ttft_p99 2s", "does not parse"),
        ("ttfb_p99<=2s", "unknown metric 'ttfb'"),
        ("ttft_p0<=2s", "outside p0-p100"),
        ("ttft_p100.5<=2s", "outside p0-p100"),
        ("ttft_p99>=2s", "latency; bound it with <="),
        ("ttft_p99<2s", "latency; bound it with <="),
        ("ttft_p99<=2", "give ttft a unit"),
        ("ttft_p99<=2min", "give ttft a unit"),
        ("decode_tps_p50<=20", "rate; bound it with >="),
        ("decode_tps_p50>=20ms", "tokens/s"),
        ("e2e_p95<=0ms", "must be positive"),
        ("ttft_p99<=1s,ttft_p99<=2s", "twice"),
    ],
)
def test_parse_refuses_bad_input_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_slo(text)


def test_a_point_meets_the_slo_when_the_median_over_repeats_does() -> None:
    slo = parse_slo("ttft_p50<=1s")
    # Three repeats with TTFT 0.5, 0.9 and 3 s: the median 0.9 s meets 1 s.
    repeats = [summarize([_request(t, (0.1,))], 0.0, 10.0, slo) for t in (0.5, 0.9, 3.0)]
    assert slo.met(point_summary(repeats))
    # With 0.5, 1.2 and 3 s the median 1.2 s misses it, and the violation says so.
    repeats = [summarize([_request(t, (0.1,))], 0.0, 10.0, slo) for t in (0.5, 1.2, 3.0)]
    summary = point_summary(repeats)
    assert not slo.met(summary)
    assert slo.violations(summary) == ["ttft_p50<=1s (median 1.2)"]
    # A statistic nobody measured never meets a bound.
    assert slo.violations({}) == ["ttft_p50<=1s (median not measured)"]


def test_a_lower_bound_on_the_decode_rate_is_judged_upward() -> None:
    slo = parse_slo("decode_tps_p50>=20")
    fast = summarize([_request(0.1, (0.01,) * 9)], 0.0, 5.0, slo)  # 100 tokens/s
    slow = summarize([_request(0.1, (0.1,) * 9)], 0.0, 5.0, slo)  # 10 tokens/s
    assert slo.met(point_summary([fast]))
    assert not slo.met(point_summary([slow]))
    assert slo.request_good(_request(0.1, (0.01,) * 9))
    assert not slo.request_good(_request(0.1, (0.1,) * 9))


def test_a_request_is_good_when_each_of_its_own_values_meets_every_bound() -> None:
    slo = parse_slo("ttft_p99<=1s,tpot_p50<=100ms,e2e_p95<=2s")
    assert slo.request_good(_request(0.5, (0.05, 0.05)))
    assert not slo.request_good(_request(1.5, (0.05, 0.05)))  # TTFT
    assert not slo.request_good(_request(0.5, (0.2, 0.2)))  # TPOT 0.2 s
    assert not slo.request_good(_request(0.5, (0.05,) * 40))  # e2e 2.5 s (TPOT 50 ms)
    assert not slo.request_good(_request(0.5, (0.05,), ok=False))  # failed
    assert slo.request_good(_request(0.5, ()))  # one token: no TPOT to miss


def test_a_requests_itl_is_the_bounds_statistic_over_its_own_gaps() -> None:
    # 99 gaps of 10 ms and one stall of 500 ms: p99 of its gaps = 10 + 0.01 * 490 ms = 14.9 ms.
    stalled = _request(0.1, (0.01,) * 99 + (0.5,))
    assert parse_slo("itl_p99<=20ms").request_good(stalled)
    assert not parse_slo("itl_p100<=20ms").request_good(stalled)  # the stall itself
    # Mean of the gaps: (99 * 10 + 500) / 100 = 14.9 ms.
    assert parse_slo("itl_mean<=15ms").request_good(stalled)
    assert not parse_slo("itl_mean<=14ms").request_good(stalled)


def test_a_request_without_a_first_token_is_not_good() -> None:
    record = RequestRecord(
        start=0.0,
        end=1.0,
        ok=True,
        status=200,
        error=None,
        first_token=None,
        chunk_times=(),
        output_tokens=0,
        output_source="ollama",
    )
    assert not parse_slo("ttft_p99<=2s").request_good(record)
    assert parse_slo("tpot_p99<=2s").request_good(record)
