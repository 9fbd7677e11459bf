"""Drives a target at one load level and returns what it measured (`shapes.Measurement`).

Owns the closed loop (`run_concurrency`: N workers, each sending its next prompt when its last
answer ended, or playing multi-turn conversations turn after turn with their growing history),
the open loop (`run_rate`: Poisson arrivals from a seeded generator, or a constant rate, capped
in flight, with the rate really achieved). Each worker is a
`gateway.clients.bench.exchange.Client`: one keep-alive connection, reopened after an error or a
close, each answer read into a `RequestRecord`. The checks before a run
(`check_target`, `cold_load`, `BenchError`) live in `gateway.clients.bench.preflight` and are
re-exported here, so the runner imports the whole engine from one place.

Warm-up: the first `warmup` requests of a run are flagged and left out of the statistics; the
measured window starts when the last of them ended (closed loop), so the counted requests meet
a server whose queue is already in its steady state, or at the first counted arrival (open
loop, where the schedule, not the answers, sets the load). A counted request already being
served when the window opens brings tokens made before it, and `stats.summarize` counts a
request's tokens by its end: a warm-up of at least one request per worker, in whole batches of
the server's parallel slots when they are known, leaves no such request, and counted requests
in whole batches keep the last batch full; otherwise the edge error is at most one batch of
answers over the window (duration mode has the mirror error at its end, so none on average).

Over ~300 lines for one reason: the closed loop (`run_concurrency`) and the open loop
(`run_rate`) are the two ways to drive one load level; they share the request feed (`_Requests`),
the mid-run refusal check (`_refused`) and the warm-up window rule above, which split apart
would be written twice.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from gateway.clients.bench import wire
from gateway.clients.bench.dataset import word_count
from gateway.clients.bench.exchange import Client, backoff
from gateway.clients.bench.health import TargetLost
from gateway.clients.bench.preflight import BenchError, check_target, cold_load
from gateway.clients.bench.protocol import Target, build_request
from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.shapes import Measurement
from gateway.clients.bench.workload import Conversation, Prompt, Workload

Arrivals = Literal["poisson", "constant"]
"""The open loop's schedule: Poisson (exponential gaps, seeded) or constant (equal gaps)."""

__all__ = [
    "CAP_REACHED",
    "HOLD_AFTER",
    "NOT_SENT_BACKOFF",
    "Arrivals",
    "BenchError",
    "Progress",
    "arrival_offsets",
    "check_target",
    "cold_load",
    "run_concurrency",
    "run_rate",
]


class Progress(Protocol):
    """What `gateway.clients.bench.progress` shows while a level runs."""

    def __call__(self, done: int, total: int, failed: int, *, sent: int | None = None) -> None:
        """Called after each counted request.

        Args:
            done: Counted requests finished.
            total: Counted requests planned; 0 in duration mode.
            failed: Counted requests failed.
            sent: Counted arrivals sent so far (open loop only; None in a closed loop).
        """


Watch = Callable[[RequestRecord], None]
"""Sees every answered request; raises `health.TargetLost` to stop the run (`health.DownWatch`)."""

CAP_REACHED = "in-flight cap reached"
#: The open loop: failures in a row (without `Retry-After`) after which arrivals are held back.
HOLD_AFTER = 3
#: The open loop: the error of an arrival held back by the backoff.
NOT_SENT_BACKOFF = "not sent: backing off after failures in a row"


@dataclass(frozen=True, slots=True)
class _Request:
    """One request ready to send, with what its record notes."""

    prompt_id: str
    data: bytes
    max_tokens: int
    prompt_words: int
    turn: int | None = None


def _words(prompt: Prompt) -> int:
    return sum(word_count(str(m.get("content", ""))) for m in prompt.as_messages())


