"""Drives a target at one load level and returns what it measured (`shapes.Measurement`).

Owns the closed loop (`run_concurrency`: N workers, each sending its next prompt when its last
answer ended), the open loop (`run_rate`: Poisson arrivals from a seeded generator, capped in
flight), and the checks before a run (`check_target`: reachable, key accepted, model present,
what the server is; `cold_load`: an Ollama model's load time). Each worker holds one keep-alive
connection (`gateway.bench.wire`), reopened after an error or a close; each answer is read by a
`gateway.bench.protocol.AnswerReader` into a `RequestRecord`.

Warm-up: the first `warmup` requests of a run are flagged and left out of the statistics; the
measured window starts when the last of them ended (closed loop), so the counted requests meet
a server whose queue is already in its steady state, or at the first counted arrival (open
loop, where the schedule, not the answers, sets the load). A counted request already being
served when the window opens brings tokens made before it, and `stats.summarize` counts a
request's tokens by its end: a warm-up of at least one request per worker, in whole batches of
the server's parallel slots when they are known, leaves no such request, and counted requests
in whole batches keep the last batch full; otherwise the edge error is at most one batch of
answers over the window (duration mode has the mirror error at its end, so none on average).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import httptools

from gateway.bench import wire
from gateway.bench.protocol import AnswerReader, Target, build_request, error_text
from gateway.bench.records import RequestRecord
from gateway.bench.shapes import Measurement
from gateway.bench.stats import escape_error
from gateway.bench.workload import Prompt, Sampling, Workload

Progress = Callable[[int, int], None]
"""Called with (counted requests finished, counted requests planned; 0 in duration mode)."""

CAP_REACHED = "in-flight cap reached"
#: Seconds a worker pauses after a failed connection, so a dead target is no busy loop.
RETRY_PAUSE = 0.05
#: Seconds to connect, and to answer a check before a run.
CONNECT_TIMEOUT = 10.0


class BenchError(RuntimeError):
    """The target cannot be benchmarked: unreachable, the key refused, the model unknown."""


class _Client:
    """One worker's keep-alive connection to the target, reopened when it is lost."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.connection: wire.Connection | None = None

    async def exchange(
        self, request: bytes, model: str, prompt_id: str, warmup: bool
    ) -> RequestRecord:
        """Send one request and read its answer into a record; never raises for the target."""
        target, reader = self.target, AnswerReader(self.target.api)
        clock = time.perf_counter
        start = clock()
        connection = self.connection
        failure: str | None = None
        try:
            if connection is None or not connection.reusable:
                self.close()
                connection = self.connection = await wire.connect(
                    target.host, target.port, tls=target.tls, timeout=CONNECT_TIMEOUT
                )
                start = clock()
            live = connection

            def sink(piece: bytes) -> None:
                if live.status == 200:
                    reader.feed(piece, clock())
                else:
                    reader.feed_error(piece)

            await connection.send(request, sink, timeout=target.timeout)
        except TimeoutError:
            failure = f"no end of answer within {target.timeout:g} s"
        except (OSError, httptools.HttpParserError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        end = clock()
        reader.close(end)
        status = connection.status or None if connection is not None else None
        if connection is None or not connection.reusable:
            self.close()
        return reader.record(start, end, status, model, prompt_id, warmup, failure=failure)

    def close(self) -> None:
        """Drop the connection."""
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.close()


class _Requests:
    """The workload's prompts round-robin, each request encoded once."""

    def __init__(self, target: Target, workload: Workload, model: str, keep_alive: Any) -> None:
        head = target.headers()
        encoded: dict[str, bytes] = {}
        for prompt in workload.prompts:
            path, body = build_request(
                target, model, prompt, workload.sampling, keep_alive=keep_alive
            )
            encoded[prompt.id] = wire.request_bytes(
                "POST", target.host, target.port, path, body, head
            )
        self._encoded = encoded
        self._cycle = workload.cycle()

    def next(self) -> tuple[str, bytes]:
        """The next prompt's id and request bytes."""
        prompt = next(self._cycle)
        return prompt.id, self._encoded[prompt.id]


def _check_amount(duration: float | None, requests: int | None, warmup: int) -> None:
    if (duration is None) == (requests is None):
        raise ValueError("give exactly one of duration and requests")
    if duration is not None and not duration > 0:
        raise ValueError(f"duration must be positive, got {duration}")
    if requests is not None and requests < 1:
        raise ValueError(f"requests must be at least 1, got {requests}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")


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
) -> Measurement:
    """Closed loop: `concurrency` workers, each sending the next prompt when its answer ended.

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

    Returns:
        Every record (warm-up included, by start time) and the window.

    Raises:
        ValueError: not exactly one of `duration` and `requests`, or a bad count.
    """
    _check_amount(duration, requests, warmup)
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    prepared = _Requests(target, workload, model, keep_alive)
    total = None if requests is None else warmup + requests
    records: list[RequestRecord] = []
    clock = time.perf_counter
    begin = clock()
    state = {"issued": 0, "warm_done": 0, "counted": 0}
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

    async def work(client: _Client) -> None:
        while (index := take()) is not None:
            prompt_id, request = prepared.next()
            warm = index < warmup
            record = await client.exchange(request, model, prompt_id, warm)
            records.append(record)
            if warm:
                state["warm_done"] += 1
                if state["warm_done"] == warmup:  # the last warm-up answer: the window opens
                    opened = window[0] = clock()
                    if duration is not None:
                        window[1] = opened + duration
            else:
                state["counted"] += 1
                if progress is not None:
                    progress(state["counted"], requests or 0)
            if record.status is None:
                await asyncio.sleep(RETRY_PAUSE)

    clients = [_Client(target) for _ in range(concurrency)]
    try:
        async with asyncio.TaskGroup() as group:
            for client in clients:
                group.create_task(work(client))
    finally:
        for client in clients:
            client.close()
    start = window[0] if window[0] is not None else clock()
    counted_ends = [r.end for r in records if not r.warmup]
    end = window[1] if duration is not None else max(counted_ends, default=start)
    return _measurement(records, start, end if end is not None else start)


