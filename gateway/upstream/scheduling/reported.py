"""The `server` cost: the load a server reports that this gateway's own count misses, in tokens.

Each gateway replica counts only its own requests in flight (`scores.load_costs`). With
several replicas, or other clients, in front of the same model servers, a server can be busier
than any one replica knows; vLLM, llama.cpp and SGLang say so themselves on `/metrics`, read by
the monitor (`gateway.upstream.reported`). The llm-d scheduler scores exactly these readings
(queue depth and KV utilisation, the Gateway API Inference Extension's model server protocol).

For a server with a fresh reading (`ServerReport.fresh`; none, or an old one, costs 0, as a
server that says nothing is taken to have no load but this gateway's) of `waiting` queued and
`running` requests, while this gateway has `in_flight` requests there and assumes `slots` of
them run at once (its gate, else `DEFAULT_SLOTS`):

- queued beyond the load cost's own: `extra = max(0, waiting - max(0, in_flight - slots))`,
  the requests queued there that `scores.queue_cost` does not already charge (other clients',
  or this gateway's own where the server runs fewer at once than assumed); each costs what a
  queued request does in `scores.queue_cost`, a slot's hold over the slots at
  `LOAD_TOKENS_PER_SECOND`, with the hold assumed (`DEFAULT_HOLD_SECONDS`), not learned: the
  hold `Scheduler.holds` learns is this gateway's requests', and says nothing of how long
  another client's hold their slots;
- other requests: `foreign = max(0, waiting + running - in_flight)`, requests there that
  this gateway did not send; those not already charged as queued (`foreign - extra`, at least
  0) cost `REQUEST_TOKENS` each, as one of the gateway's own does in `scores.server_load`;
- both per unit of weight, like the load cost;
- KV pressure: past `KV_FULL_FROM` usage the server must evict cached prefixes (or, vLLM,
  preempt running requests) to hold a new request's tokens; the request's tokens (prompt and
  expected output, at least `REQUEST_TOKENS`) are charged in proportion, from 0 at
  `KV_FULL_FROM` to all of them when full, as if a prefix it holds were gone by then.

The reading is up to one poll interval old while `in_flight` is now: a burst this gateway
just sent is counted once (its requests are its own), and one that ended since the reading
still shows as the server's until the next poll.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.upstream.reported import ServerReport
from gateway.upstream.scheduling.scores import (
    DEFAULT_HOLD_SECONDS,
    DEFAULT_SLOTS,
    LOAD_TOKENS_PER_SECOND,
    REQUEST_TOKENS,
    Server,
)

#: KV cache usage from which the server is short of room: llm-d's model server metrics
#: reference reads `vllm:kv_cache_usage_perc` "above 0.9" as GPU memory nearly full, requests
#: preempted or rejected (llm-d.ai docs, "Model Server Metrics").
KV_FULL_FROM = 0.9


class Reporting(Server, Protocol):
    """A server whose monitor keeps what it reports of its own load."""

    @property
    def report(self) -> ServerReport | None:
        """Its last `/metrics` reading; None: it publishes none (or has not answered yet)."""
        ...


def server_cost(
    report: ServerReport | None,
    *,
    in_flight: int,
    slots: int,
    weight: float,
    tokens: int,
    now: float,
) -> float:
    """The `server` cost of one server, in tokens (module docstring).

    Args:
        report: Its reading, or None.
        in_flight: This gateway's requests in flight there.
        slots: Requests this gateway assumes it runs at once (its gate, else `DEFAULT_SLOTS`).
        weight: Its share of the load (`GATEWAY_UPSTREAMS` `weight`, above 0).
        tokens: The request's estimated prompt and output tokens (`RouteTicket.tokens`).
        now: `time.monotonic()`; a reading past its `fresh_until` costs 0.

    Returns:
        A cost of at least 0: 0 without a fresh reading.
    """
    return _cost(report, in_flight, slots, weight, tokens, now)


def _cost(
    report: ServerReport | None,
    in_flight: int,
    slots: int,
    weight: float,
    tokens: int,
    now: float,
) -> float:
    """`server_cost`, positional and without `max` calls: it runs per candidate per request."""
    if report is None or now > report.fresh_until:
        return 0.0
    waiting = report.waiting or 0.0
    extra = _extra(waiting, in_flight, slots)
    foreign = waiting + (report.running or 0.0) - in_flight
    cost = extra * DEFAULT_HOLD_SECONDS / slots * LOAD_TOKENS_PER_SECOND
    if foreign > extra:
        cost += (foreign - extra) * REQUEST_TOKENS
    cost /= weight
    kv = report.kv_usage
    if kv is not None and kv > KV_FULL_FROM:
        need = tokens if tokens > REQUEST_TOKENS else REQUEST_TOKENS
        cost += need * ((kv if kv < 1.0 else 1.0) - KV_FULL_FROM) / (1 - KV_FULL_FROM)
    return cost


def _extra(waiting: float, in_flight: int, slots: int) -> float:
    """Requests queued beyond the ones `scores.queue_cost` charges (module docstring)."""
    queued = in_flight - slots
    extra = waiting - queued if queued > 0 else waiting
    return extra if extra > 0 else 0.0


def queued_beyond(server: Reporting, now: float) -> float:
    """Requests queued at `server` beyond this gateway's own queue there, as it reports.

    The `extra` of the module docstring; 0 without a fresh report. A warm server with such a
    queue has no free slot, whatever this gateway's own count says (`scheduler`'s residency
    rule drops the servers without the model only when a warm one has room).
    """
    report = server.report
    if report is None or now > report.fresh_until or not report.waiting:
        return 0.0
    return _extra(report.waiting, server.in_flight, server.capacity or DEFAULT_SLOTS)


def server_costs(servers: Sequence[Reporting], tokens: int, now: float) -> list[float]:
    """Each server's `server_cost` for a request of `tokens`, in the servers' order."""
    costs = []
    for s in servers:
        report = s.report
        if report is None or now > report.fresh_until:  # `_cost`'s 0, without the call
            costs.append(0.0)
        else:
            costs.append(
                _cost(report, s.in_flight, s.capacity or DEFAULT_SLOTS, s.weight, tokens, now)
            )
    return costs