class _Requests:
    """The workload's prompts round-robin, each request encoded once."""

    def __init__(self, target: Target, workload: Workload, model: str, keep_alive: Any) -> None:
        self._target, self._model, self._keep_alive = target, model, keep_alive
        self._sampling = workload.sampling
        self._head = target.headers()
        self._encoded = {prompt.id: self.encode(prompt) for prompt in workload.prompts}
        self._cycle = workload.cycle()

    def encode(self, prompt: Prompt, turn: int | None = None) -> _Request:
        """`prompt` as request bytes for this target and model."""
        target = self._target
        path, body = build_request(
            target, self._model, prompt, self._sampling, keep_alive=self._keep_alive
        )
        data = wire.request_bytes("POST", target.host, target.port, path, body, self._head)
        limit = prompt.max_tokens or self._sampling.max_tokens
        return _Request(prompt.id, data, limit, _words(prompt), turn)

    def next(self) -> _Request:
        """The next prompt's request."""
        return self._encoded[next(self._cycle).id]


#: Characters of a kept answer per token asked: far above any real token (about 4), so only a
#: server that sent far more than `max_tokens` is cut (its history must not grow with it).
ANSWER_CHARS_PER_TOKEN = 16
#: Characters a conversation's history may reach; past it the conversation ends (the next
#: one starts), as it does after a failed turn.
MAX_HISTORY = 4 << 20
#: Turns played of one conversation; the rest are not sent.
MAX_TURNS = 1000


class _Dialogue:
    """One worker's place in a multi-turn conversation: its history so far.

    Bounded whatever the data set or the server send: each kept answer to
    `ANSWER_CHARS_PER_TOKEN` characters per token asked, the history to `MAX_HISTORY`
    characters, the conversation to `MAX_TURNS` turns.
    """

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.turn = 0  # turns sent
        self.history: list[dict[str, Any]] = []
        self.size = 0  # characters of the history's contents
        if conversation.system is not None:
            self._add("system", conversation.system)

    def _add(self, role: str, content: str) -> None:
        self.history.append({"role": role, "content": content})
        self.size += len(content)

    @property
    def finished(self) -> bool:
        turns = min(len(self.conversation.turns), MAX_TURNS)
        return self.turn >= turns or self.size > MAX_HISTORY

    def ask(self, requests: _Requests) -> _Request:
        """The next turn's request: the history, then the turn's user message."""
        turn = self.conversation.turns[self.turn]
        self.turn += 1
        self._add("user", turn.text)
        prompt = Prompt(
            f"{self.conversation.id}-{self.turn}",
            messages=tuple(dict(m) for m in self.history),
            max_tokens=turn.max_tokens,
        )
        return requests.encode(prompt, self.turn)

    def answered(self, text: str, max_tokens: int) -> None:
        """Append the answer the server gave to the last turn (cut to its token allowance)."""
        self._add("assistant", text[: max_tokens * ANSWER_CHARS_PER_TOKEN])


def _check_amount(duration: float | None, requests: int | None, warmup: int) -> None:
    if (duration is None) == (requests is None):
        raise ValueError("give exactly one of duration and requests")
    if duration is not None and not duration > 0:
        raise ValueError(f"duration must be positive, got {duration}")
    if requests is not None and requests < 1:
        raise ValueError(f"requests must be at least 1, got {requests}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")


def _refused(record: RequestRecord) -> None:
    """Stop the run when the target refuses the key mid-run (revoked, expired).

    Every further request would only be refused too.

    Raises:
        BenchError: the answer's status is 401 or 403.
    """
    if record.status in (401, 403):
        raise BenchError(
            f"the target refused the key during the run ({record.status}): "
            "was it revoked or did it expire?"
        )


def _measurement(records: list[RequestRecord], start: float, end: float) -> Measurement:
    records.sort(key=lambda r: r.start)
    return Measurement(records, start, max(end, start + 1e-6))