def arrival_offsets(rate: float, seed: int = 1234) -> Iterator[float]:
    """Poisson arrivals: seconds from the run's start, 0 first, then exponential gaps.

    The same `rate` and `seed` give the same schedule (`random.Random(seed).expovariate`).

    Raises:
        ValueError: `rate` not positive.
    """
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    generator = random.Random(seed)  # noqa: S311 - a load schedule, not a secret
    offset = 0.0
    while True:
        yield offset
        offset += generator.expovariate(rate)


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
) -> Measurement:
    """Open loop: requests arrive on a seeded Poisson schedule at `rate` per second.

    An arrival that finds `max_in_flight` requests unanswered is not sent: it becomes a failed
    record with the error "in-flight cap reached" (the client's limit, not the server's). The
    first `warmup` arrivals are flagged warm-up; the window starts at the first counted
    arrival's scheduled time and ends `duration` seconds later (arrivals stop there; answers in
    flight are awaited), or with the last counted answer (`requests`).

    Raises:
        ValueError: a bad rate, cap or count; not exactly one of `duration` and `requests`.
    """
    _check_amount(duration, requests, warmup)
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
    prepared = _Requests(target, workload, model, keep_alive)
    schedule = arrival_offsets(rate, seed)
    records: list[RequestRecord] = []
    idle: list[_Client] = []
    everyone: list[_Client] = []
    counted = [0]
    clock = time.perf_counter
    begin = clock()
    window: list[float | None] = [begin if warmup == 0 else None, None]

    async def one(client: _Client, request: bytes, prompt_id: str, warm: bool) -> None:
        try:
            records.append(await client.exchange(request, model, prompt_id, warm))
        finally:
            idle.append(client)
        if not warm:
            counted[0] += 1
            if progress is not None:
                progress(counted[0], requests or 0)

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
                if end is not None and index >= warmup and at >= end:
                    break
                await asyncio.sleep(max(0.0, at - clock()))
                prompt_id, request = prepared.next()
                warm = index < warmup
                if len(everyone) - len(idle) >= max_in_flight:
                    now = clock()
                    records.append(_capped(now, model, prompt_id, warm))
                    continue
                if not idle:
                    everyone.append(_Client(target))
                    idle.append(everyone[-1])
                group.create_task(one(idle.pop(), request, prompt_id, warm))
    finally:
        for client in everyone:
            client.close()
    start = window[0] if window[0] is not None else clock()
    counted_ends = [r.end for r in records if not r.warmup]
    end = window[1] if duration is not None else max(counted_ends, default=start)
    return _measurement(records, start, end if end is not None else start)


def _capped(now: float, model: str, prompt_id: str, warmup: bool) -> RequestRecord:
    return RequestRecord(
        start=now,
        end=now,
        ok=False,
        status=None,
        error=CAP_REACHED,
        first_token=None,
        chunk_times=(),
        output_tokens=None,
        output_source="client",
        model=model,
        prompt_id=prompt_id,
        warmup=warmup,
    )


# --- before a run -----------------------------------------------------------------------------


