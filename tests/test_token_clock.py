"""The decode pace a proxy can measure from arrival times (`gateway.neutral.TokenClock`)."""

from __future__ import annotations

import pytest

from gateway.neutral import TokenClock


def _clock(*times: float) -> TokenClock:
    clock = TokenClock()
    for now in times:
        clock.tick(now)
    return clock


def test_one_token_per_arrival_gives_the_spacing_after_the_first():
    clock = _clock(1.0, 1.02, 1.04, 1.06, 1.08)
    assert clock.count == 5
    assert clock.at_first == 1
    assert clock.seconds_per_token() == pytest.approx(0.02)


def test_a_burst_at_the_start_is_left_out_of_the_pace():
    """A reader that stalled 0.2 s sees ten tokens at once, then the rest at 50/s."""
    burst = [1.0 + i * 0.00001 for i in range(10)]
    later = [1.0 + 0.02 * i for i in range(1, 6)]
    clock = _clock(*burst, *later)
    assert clock.at_first == 10
    assert clock.seconds_per_token() == pytest.approx(0.02)


@pytest.mark.parametrize(
    "times",
    [(), (1.0,), (1.0, 1.0001, 1.0002)],
    ids=["none", "one token", "everything in one burst"],
)
def test_no_pace_without_a_token_after_the_first_arrival(times):
    assert _clock(*times).seconds_per_token() is None
