"""The CPU gate's arithmetic (`benchmarks.gate`) and its committed baseline.

The gate itself runs in CI (`.ci/run`); here, what it decides from given figures, so a change to
its rule is seen without a measurement.
"""

from __future__ import annotations

import json

from benchmarks.gate import BASELINE, pace_problems, ratios_of, verdict


def test_a_row_is_its_least_cpu_over_the_floors_least():
    cpu = {"floor": [2.6, 2.4, 2.5], "gateway": [4.9, 4.4, 4.6]}
    assert ratios_of(cpu) == {"gateway": 4.4 / 2.4}


def test_a_ratio_fails_only_past_the_threshold_and_a_new_row_passes():
    rows = verdict(
        {"gateway": 2.19, "gw-chat": 2.21, "new": 9.0}, {"gateway": 1.83, "gw-chat": 1.83}, 0.20
    )
    assert [(name, fine) for name, _, _, fine in rows] == [
        ("gateway", True),  # +19.7 %
        ("gw-chat", False),  # +20.8 %
        ("new", True),
    ]


def test_the_committed_baseline_names_every_row_the_gate_measures():
    baseline = json.loads(BASELINE.read_text())
    assert set(baseline["ratio"]) == {"gateway", "gw-chat", "gw-sse"}
    assert all(1.0 < ratio < 10.0 for ratio in baseline["ratio"].values())


def test_a_row_behind_the_floors_pace_fails_even_at_no_cpu_cost():
    pace = {
        "floor": [(1500.0, 51.0), (1490.0, 52.0)],
        "gateway": [(1480.0, 54.0), (1495.0, 53.0)],  # 3 ms added: keeps pace
        "slept": [(900.0, 52.0), (950.0, 53.0)],  # streams served one after another
        "late": [(1490.0, 90.0), (1480.0, 95.0)],  # a sleep before the first chunk
    }
    problems = pace_problems(pace)
    assert [p.split(":")[0] for p in problems] == ["slept", "late"]