async def run_concurrency(
    target: Target,
    workload: Workload,
    model: str,
    concurrency: int,
    *,
    duration: float | None = None,
    requests: int | None = None,
    warmup: int = 0,
    keep_alive: str | int | None = None,
    progress: Progress | None = None,
    watch: Watch | None = None,
) -> Measurement:
    """Closed loop: `concurrency` workers, each sending the next prompt when its answer ended.

    A multi-turn workload (`workload.conversations`): each worker takes the next conversation
    (round-robin) and sends its turns one after the other, each with the whole history so far
    (the system message, every earlier user message and the answer the server gave, the new
    user message); a finished conversation is followed by the next one, and so is a failed
    turn (there is no answer to resend). Every turn is one
    request (of `requests` and `warmup`); its record notes the turn and the prompt's words.

    Args:
        target: The server.
        workload: The prompts (round-robin over all workers) and sampling.
        model: The model to ask.
        concurrency: Workers, at least 1.
        duration: Seconds of the measured window; no request starts after it, those in flight
            are awaited and kept (`stats.summarize` counts throughput by end time).
        requests: Counted requests to send instead; the window ends with the last one.
        warmup: Requests sent first (spread over the workers), flagged and not measured; the
            window starts when the last of them ended.
        keep_alive: Ollama's `keep_alive` on every request.
        progress: Called after each counted request.
        watch: Sees every answered request and may stop the run (`health.DownWatch`).

    Returns:
        Every record (warm-up included, by start time) and the window.

    Raises:
        ValueError: not exactly one of `duration` and `requests`, or a bad count.
        health.TargetLost: `watch` stopped the run; its `measurement` holds what was measured.
    """
    _check_amount(duration, requests, warmup)
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    prepared = _Requests(target, workload, model, keep_alive)
    total = None if requests is None else warmup + requests
    records: list[RequestRecord] = []
    clock = time.perf_counter
    begin = clock()
    state = {"issued": 0, "warm_done": 0, "counted": 0, "failed": 0}
    window: list[float | None] = [begin if warmup == 0 else None, None]
    if warmup == 0 and duration is not None:
        window[1] = begin + duration

    def take() -> int | None:
        index = state["issued"]
        if total is not None and index >= total:
            return None
        end = window[1]
        if index >= warmup and end is not None and clock() >= end:
            return None
        state["issued"] = index + 1
        return index

    conversations = itertools.cycle(workload.conversations)

    async def work(client: Client) -> None:
        dialogue: _Dialogue | None = None
        while (index := take()) is not None:
            if workload.conversations:
                if dialogue is None or dialogue.finished:
                    dialogue = _Dialogue(next(conversations))
                request = dialogue.ask(prepared)
            else:
                request = prepared.next()
            warm = index < warmup
            record = await client.exchange(
                request.data,
                model,
                request.prompt_id,
                warm,
                max_tokens=request.max_tokens,
                keep_text=dialogue is not None,
                prompt_words=request.prompt_words,
                turn=request.turn,
            )
            if dialogue is not None:
                if record.ok:
                    limit = request.max_tokens or workload.sampling.max_tokens
                    dialogue.answered(client.last_text, limit)
                else:  # no answer to resend: the conversation ends, the next one starts
                    dialogue = None
            records.append(record)
            if warm:
                state["warm_done"] += 1
                if state["warm_done"] == warmup:  # the last warm-up answer: the window opens
                    opened = window[0] = clock()
                    if duration is not None:
                        window[1] = opened + duration
            else:
                state["counted"] += 1
                state["failed"] += not record.ok
                if progress is not None:
                    progress(state["counted"], requests or 0, state["failed"])
            _refused(record)
            if watch is not None:
                watch(record)
            pause = client.pause(record)
            if pause:
                await asyncio.sleep(pause)

    clients = [Client(target, workload.sampling.max_tokens) for _ in range(concurrency)]
    try:
        async with asyncio.TaskGroup() as group:
            for client in clients:
                group.create_task(work(client))
    except* BenchError as refused:
        raise refused.exceptions[0] from None
    except* TargetLost as lost:
        raise _cut(lost.exceptions[0], records, window[0] or begin) from None
    finally:
        for client in clients:
            client.close()
    start = window[0] if window[0] is not None else clock()
    counted_ends = [r.end for r in records if not r.warmup]
    end = window[1] if duration is not None else max(counted_ends, default=start)
    return _measurement(records, start, end if end is not None else start)