async def _ask(
    target: Target, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, bytes]:
    """One small request to the target; connection failures become a `BenchError`."""
    where = target.safe_url
    data = b"" if body is None else json.dumps(body).encode()
    try:
        return await wire.fetch(
            target.host,
            target.port,
            method,
            target.base_path + path,
            body=data,
            headers=target.headers(json_body=body is not None),
            tls=target.tls,
            timeout=CONNECT_TIMEOUT,
        )
    except ConnectionRefusedError:
        raise BenchError(f"cannot reach {where}: connection refused") from None
    except TimeoutError:
        raise BenchError(f"cannot reach {where}: no answer within {CONNECT_TIMEOUT:g} s") from None
    except (OSError, httptools.HttpParserError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise BenchError(f"cannot reach {where}: {escape_error(reason)}") from None


def _json(target: Target, path: str, status: int, body: bytes) -> Any:
    """The JSON answer of a check, or a `BenchError` naming the refusal or the bad answer."""
    if status in {401, 403}:
        raise BenchError(
            f"the target refused the key ({status}): set GATEWAY_BENCH_API_KEY or --key-file"
        )
    if status != 200:
        raise BenchError(f"{target.safe_url}{path} answered HTTP {status}: {error_text(body)}")
    try:
        return json.loads(body)
    except ValueError:
        raise BenchError(f"{target.safe_url}{path} answered something that is not JSON") from None


def _same_model(listed: str, model: str) -> bool:
    """Ollama names without a tag mean `:latest`, and match case-insensitively."""

    def full(name: str) -> str:
        return (name if ":" in name else f"{name}:latest").lower()

    return full(listed) == full(model)


def _unknown(model: str, names: list[str]) -> BenchError:
    shown = ", ".join(escape_error(n, 60) for n in names[:10]) or "none"
    return BenchError(f"the target has no model {model!r} (it lists: {shown})")


async def check_target(target: Target, model: str) -> dict[str, Any]:
    """Check the target before a run: reachable, the key accepted, the model present.

    Returns:
        `{"through_gateway": bool, "server": {...}}`: through_gateway when `GET /metrics`
        answers with a `gateway_` metric family (our gateway); `server` for Ollama holds
        `api`, `version` (`/api/version`), `model`, `digest` (`/api/tags`) and
        `quantization_level`, `parameter_size`, `family`, `format` (`/api/show` details), for
        OpenAI `api`, `id` and `owned_by` (`/v1/models`). Unknown values are None.

    Raises:
        BenchError: connection refused or failed, the key refused (401/403), the model not
            listed (or 404 from `/api/show`), an answer that is not JSON.
    """
    status, body = await _ask(target, "GET", "/metrics")
    text = body.decode("utf-8", "replace") if status == 200 else ""
    through = any(
        line.startswith(("gateway_", "# TYPE gateway_", "# HELP gateway_"))
        for line in text.splitlines()
    )
    if target.api == "openai":
        listing = _json(target, "/v1/models", *await _ask(target, "GET", "/v1/models"))
        entries = [e for e in (listing or {}).get("data") or [] if isinstance(e, dict)]
        entry = next((e for e in entries if e.get("id") == model), None)
        if entry is None:
            raise _unknown(model, [str(e.get("id")) for e in entries])
        server = {"api": "openai", "id": entry.get("id"), "owned_by": entry.get("owned_by")}
        return {"through_gateway": through, "server": server}
    tags = _json(target, "/api/tags", *await _ask(target, "GET", "/api/tags"))
    models = [m for m in (tags or {}).get("models") or [] if isinstance(m, dict)]
    tag = next(
        (m for m in models if _same_model(str(m.get("name") or m.get("model")), model)), None
    )
    if tag is None:
        raise _unknown(model, [str(m.get("name") or m.get("model")) for m in models])
    status, body = await _ask(target, "GET", "/api/version")
    version = json.loads(body).get("version") if status == 200 else None
    show = _json(target, "/api/show", *await _ask(target, "POST", "/api/show", {"model": model}))
    details = (show or {}).get("details") or {}
    server = {
        "api": "ollama",
        "version": version,
        "model": tag.get("name") or tag.get("model"),
        "digest": tag.get("digest"),
        **{k: details.get(k) for k in ("quantization_level", "parameter_size", "family", "format")},
    }
    return {"through_gateway": through, "server": server}


async def cold_load(target: Target, model: str) -> dict[str, Any] | None:
    """Ollama only: unload the model, ask once, report the load (None on the OpenAI api).

    The unload is `/api/generate` with `keep_alive: 0` and no prompt; the request after it
    pays the load.

    Returns:
        `{"load_seconds"` (the server's `load_duration`), `"ttft_seconds"` (client clock),
        `"ok"`, `"error"}`, or None for `api="openai"` (no portable unload or load counter).

    Raises:
        BenchError: the target is unreachable, refuses the key or the unload.
    """
    if target.api != "ollama":
        return None
    unload = {"model": model, "keep_alive": 0}
    _json(target, "/api/generate", *await _ask(target, "POST", "/api/generate", unload))
    prompt, sampling = Prompt("cold-load", text="Hello"), Sampling(max_tokens=8)
    path, body = build_request(target, model, prompt, sampling)
    request = wire.request_bytes("POST", target.host, target.port, path, body, target.headers())
    client = _Client(target)
    try:
        record = await client.exchange(request, model, prompt.id, warmup=False)
    finally:
        client.close()
    return {
        "load_seconds": record.load_seconds,
        "ttft_seconds": record.ttft,
        "ok": record.ok,
        "error": record.error,
    }
