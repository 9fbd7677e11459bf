"""The routing policy (`GATEWAY_ROUTING`): the order in which a request tries its candidates.

`UpstreamPool.choose` hands over the candidates it filtered (circuit, up, lists the model),
in the pool's order, and tries them in the order returned, the first whose circuit admits it:

- `least_in_flight`: the fewest requests in flight per weight, ties at random;
- `round_robin`: each choice starts one candidate further along;
- `scored` (the default): first, where the model is loaded on a server with a free slot (and
  no queue of its own, as it reports it), only the servers with the model loaded, full ones
  too (a cold load is never started while a warm server has room; a full one's short queue
  may still cost less than a long history prefilled elsewhere), else where a load the
  gateway started is under way with room (never a second load beside it); then SGLang's
  balance guard (the least loaded, a cold load counted, when one server is far busier); else
  the lowest weighted sum of the costs in tokens (`scores`): the prompt tokens a server must
  still prefill (none at the session's last server when no server has a prefix match), its
  load, a cold load, and the load the server itself reports beyond this gateway's own
  (`reported`) (`GATEWAY_ROUTING_SCORES`).

Each choice has a reason (`REASONS`), counted in `gateway_route_decisions_total{reason}`,
logged with the request and set on its span. What the policy learns comes back through the
pool: the prompt and session noted at the choice, the model noted as loaded at the first
chunk, a server's notes dropped when it fails or its monitor sees it go down.

Over ~300 lines for one reason: the order of one choice is a sequence of rules (residency
and loads under way, the guard, the weighted costs) that read the same candidates, states
and learned notes (prefixes, sessions, loads, slot holds); the costs themselves are pure
functions elsewhere (`scores`, `reported`), and what remains is their sequence, kept in one
place so the order they apply in can be read top to bottom.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Protocol, TypeVar

from gateway.metering.metrics import Metrics
from gateway.policies import SchedulingPolicy
from gateway.upstream.scheduling.prefixes import PrefixIndex, SessionIndex
from gateway.upstream.scheduling.reported import Reporting, queued_beyond, server_costs
from gateway.upstream.scheduling.residency import Residency
from gateway.upstream.scheduling.scores import (
    CHARS_PER_TOKEN,
    Server,
    has_free_slot,
    imbalanced,
    load_costs,
    pick,
    prefix_costs,
    residency_cost,
)
from gateway.upstream.scheduling.ticket import RouteTicket

#: Every reason a choice may give (the `reason` label's values).
REASONS = (
    "only",
    "least_in_flight",
    "round_robin",
    "prefix",
    "session",
    "residency",
    "load",
    "server",
    "balance_guard",
    "failover",
    "panic",
)

#: Weight of a new sample in a server's learned slot hold (an exponential moving average).
HOLD_ALPHA = 0.1

#: The bounds of one slot-hold sample, in seconds (`Scheduler.held`): a sample outside them
#: counts as the bound, so no single request moves the average by more than a tenth of them.
HOLD_MIN_SECONDS = 0.5
HOLD_MAX_SECONDS = 60.0

#: Session keys remembered (a few hundred bytes each at most).
SESSIONS = 4096

#: The most blocks one prompt is hashed into: a sixteenth of the index at most, and never more
#: than 512 (half a megabyte of text at the default block size, a longer context than local
#: models run), so a few huge prompts cannot flush everyone's prefixes out of the index.
PROMPT_BLOCKS = 512


def prompt_limit(index_blocks: int) -> int:
    """The blocks one prompt may take in an index of `index_blocks` (`PROMPT_BLOCKS`)."""
    return max(1, min(PROMPT_BLOCKS, index_blocks // 16))


class Monitored(Reporting, Protocol):
    """A server whose monitor counts the times it was seen going down (and keeps its report)."""

    @property
    def downs(self) -> int:
        """Times its monitor saw it go down."""
        ...


S = TypeVar("S", bound=Monitored)


class Scheduler:
    """Orders the candidates of each choice, and learns from what happens after.

    Args:
        policy: The policy, its score weights, guard thresholds and prefix index bounds.
        metrics: `gateway_route_decisions_total`, `gateway_route_prefix_hit_tokens`,
            `gateway_route_cold_loads_total`.
        servers: How many upstreams the pool has: with one, nothing is ever chosen, so no
            prompt is hashed or noted.
    """

    def __init__(self, policy: SchedulingPolicy, metrics: Metrics, servers: int = 2) -> None:
        self.policy = policy
        self.mode = policy.mode
        self._learns = policy.mode == "scored" and servers > 1
        self.weights = dict(policy.weights)
        self.weights["session"] = self.weights.get("prefix", 0.0)
        # The terms weighed at all (read once: `_scored` runs per request).
        self._weighed = {name for name, weight in self.weights.items() if weight > 0}
        self.prefixes = PrefixIndex(policy.prefix_blocks)
        self._prompt_blocks = prompt_limit(policy.prefix_blocks)
        self.sessions = SessionIndex(SESSIONS)
        self.residency = Residency()
        self._turn = 0
        #: Seconds a request holds its slot, per server: an exponential average (`held`).
        self.holds: dict[str, float] = {}
        self._downs: dict[str, int] = {}
        self._noted: set[str] = set()  # servers the indexes hold something for
        self._decisions = {reason: metrics.route_decisions.labels(reason) for reason in REASONS}
        self._prefix_hits = metrics.route_prefix_hit_tokens
        self._cold_loads = metrics.route_cold_loads

    def order(self, candidates: list[S], ticket: RouteTicket) -> tuple[list[S], str]:
        """The order to try `candidates` in (the pool's order, not empty), and why."""
        if len(candidates) == 1:
            return candidates, "only"
        if self.mode == "round_robin":
            turn = self._turn % len(candidates)
            self._turn += 1
            return candidates[turn:] + candidates[:turn], "round_robin"
        if self.mode == "scored":
            # Ties go to a random upstream: a random rotation (cheaper than a shuffle).
            turn = random.randrange(len(candidates))  # noqa: S311 - load spreading, not secrets
            return self._scored(candidates[turn:] + candidates[:turn], ticket)
        random.shuffle(candidates)  # ties go to a random upstream, not always the first
        return sorted(candidates, key=_in_flight), "least_in_flight"

    def _scored(self, candidates: list[S], ticket: RouteTicket) -> tuple[list[S], str]:
        """The `scored` order: the warm servers, the balance guard, the best total."""
        ticket.prefix_tokens = 0
        self._notice_downs(candidates)
        weighed = self._weighed
        model = ticket.model
        now = time.monotonic()
        state = self.residency.state
        states = [state(c, model, now) for c in candidates]
        narrowed = False
        # Warm servers, or loads under way, only where some state is known (cheaper).
        if "residency" in weighed and states.count(None) != len(states):
            # A server that reports its own queue has no free slot, whatever this gateway sent.
            reports = "server" in weighed

            def room(server: S) -> bool:
                return has_free_slot(server, model) and not (reports and queued_beyond(server, now))

            warm = [i for i, c in enumerate(candidates) if states[i] and room(c)]
            if warm:
                # Only the servers without the model are dropped: a warm one that is full may
                # still cost least (a slot's short wait against a long history to prefill
                # elsewhere), which the `load` and `prefix` costs weigh below.
                warm = [i for i, state in enumerate(states) if state]
            else:  # a load under way with room beats a second load elsewhere
                loading = self.residency.loading
                warm = [
                    i
                    for i, c in enumerate(candidates)
                    if states[i] is False and room(c) and loading(c.name, model, now) is not None
                ]
            if warm and len(warm) < len(candidates):
                candidates = [candidates[i] for i in warm]
                states = [states[i] for i in warm]
                narrowed = True
        if len(candidates) == 1:
            return candidates, "residency"
        policy = self.policy
        if imbalanced(candidates, policy.balance_abs_threshold, policy.balance_rel_threshold):
            return self._guarded(candidates, states, model, now), "balance_guard"
        # A cost equal everywhere cannot change the choice: it is left out (cheaper).
        affinity: dict[str, list[float]] = {}
        matched: list[int] = []
        if "prefix" in weighed:
            matched = self._prefix_terms(candidates, states, ticket, affinity)
        terms: dict[str, list[float]] = {}
        if "load" in weighed:
            # The request's own prefill on each: its prompt less what that server holds (only
            # where some prompt is being prefilled: else the clamp changes nothing).
            prefills = None
            if matched and any(c.prefills for c in candidates):
                prompt = max(0, ticket.tokens - ticket.output)
                prefills = [max(0, prompt - m // CHARS_PER_TOKEN) for m in matched]
            loads = load_costs(candidates, model, self.holds, prefills)
            if max(loads) != min(loads):
                terms["load"] = loads
        if "server" in weighed:
            reported = server_costs(candidates, ticket.tokens, now)
            if max(reported) != min(reported):
                terms["server"] = reported
        terms.update(affinity)
        if "residency" in weighed and _may_differ(states):
            costs = self._residency_costs(candidates, states, model, now)
            if max(costs) != min(costs):
                terms["residency"] = costs
        if not terms:  # a tie: the rotation already put a random one first
            return candidates, "residency" if narrowed else "load"
        best, reason = pick(terms, self.weights)
        if narrowed and reason in ("only", "load"):
            reason = "residency"  # the choice among the warm servers kept was a tie
        if matched:
            ticket.prefix_tokens = matched[best] // CHARS_PER_TOKEN
        rest = [c for i, c in enumerate(candidates) if i != best]
        return [candidates[best], *rest], reason

    def _guarded(
        self, candidates: list[S], states: Sequence[bool | None], model: str, now: float
    ) -> list[S]:
        """The balance guard's order: the least loaded, a cold load still counted.

        The guard overrides affinity (prefix, session), not residency: a cold load is work
        the idle server must do first, and sending it one to balance the counts would evict
        a model its own requests need.
        """
        costs: list[float] = []
        if self.weights.get("residency", 0) > 0 and _may_differ(states):
            costs = self._residency_costs(candidates, states, model, now)
        if not costs or max(costs) == min(costs):
            return sorted(candidates, key=_in_flight)
        terms = {"load": load_costs(candidates, model, self.holds), "residency": costs}
        best, _ = pick(terms, {"load": 1.0, "residency": self.weights["residency"]})
        return [candidates[best], *(c for i, c in enumerate(candidates) if i != best)]

    def _residency_costs(
        self, candidates: Sequence[S], states: Sequence[bool | None], model: str, now: float
    ) -> list[float]:
        """Each candidate's cold-load cost: none, the time left of a load under way, or one."""
        residency = self.residency
        size = residency.size(candidates, model)
        costs = []
        for server, state in zip(candidates, states, strict=True):
            left = residency.loading(server.name, model, now) if state is False else None
            seconds = residency.load_seconds(server.name, size) if left is None else left
            costs.append(residency_cost(state, seconds))
        return costs

    def _prefix_terms(
        self,
        candidates: Sequence[S],
        states: Sequence[bool | None],
        ticket: RouteTicket,
        terms: dict[str, list[float]],
    ) -> list[int]:
        """Add the `prefix` cost (or `session`, when no server matches); characters matched."""
        policy = self.policy
        blocks = ticket.blocks(policy.prefix_block_chars, self._prompt_blocks)
        matched = [0] * len(candidates)
        found = self.prefixes.match(blocks.hashes, [c.name for c in candidates])
        if found:
            ends = blocks.ends
            # A server without the model loaded holds no KV cache for it, whatever it was sent.
            matched = [
                0 if state is False or not (count := found.get(c.name, 0)) else ends[count - 1]
                for c, state in zip(candidates, states, strict=True)
            ]
        if any(matched):
            if matched.count(matched[0]) != len(matched):
                terms["prefix"] = prefix_costs(matched, blocks.chars)
        elif ticket.session is not None:
            last = self.sessions.get(ticket.session)
            if last is not None:
                # The session's server is taken to hold the prompt; the others to lack it.
                whole = blocks.chars / CHARS_PER_TOKEN
                terms["session"] = [0.0 if c.name == last else whole for c in candidates]
        return matched

    def _notice_downs(self, servers: Sequence[Monitored]) -> None:
        """Forget what a server was sent once its monitor saw it go down (back, it is empty)."""
        for server in servers:
            if self._downs.get(server.name, 0) != server.downs:
                self._downs[server.name] = server.downs
                self.forget(server.name)

    def chosen(
        self, server: Server, ticket: RouteTicket, reason: str, *, catalogued: bool = True
    ) -> None:
        """`server` takes the request, chosen for `reason`: count it, note its prompt.

        A cold load is noted as under way only for a model the server lists (`catalogued`):
        a name made up by a client must not pin other requests to a load that never starts.
        """
        ticket.reason = reason
        self._decisions[reason].inc()
        residency = self.residency
        if (
            residency.state(server, ticket.model) is False
            and residency.loading(server.name, ticket.model) is None
        ):
            self._cold_loads.labels(server.name).inc()
            if catalogued:
                size = residency.size([server], ticket.model)
                seconds = residency.load_seconds(server.name, size)
                residency.started(server.name, ticket.model, seconds)
        if not self._learns:
            return
        if "prefix" in self._weighed:
            self._prefix_hits.observe(ticket.prefix_tokens)
            blocks = ticket.blocks(self.policy.prefix_block_chars, self._prompt_blocks)
            if blocks.hashes:
                self.prefixes.record(blocks.hashes, server.name)
                self._noted.add(server.name)
            if ticket.session is not None:
                self.sessions.record(ticket.session, server.name)
                self._noted.add(server.name)

    def held(self, server: str, seconds: float) -> None:
        """A request on `server` held its slot `seconds` (its answer's start to its end).

        Folded, within `HOLD_MIN_SECONDS` and `HOLD_MAX_SECONDS`, into the server's average
        (`HOLD_ALPHA`), which the load cost's slot wait uses; learned only by the `scored`
        policy, the one that reads it.
        """
        if not self._learns or seconds < 0:
            return
        # Any key's requests teach every key's routing: one key's flood of one-token answers,
        # or one hour-long answer, must not make a server's queue look free or hopeless.
        seconds = min(max(seconds, HOLD_MIN_SECONDS), HOLD_MAX_SECONDS)
        known = self.holds.get(server)
        self.holds[server] = seconds if known is None else known + HOLD_ALPHA * (seconds - known)

    def forget(self, server: str) -> None:
        """Drop the prompts, sessions and loaded models noted for `server`."""
        self.residency.forget(server)
        if server in self._noted:
            self._noted.discard(server)
            self.prefixes.forget(server)
            self.sessions.forget(server)


def _may_differ(states: Sequence[bool | None]) -> bool:
    """Whether residency costs may differ: not all loaded, and not all unknown alike.

    Servers that all lack the model may still differ (a load under way, a faster load rate).
    """
    if False in states:
        return True
    return None in states and states.count(None) != len(states)


def _in_flight(server: Server) -> float:
    return server.in_flight / server.weight