def arrival_offsets(
    rate: float, seed: int = 1234, arrivals: Arrivals = "poisson"
) -> Iterator[float]:
    """Arrivals: seconds from the run's start, 0 first, then gaps of mean 1 / `rate`.

    Poisson: exponential gaps; the same `rate` and `seed` give the same schedule
    (`random.Random(seed).expovariate`). Constant: every gap 1 / `rate` (offset n is n / rate,
    computed so, without summing rounding errors).

    Raises:
        ValueError: `rate` not positive, or an unknown `arrivals`.
    """
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if arrivals == "constant":
        return (n / rate for n in itertools.count())
    if arrivals != "poisson":
        raise ValueError(f"arrivals are poisson or constant, got {arrivals!r}")
    return _poisson(rate, seed)


def _poisson(rate: float, seed: int) -> Iterator[float]:
    generator = random.Random(seed)  # noqa: S311 - a load schedule, not a secret
    offset = 0.0
    while True:
        yield offset
        offset += generator.expovariate(rate)


def achieved_rate(sent: list[float]) -> float | None:
    """Requests/s the client really sent at: (n - 1) over the time from the first to the last.

    `sent` are the perf_counter seconds each counted arrival left (or was refused by the
    client's cap); None with fewer than two. Compared with the requested rate it shows a load
    generator that fell behind its schedule.
    """
    if len(sent) < 2 or sent[-1] <= sent[0]:
        return None
    return (len(sent) - 1) / (sent[-1] - sent[0])


