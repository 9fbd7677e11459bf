"""`python -m benchmarks.routing`: the routing benchmark's accounting, and a quick real run.

The pure tests check how cold loads are judged avoidable from the emulators' journals and what the
gateway is told per policy; the `processes` test runs the harness's `--quick` mode over real
emulators and a real `gateway serve` with the default policy.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.routing import avoidable_loads, gateway_env, main

LIF = "least_in_flight"


def event(t: float, model: str, kind: str, value: float = 0.0) -> dict[str, object]:
    return {"t": t, "model": model, "kind": kind, "value": value}


def test_a_cold_load_is_avoidable_only_while_another_server_holds_the_model_with_a_free_slot():
    holder = [event(0, "m1", "ready"), event(5, "m1", "slots", 2), event(8, "m1", "slots", 1)]
    other = [
        event(1, "m1", "load", 3.0),  # holder: loaded, 0 of 2 slots held -> avoidable
        event(6, "m1", "load", 9.0),  # holder: both slots held -> justified
        event(9, "m2", "load", 12.0),  # nobody holds m2 -> justified
    ]
    assert avoidable_loads([holder, other], parallel=2) == 1
    evicted = [*holder[:1], event(0.5, "m1", "evict")]
    assert avoidable_loads([evicted, other], parallel=2) == 0
    loading = [event(0, "m1", "load", 2.0)]  # still loading at t=1: not a holder yet
    assert avoidable_loads([loading, [event(1, "m1", "load", 5.0)]], parallel=2) == 0
    # A request already on its way to the holder takes its last slot 50 ms after the load.
    arriving = [
        event(0, "m1", "ready"),
        event(0.5, "m1", "slots", 1),
        event(1.05, "m1", "slots", 2),
    ]
    assert avoidable_loads([arriving, [event(1, "m1", "load", 3.0)]], parallel=2) == 0
    later = [event(0, "m1", "ready"), event(0.5, "m1", "slots", 1), event(1.5, "m1", "slots", 2)]
    assert avoidable_loads([later, [event(1, "m1", "load", 3.0)]], parallel=2) == 1


def test_the_gateway_is_told_the_policy_even_the_default():
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    env = gateway_env(urls, LIF)
    assert env["GATEWAY_ROUTING"] == LIF
    assert [entry["url"] for entry in json.loads(env["GATEWAY_UPSTREAMS"])] == urls
    assert gateway_env(urls, "scored")["GATEWAY_ROUTING"] == "scored"


@pytest.mark.processes
@pytest.mark.timeout(600)
def test_the_quick_run_prints_one_table_per_workload_and_the_shared_prefix_hits(tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["--quick", "--policies", LIF, "--out", str(out), "--workdir", str(tmp_path)]
    status = main(argv)
    rows = {row["workload"]: row for row in json.loads(out.read_text())}
    assert status == 0, {name: row["failures"] for name, row in rows.items()}
    assert list(rows) == ["shared", "agents", "agents8k", "unique", "models"]
    for row in rows.values():
        assert (row["servers"], row["policy"], row["concurrency"]) == (2, LIF, 4)
        assert row["requests"] > 0
        assert row["ttft_p50"] is not None
        # The gateway's own count of its choices in the point, read from its /metrics.
        assert row["decisions"] == {LIF: row["requests"]}
    assert rows["shared"]["prefix_hit_rate"] > 0.3  # the shared system prompt and histories
    assert rows["agents"]["prefix_hit_rate"] > 0.3
    assert rows["agents8k"]["prefix_hit_rate"] > 0.3
    assert rows["unique"]["prefix_hit_rate"] == 0
    assert rows["models"]["cold_loads"] >= 1  # the third model is preloaded nowhere
    printed = capsys.readouterr().out
    for workload in rows:
        assert f"workload {workload}" in printed
