"""From the knee to the gateway's settings: the upstream gate, its queue and the queue timeout.

The gateway admits `GATEWAY_UPSTREAM_MAX_CONCURRENT` requests at once to each upstream (per
gateway process; an upstream's own `max_concurrent` in `GATEWAY_UPSTREAMS` overrides it) and
queues up to `GATEWAY_UPSTREAM_QUEUE_SIZE` more, each for at most
`GATEWAY_UPSTREAM_QUEUE_TIMEOUT` seconds (gateway/settings.py, docs/configuration.md).

- Concurrency: the knee, or the SLO limit when that is lower. Above the knee more concurrency
  buys no throughput, only slower answers; above the SLO limit the answers miss the objective.
  Shared by `replicas` gateway processes, each gets its share (rounded down, at least 1: 0
  would switch the gate off).
- Queue: Little's law, L = lambda x W. At that concurrency the server completes lambda
  requests/s (the point's median `requests_per_second`), so a queue of `ceil(lambda x W)` holds
  what it drains in the target wait W; a longer queue only holds requests that will wait longer.
- Queue timeout: a request at the back of a full queue waits about W, but slots free in bursts
  (requests of one batch end together), so one more answer's duration (the point's e2e p95) is
  added before it is refused; whole seconds, as the 503's `Retry-After` is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.clients.bench.knee import median
from gateway.clients.bench.tables import plural


def recommend(
    points: Sequence[Mapping[str, Any]],
    knee: Mapping[str, Any] | None,
    slo_limit: Mapping[str, Any] | None,
    *,
    target_queue_wait: float = 2.0,
    replicas: int = 1,
    upstream_url: str | None = None,
) -> dict[str, Any] | None:
    """The run document's `policy` object for one model, from a concurrency search or sweep.

    Args:
        points: The model's concurrency points (`level`, `summary`).
        knee: `knee.find_knee` (its `level` may be None: not reached).
        slo_limit: `knee.find_slo_limit`, or None without an SLO.
        target_queue_wait: Seconds a request may wait in the gateway's queue (W), >= 0.
        replicas: Gateway processes in front of the upstream; the limits are per process.
        upstream_url: When set, the gate goes in this upstream's `max_concurrent` in
            `GATEWAY_UPSTREAMS` (`upstreams_entry`) instead of `GATEWAY_UPSTREAM_MAX_CONCURRENT`.

    Returns:
        `upstream_max_concurrent`, `upstream_queue_size`, `upstream_queue_timeout` (per
        process), `target_queue_wait_seconds`, `replicas`, `basis` (`knee` or `slo_limit`),
        `level`, `requests_per_second`, `env` (variable -> value), `upstreams_entry` (with
        `upstream_url`) and `sentence`; None when there is no knee nor SLO limit to go by, or
        the points are of a rate shape (a rate is no concurrency).

    Raises:
        ValueError: `target_queue_wait` < 0 or `replicas` < 1.
    """
    if target_queue_wait < 0:
        raise ValueError(f"target_queue_wait must be >= 0, got {target_queue_wait}")
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    basis, level = _limit(knee, slo_limit)
    by_level = {p["level"]: p for p in points if p.get("shape") == "concurrency"}
    if level is None or level not in by_level:
        return None
    point = by_level[level]
    rate = median(point, "requests_per_second") or 0.0
    e2e = median(point, "e2e_seconds.p95")
    per_process = max(1, int(level) // replicas)
    # The epsilon keeps float noise (4.000000000000001) from rounding a whole queue up.
    queue = math.ceil(rate * target_queue_wait / replicas - 1e-9) if target_queue_wait else 0
    slack = e2e if e2e is not None else target_queue_wait
    timeout = float(max(1, math.ceil(target_queue_wait + slack)))
    env = {
        "GATEWAY_UPSTREAM_QUEUE_SIZE": str(queue),
        "GATEWAY_UPSTREAM_QUEUE_TIMEOUT": f"{timeout:g}",
    }
    policy: dict[str, Any] = {
        "upstream_max_concurrent": per_process,
        "upstream_queue_size": queue,
        "upstream_queue_timeout": timeout,
        "target_queue_wait_seconds": target_queue_wait,
        "replicas": replicas,
        "basis": basis,
        "level": level,
        "requests_per_second": rate,
    }
    if upstream_url is None:
        env = {"GATEWAY_UPSTREAM_MAX_CONCURRENT": str(per_process), **env}
    else:
        policy["upstreams_entry"] = {"url": upstream_url, "max_concurrent": per_process}
    policy["env"] = env
    policy["sentence"] = _sentence(policy, rate)
    return policy


def _limit(
    knee: Mapping[str, Any] | None, slo_limit: Mapping[str, Any] | None
) -> tuple[str, int | None]:
    at_knee = None if knee is None else knee.get("level")
    at_slo = None if slo_limit is None else slo_limit.get("level")
    if at_slo is not None and (at_knee is None or at_slo < at_knee):
        return "slo_limit", int(at_slo)
    return "knee", None if at_knee is None else int(at_knee)


def _sentence(policy: Mapping[str, Any], rate: float) -> str:
    why = "the SLO limit" if policy["basis"] == "slo_limit" else "the knee"
    gate = (
        f"max_concurrent {policy['upstream_max_concurrent']} in its GATEWAY_UPSTREAMS entry"
        if "upstreams_entry" in policy
        else f"GATEWAY_UPSTREAM_MAX_CONCURRENT={policy['upstream_max_concurrent']}"
    )
    replicas = policy["replicas"]
    share = "" if replicas == 1 else f", {policy['upstream_max_concurrent']} per gateway process"
    each = "" if replicas == 1 else f" (each of the {replicas} processes)"
    return (
        f"Allow {plural(policy['level'], 'request')} at once ({why}){share}: {gate}{each}. At"
        " that load the "
        f"server completes {rate:.3g} requests/s, so a wait of at most "
        f"{policy['target_queue_wait_seconds']:g} s holds "
        f"GATEWAY_UPSTREAM_QUEUE_SIZE={policy['upstream_queue_size']} waiting"
        f" request{'' if policy['upstream_queue_size'] == 1 else 's'}{each}; "
        f"GATEWAY_UPSTREAM_QUEUE_TIMEOUT={policy['upstream_queue_timeout']:g} (that wait plus "
        "one answer's p95 time, rounded up) refuses a request still waiting then with a 503, "
        "as a full queue refuses the rest."
    )