async def run_rate(
    target: Target,
    workload: Workload,
    model: str,
    rate: float,
    *,
    duration: float | None = None,
    requests: int | None = None,
    seed: int = 1234,
    max_in_flight: int = 256,
    warmup: int = 0,
    keep_alive: str | int | None = None,
    progress: Progress | None = None,
    arrivals: Arrivals = "poisson",
    watch: Watch | None = None,
) -> Measurement:
    """Open loop: requests arrive on a seeded Poisson (or constant) schedule at `rate` per second.

    The measurement carries the rate the counted arrivals really left at (`achieved_rate`).
    A multi-turn workload is refused: a turn waits for the previous answer, which a schedule
    of independent arrivals cannot honour (run conversations in a closed loop).

    An arrival that finds `max_in_flight` requests unanswered is not sent: it becomes a failed
    record with the error "in-flight cap reached" (the client's limit, not the server's). So is
    an arrival while the target asked to wait (a positive `Retry-After`, error "not sent: the
    server asked to wait N s") or while backing off after `HOLD_AFTER` or more failures in a
    row (`exchange.backoff`, error `NOT_SENT_BACKOFF`): the error rate shows the overload and
    the target is not hammered. The
    first `warmup` arrivals are flagged warm-up; the window starts at the first counted
    arrival's scheduled time and ends `duration` seconds later (arrivals stop there; answers in
    flight are awaited), or with the last counted answer (`requests`).

    `watch` sees every answered request and may stop the run (`health.DownWatch`).

    Raises:
        ValueError: a bad rate, cap or count; not exactly one of `duration` and `requests`; a
            multi-turn workload.
        health.TargetLost: `watch` stopped the run; its `measurement` holds what was measured.
    """
    _check_amount(duration, requests, warmup)
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
    if workload.conversations:
        raise ValueError("multi-turn conversations run in a closed loop (--concurrency)")
    prepared = _Requests(target, workload, model, keep_alive)
    schedule = arrival_offsets(rate, seed, arrivals)
    sent: list[float] = []
    records: list[RequestRecord] = []
    idle: list[Client] = []
    everyone: list[Client] = []
    counted = [0, 0]  # finished, failed
    clock = time.perf_counter
    begin = clock()
    window: list[float | None] = [begin if warmup == 0 else None, None]
    # Failures in a row, and until when (perf_counter seconds) arrivals are held back, why.
    hold: dict[str, Any] = {"failures": 0, "until": 0.0, "reason": ""}

    def held_back(record: RequestRecord, retry_after: float | None) -> None:
        if record.ok:
            hold["failures"] = 0
            return
        hold["failures"] += 1
        asked = retry_after is not None and retry_after > 0
        if not asked and hold["failures"] < HOLD_AFTER:
            return  # one failure among successes is the server's answer, not a reason to stop
        until = clock() + backoff(hold["failures"], retry_after)
        if until > hold["until"]:
            hold["until"] = until
            hold["reason"] = (
                f"not sent: the server asked to wait {retry_after:g} s"
                if asked
                else NOT_SENT_BACKOFF
            )

    async def one(client: Client, request: _Request, warm: bool) -> None:
        try:
            record = await client.exchange(
                request.data,
                model,
                request.prompt_id,
                warm,
                max_tokens=request.max_tokens,
                prompt_words=request.prompt_words,
            )
            records.append(record)
        finally:
            idle.append(client)
        _refused(record)
        if watch is not None:
            watch(record)
        held_back(record, client.retry_after)
        if not warm:
            counted[0] += 1
            counted[1] += not record.ok
            if progress is not None:
                progress(counted[0], requests or 0, counted[1], sent=len(sent))

    try:
        async with asyncio.TaskGroup() as group:
            for index, offset in enumerate(schedule):
                at = begin + offset
                if index == warmup:
                    window[0] = at
                    if duration is not None:
                        window[1] = at + duration
                end = window[1]
                if requests is not None and index >= warmup + requests:
                    break
                if end is not None and index >= warmup and (at >= end or clock() >= end):
                    # On the clock too: a client behind its schedule (a rate it cannot send)
                    # would otherwise go on past the window for as long as it lags.
                    break
                await asyncio.sleep(max(0.0, at - clock()))
                request = prepared.next()
                prompt_id = request.prompt_id
                warm = index < warmup
                now = clock()
                if not warm:
                    sent.append(now)
                if now < hold["until"]:
                    records.append(_capped(now, model, prompt_id, warm, hold["reason"]))
                    continue
                if len(everyone) - len(idle) >= max_in_flight:
                    records.append(_capped(now, model, prompt_id, warm))
                    continue
                if not idle:
                    everyone.append(Client(target, workload.sampling.max_tokens))
                    idle.append(everyone[-1])
                group.create_task(one(idle.pop(), request, warm))
    except* BenchError as refused:
        raise refused.exceptions[0] from None
    except* TargetLost as lost:
        raise _cut(lost.exceptions[0], records, window[0] or begin) from None
    finally:
        for client in everyone:
            client.close()
    start = window[0] if window[0] is not None else clock()
    counted_ends = [r.end for r in records if not r.warmup]
    end = window[1] if duration is not None else max(counted_ends, default=start)
    measured = _measurement(records, start, end if end is not None else start)
    return replace(measured, offered_rate=rate, achieved_rate=achieved_rate(sent))


def _cut(lost: BaseException, records: list[RequestRecord], start: float) -> BaseException:
    """`lost` (a `TargetLost`) with the run measured until now attached."""
    if isinstance(lost, TargetLost):
        lost.measurement = _measurement(records, start, time.perf_counter())
    return lost


def _capped(
    now: float, model: str, prompt_id: str, warmup: bool, error: str = CAP_REACHED
) -> RequestRecord:
    """The failed record of an arrival the open loop did not send (`error` says why)."""
    return RequestRecord(
        start=now,
        end=now,
        ok=False,
        status=None,
        error=error,
        first_token=None,
        chunk_times=(),
        output_tokens=None,
        output_source="client",
        model=model,
        prompt_id=prompt_id,
        warmup=warmup,
    )
