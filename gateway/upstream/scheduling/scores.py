"""The costs a scored choice is made of, and the balance guard: pure functions, no state.

Each term is a cost in tokens of work, per candidate server, lower is better; the policy adds
them up weighted (`GATEWAY_ROUTING_SCORES`) and takes the cheapest
(`gateway.upstream.scheduling.scheduler`). Costs in one unit, not scores normalised per term,
as NVIDIA Dynamo's KV router weighs a worker (`overlap_score_weight` x the prefill blocks a
request still needs there + the worker's active decode blocks, ai-dynamo/dynamo docs "KV cache
routing"): a prompt prefix another server must prefill again is then weighed against the work
already running where the prefix is, so a shared system prompt cached everywhere decides
nothing, and a busy server loses a conversation only when its queue outweighs the history the
others would have to prefill. (Scores min-max normalised per term, as llm-d's scorers are,
made the smallest load difference weigh as much as the largest: on the routing benchmark the
policy then did exactly what least-in-flight does.)

- prefix: the prompt's estimated tokens the server was not recently sent (whole blocks);
- load: the server's in-flight tokens (a prompt until its first chunk, and at most the
  request's own prefill there) plus `REQUEST_TOKENS` per request, per weight, and,
  for a request that would wait for a slot, the wait (a slot's hold, learned per server, over
  the slots, per request ahead of it, at `LOAD_TOKENS_PER_SECOND`; the slots are the gate's,
  else Ollama's per model);
- residency: 0 where the model is loaded; where it must load, its load time at
  `LOAD_TOKENS_PER_SECOND` (the prefill a GPU server could have done meanwhile), half a
  `LOAD_SCALE_SECONDS` load where the state is unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from gateway.upstream.scheduling.residency import Holder

#: The fixed cost of one request in flight, in tokens: a request's own share of a server's
#: batch beyond its tokens, so that many short requests still count as load.
REQUEST_TOKENS = 256

#: Requests of one model a server without a configured gate runs at once: Ollama's
#: `OLLAMA_NUM_PARALLEL`, "the maximum number of parallel requests each model will process at
#: the same time", picks 4 (or 1 with little memory) by default (Ollama FAQ); past it, that
#: model's requests queue while another loaded model's may still start.
DEFAULT_SLOTS = 4

#: Seconds of cold load assumed where nobody knows whether the model is loaded (half of it is
#: the expected cost: loaded or not, even odds).
LOAD_SCALE_SECONDS = 10.0

#: Tokens a second of cold load costs: the prefill a GPU server does meanwhile (thousands of
#: tokens/s for an 8B model: the emulator's preset, gateway.testing.emulator.profiles).
LOAD_TOKENS_PER_SECOND = 2000.0

#: Seconds a request holds its slot, from the server's answer to its end, before one was
#: measured on a server (`Scheduler.held` learns it per server): a 256-token answer at about
#: 25 tokens/s, a local 8B model's decode with its slots busy.
DEFAULT_HOLD_SECONDS = 10.0

#: Estimated characters per token (`gateway.limits.estimate.BYTES_PER_TOKEN`, for ASCII).
CHARS_PER_TOKEN = 4


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
    def prefills(self) -> Sequence[int]:
        """Of `tokens_in_flight`, each unanswered request's prompt tokens (being prefilled)."""
        ...

    @property
    def weight(self) -> float:
        """Its share of the load (`GATEWAY_UPSTREAMS` `weight`)."""
        ...

    @property
    def capacity(self) -> int:
        """Requests its gate lets through at once; 0: no gate."""
        ...

    def model_in_flight(self, model: str) -> int:
        """Requests in flight to it from this process for `model` (as the client named it)."""
        ...


def server_load(server: Server, prefill: float | None = None) -> float:
    """In-flight tokens plus `REQUEST_TOKENS` per request, per unit of weight.

    With `prefill` (the newcomer's own prompt tokens to prefill there), each prompt being
    prefilled counts at most that much: a GPU prefills the prompts it has together (the
    emulator preset's shared rate, llama.cpp's batch), so one far longer than the newcomer's
    delays it by about the newcomer's own size, not its whole length.
    """
    tokens: float = server.tokens_in_flight
    if prefill is not None:
        tokens -= sum(max(0.0, held - prefill) for held in server.prefills)
    return (tokens + server.in_flight * REQUEST_TOKENS) / server.weight


def _waiting(server: Server, model: str) -> int:
    """Requests ahead of one more for `model` once the slots are taken (<= 0: one is free).

    With a gate (`capacity`), its slots are the server's; without one, Ollama's per model
    (`DEFAULT_SLOTS`).
    """
    if server.capacity:
        return server.in_flight + 1 - server.capacity
    return server.model_in_flight(model) + 1 - DEFAULT_SLOTS


