"""The scores a scored choice is made of, and the balance guard: pure functions, no state.

Each score rates every candidate server in [0, 1], higher is better, as llm-d's scorers do;
the policy adds them up weighted (`GATEWAY_ROUTING_SCORES`) and takes the best
(`gateway.upstream.scheduling.scheduler`).

- prefix: the share of the prompt (in characters, whole blocks) the server was recently
  sent (the Gateway API
  Inference Extension's prefix-cache scorer);
- load: the server's in-flight tokens and requests per weight, min-max normalised so the
  least loaded scores 1 and the most loaded 0 (its queue scorer's normalisation);
- residency: 1 where the model is loaded, 0.5 where unknown, at most 0.25 where a cold load is
  needed, the longer the load the less.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.upstream.scheduling.residency import Holder

#: The fixed cost of one request in flight, in tokens: a request's own share of a server's
#: batch beyond its tokens, so that many short requests still count as load.
REQUEST_TOKENS = 256

#: Requests a server without a configured gate runs at once: Ollama's `OLLAMA_NUM_PARALLEL`
#: picks 4 (or 1 with little memory) by default (Ollama FAQ); past it, requests queue.
DEFAULT_SLOTS = 4

#: Seconds of cold load that halve a cold server's residency score.
LOAD_SCALE_SECONDS = 10.0

#: Residency scores: loaded, unknown; a cold server scores below unknown.
WARM, UNKNOWN = 1.0, 0.5


class Server(Holder, Protocol):
    """What the scores read of a server (`gateway.upstream.pool.Upstream` is one)."""

    @property
    def in_flight(self) -> int:
        """Requests in flight to it from this process."""
        ...

    @property
    def tokens_in_flight(self) -> int:
        """Their estimated prompt and output tokens."""
        ...

    @property
    def weight(self) -> float:
        """Its share of the load (`GATEWAY_UPSTREAMS` `weight`)."""
        ...

    @property
    def capacity(self) -> int:
        """Requests its gate lets through at once; 0: no gate."""
        ...


def server_load(server: Server) -> float:
    """In-flight tokens plus `REQUEST_TOKENS` per request, per unit of weight."""
    return (server.tokens_in_flight + server.in_flight * REQUEST_TOKENS) / server.weight


def load_scores(loads: Sequence[float]) -> list[float]:
    """`(max - load) / (max - min)` for each load; all 1.0 when they are equal."""
    high, low = max(loads), min(loads)
    if high == low:
        return [1.0] * len(loads)
    return [(high - load) / (high - low) for load in loads]


def prefix_scores(matched: Sequence[int], chars: int) -> list[float]:
    """The share of the prompt's `chars` each server already had (`matched` characters each)."""
    if chars <= 0:
        return [0.0] * len(matched)
    return [count / chars for count in matched]


def residency_score(state: bool | None, load_seconds: float) -> float:
    """`WARM` when loaded, `UNKNOWN` when not known, else less, the longer the cold load."""
    if state is True:
        return WARM
    if state is None:
        return UNKNOWN
    return UNKNOWN * LOAD_SCALE_SECONDS / (LOAD_SCALE_SECONDS + load_seconds) / 2


def has_free_slot(server: Server) -> bool:
    """Whether another request would start at once: below its gate, or `DEFAULT_SLOTS`."""
    return server.in_flight < (server.capacity or DEFAULT_SLOTS)


def imbalanced(servers: Sequence[Server], abs_threshold: int, rel_threshold: float) -> bool:
    """SGLang's balance check: whether one server is far busier than another.

    True when the busiest server has more than `abs_threshold` requests in flight beyond the
    idlest, and more than `rel_threshold` times as many (per weight). When it holds, the
    router leaves cache affinity for the least loaded server (sgl-router's `cache_aware`
    policy, `balance_abs_threshold` and `balance_rel_threshold`; their defaults are 64 and
    1.5, for GPU servers batching hundreds of sequences).
    """
    loads = [server.in_flight / server.weight for server in servers]
    busiest, idlest = max(loads), min(loads)
    return busiest - idlest > abs_threshold and busiest > idlest * rel_threshold


def pick(terms: dict[str, list[float]], weights: dict[str, float]) -> tuple[int, str]:
    """The best candidate by the weighted sum of `terms`, and the term that decided it.

    Args:
        terms: Each score's values, one per candidate, in the candidates' order.
        weights: Each term's weight (a term without one, or with 0, is not counted).

    Returns:
        (index, reason): the first candidate with the highest total (the caller shuffles, so
        ties go to a random one); reason is the term whose weighted difference from the
        runner-up is the largest (`load` when every total is equal).
    """
    used = [(name, weights.get(name, 0.0), values) for name, values in terms.items()]
    used = [(name, weight, values) for name, weight, values in used if weight > 0]
    count = len(next(iter(terms.values()))) if terms else 0
    totals = [0.0] * count
    for _, weight, values in used:
        for i in range(count):
            totals[i] += weight * values[i]
    best = max(range(count), key=totals.__getitem__)
    if count < 2:
        return best, "only"
    second = max((i for i in range(count) if i != best), key=totals.__getitem__)
    if totals[second] >= totals[best]:
        return best, "load"
    reason, margin = "load", 0.0
    for name, weight, values in used:
        if weight * (values[best] - values[second]) > margin:
            reason, margin = name, weight * (values[best] - values[second])
    return best, reason