def queue_cost(server: Server, model: str, hold_seconds: float = DEFAULT_HOLD_SECONDS) -> float:
    """One more request's wait for a slot for `model`, in tokens; 0 while a slot is free.

    Each request ahead of it waits a slot's hold (`hold_seconds`) shared by the slots (one
    frees every hold / slots seconds, on average), turned into tokens at
    `LOAD_TOKENS_PER_SECOND`.
    """
    waiting = _waiting(server, model)
    if waiting <= 0:
        return 0.0
    slots = server.capacity or DEFAULT_SLOTS
    return waiting * hold_seconds / slots * LOAD_TOKENS_PER_SECOND / server.weight


def load_costs(
    servers: Sequence[Server],
    model: str,
    holds: Mapping[str, float] | None = None,
    prefills: Sequence[float] | None = None,
) -> list[float]:
    """Each server's work in tokens (`server_load`) and one more request's wait for a slot.

    The same sums as `server_load` + `queue_cost`, to the last bit, written out: it runs per
    candidate per request, and reads each server's counts once.

    Args:
        servers: The candidates.
        model: The request's model (slots without a gate are per model).
        holds: Seconds a request holds a slot, per server name, where measured.
        prefills: The request's own prompt tokens to prefill on each (None: unknown).
    """
    holds = holds or {}
    costs = []
    for i, server in enumerate(servers):
        in_flight = server.in_flight
        weight = server.weight
        tokens: float = server.tokens_in_flight
        if prefills is not None:  # `server_load`'s clamp, written out
            prefill = prefills[i]
            for held in server.prefills:
                if held > prefill:
                    tokens -= held - prefill
        cost = (tokens + in_flight * REQUEST_TOKENS) / weight
        capacity = server.capacity
        if capacity:
            waiting = in_flight + 1 - capacity
        else:
            waiting = server.model_in_flight(model) + 1 - DEFAULT_SLOTS
            capacity = DEFAULT_SLOTS
        if waiting > 0:
            hold = holds.get(server.name, DEFAULT_HOLD_SECONDS)
            cost += waiting * hold / capacity * LOAD_TOKENS_PER_SECOND / weight
        costs.append(cost)
    return costs


def prefix_costs(matched: Sequence[int], chars: int) -> list[float]:
    """The prompt's tokens each server must still prefill (`matched` of its `chars` it had)."""
    return [max(0, chars - count) / CHARS_PER_TOKEN for count in matched]


def residency_cost(state: bool | None, load_seconds: float) -> float:
    """A cold load's cost in tokens: its seconds at `LOAD_TOKENS_PER_SECOND`.

    0 when the model is loaded; half a `LOAD_SCALE_SECONDS` load when nobody knows.
    """
    if state is True:
        return 0.0
    if state is None:
        return LOAD_SCALE_SECONDS * LOAD_TOKENS_PER_SECOND / 2
    return load_seconds * LOAD_TOKENS_PER_SECOND


def has_free_slot(server: Server, model: str) -> bool:
    """Whether another request for `model` would start at once (`_waiting`)."""
    return _waiting(server, model) <= 0


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
    """The cheapest candidate by the weighted sum of `terms`, and the term that decided it.

    Args:
        terms: Each cost's values in tokens, one per candidate, in the candidates' order.
        weights: Each term's weight (a term without one, or with 0, is not counted).

    Returns:
        (index, reason): the first candidate with the lowest total (the caller rotates the
        candidates at random, so ties go to a random one); reason is the term that saves the
        most, weighted, against the runner-up (`load` when every total is equal).
    """
    used = []
    totals: list[float] | None = None
    for name, values in terms.items():
        weight = weights.get(name, 0.0)
        if weight > 0:
            used.append((name, weight, values))
            if totals is None:
                totals = [0.0 + weight * value for value in values]
            else:
                totals = [
                    total + weight * value for total, value in zip(totals, values, strict=True)
                ]
    if totals is None:
        totals = [0.0] * (len(next(iter(terms.values()))) if terms else 0)
    count = len(totals)
    lowest = min(totals)
    best = totals.index(lowest)
    if count < 2:
        return best, "only"
    others = totals[:best] + totals[best + 1 :]
    runner_up = min(others)
    second = others.index(runner_up)
    second += second >= best
    if runner_up <= lowest:
        return best, "load"
    reason, margin = "load", 0.0
    for name, weight, values in used:
        saved = weight * (values[second] - values[best])
        if saved > margin:
            reason, margin = name, saved
    return best, reason
