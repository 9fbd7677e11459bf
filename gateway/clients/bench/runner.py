"""One `gateway bench run` job: every model through the chosen load shape, as one run document.

Owns `Plan` (what to run, checked before anything is sent) and `run_benchmark` (runs it and
returns the run document, docs/benchmarking.md "The run document"). Per model, in order:

1. `driver.check_target`: the target answers, the key is accepted, the model exists; what the
   server says about itself (version, digest, quantization) for the fingerprint.
2. The cold load, when asked (`--cold-load`, Ollama only): unload, one request, the server's
   `load_duration`, reported apart from every point.
3. The load shape (`shapes.run_fixed`, `run_sweep`, `search_knee`) over a `Measure` bound to
   `driver.run_concurrency` (closed loop) or `driver.run_rate` (Poisson arrivals), with the
   resource monitor sampling on the same clock.
4. Size on disk and in memory (`/api/tags`, `/api/ps`) while the model is still loaded, the
   quality probe when asked, and the gateway policy from the knee (`policy.recommend`).

The matrix (several models) is the same loop; the report puts the models side by side.

A target that stops answering mid-run (`health.DownWatch`: only failures without an answer for
`down_after` seconds) stops the whole run: the model entry keeps the points measured, the one cut
short marked `partial`, and the document is marked `partial` with the reason; later models are
not measured (docs/benchmarking.md "Exit status").

Over ~300 lines for one reason: `Plan` (its fields, the checks in `__post_init__`,
`parameters`) is what `run_model` and `run_benchmark` carry out step by step; the job's
definition and its execution read the same fields, and `Plan` is checked before anything is sent.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

import httpx

from gateway.clients.bench import driver
from gateway.clients.bench.document import SCHEMA
from gateway.clients.bench.fingerprint import collect_fingerprint
from gateway.clients.bench.health import DOWN_AFTER, DownWatch, TargetLost
from gateway.clients.bench.policy import recommend
from gateway.clients.bench.progress import LevelProgress, level_label
from gateway.clients.bench.protocol import Target
from gateway.clients.bench.quality import QualityProbe, probe_quality
from gateway.clients.bench.resources import ResourceMonitor, gpu_inventory
from gateway.clients.bench.shapes import (
    Measure,
    Measurement,
    Shape,
    ShapeOptions,
    ShapeResult,
    run_fixed,
    run_sweep,
    search_knee,
)
from gateway.clients.bench.sizes import SizeHint, model_size
from gateway.clients.bench.workload import Workload
from gateway.clients.keyfile import redact_key

Mode = Literal["fixed", "sweep", "knee"]
Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Plan:
    """A benchmark job, validated.

    Attributes:
        target: The server to load (the upstream directly, or the gateway with a key).
        models: The models, in order (one is a single run, several a matrix).
        workload: The prompts and the sampling.
        mode: `fixed` (one level), `sweep` (the given levels) or `knee` (a knee search).
        shape: `concurrency` (closed loop, levels are in-flight requests) or `rate` (open loop,
            Poisson arrivals, levels are requests/s).
        levels: `fixed`: one level; `sweep`: the levels; `knee`: `[start, maximum]`.
        duration: Seconds each run lasts, or None with `requests`.
        requests: Requests each run counts, or None with `duration`.
        warmup: Requests sent before each run, excluded from its statistics; None: one per
            concurrent slot (a concurrency shape), or one (a rate shape).
        options: Repeats, SLO, knee gain and the over-saturation stop.
        cold_load: Measure the model's cold load first (Ollama API only).
        quality: Run the quality probe after the load.
        gpu: Sample local GPUs (NVML) on the timeline and in the fingerprint.
        sample_interval: Seconds between resource samples.
        max_in_flight: Rate shapes: the most requests in flight; arrivals past it fail.
        rate_seed: Rate shapes: the seed of the arrival schedule.
        arrivals: Rate shapes: `poisson` or `constant` arrivals.
        target_queue_wait: The policy's queue wait target, seconds.
        replicas: Gateway processes the policy divides the limit over.
        upstream_url: When set, the policy names this upstream's `GATEWAY_UPSTREAMS` entry.
        down_after: Seconds of failures without an answer after which the target counts as
            gone and the run stops (`health.DownWatch`, `--down-after`).
        max_error_rate: The failed share of all measured requests above which the run exits
            non-zero (`--max-error-rate`; `error_verdict`).
        sizes: The user's `--size` per model (`""`: every model), used where the server
            tells no size.
        probe: How the quality probe asks (endpoint, question set) when `quality` is set.

    Raises:
        ValueError: a setting no run could use (no model, neither or both of duration and
            requests, a level that is not positive, a fractional concurrency).
    """

    target: Target
    models: tuple[str, ...]
    workload: Workload
    mode: Mode
    shape: Shape
    levels: tuple[float, ...]
    duration: float | None
    requests: int | None
    warmup: int | None = None
    options: ShapeOptions = field(default_factory=ShapeOptions)
    cold_load: bool = False
    quality: bool = False
    gpu: bool = True
    sample_interval: float = 1.0
    max_in_flight: int = 256
    rate_seed: int = 1234
    arrivals: driver.Arrivals = "poisson"
    target_queue_wait: float = 2.0
    replicas: int = 1
    upstream_url: str | None = None
    down_after: float = DOWN_AFTER
    max_error_rate: float = 0.01
    sizes: Mapping[str, SizeHint] = field(default_factory=dict)
    probe: QualityProbe = field(default_factory=lambda: QualityProbe())

    def __post_init__(self) -> None:
        """Refuse plans no run could carry out (see the class's Raises)."""
        if not self.models or any(not m.strip() for m in self.models):
            raise ValueError("name at least one model (--model or --models)")
        if (self.duration is None) == (self.requests is None):
            raise ValueError("give exactly one of --duration and --requests")
        if self.duration is not None and self.duration <= 0:
            raise ValueError(f"--duration must be positive, got {self.duration:g}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"--requests must be at least 1, got {self.requests}")
        if self.warmup is not None and self.warmup < 0:
            raise ValueError(f"--warmup must be 0 or more, got {self.warmup}")
        if not self.levels or any(level <= 0 for level in self.levels):
            raise ValueError(f"levels must be positive, got {list(self.levels)}")
        if self.shape == "concurrency" and any(level != int(level) for level in self.levels):
            raise ValueError(f"a concurrency is a whole number, got {list(self.levels)}")
        expected = {"fixed": 1, "knee": 2}.get(self.mode)
        if expected is not None and len(self.levels) != expected:
            raise ValueError(f"{self.mode} takes {expected} level(s), got {list(self.levels)}")
        if self.mode == "knee" and self.levels[0] > self.levels[1]:
            raise ValueError(f"the knee search needs start <= maximum, got {list(self.levels)}")
        if self.shape == "rate" and self.max_in_flight < 1:
            raise ValueError(f"--max-in-flight must be at least 1, got {self.max_in_flight}")
        if self.sample_interval <= 0:
            raise ValueError(f"--sample-interval must be positive, got {self.sample_interval}")
        if not self.down_after > 0:
            raise ValueError(f"--down-after must be positive, got {self.down_after:g}")
        if not 0 <= self.max_error_rate <= 1:
            raise ValueError(f"--max-error-rate must be within 0-100%, got {self.max_error_rate}")

    def parameters(self, through_gateway: bool) -> dict[str, Any]:
        """The run document's `parameters` (no key: it is never written anywhere)."""
        return {
            "target": self.target.url,
            "api": self.target.api,
            "chat": self.target.chat,
            "through_gateway": through_gateway,
            "mode": self.mode,
            "shape": self.shape,
            "levels": list(self.levels),
            "repeat": self.options.repeat,
            "duration": self.duration,
            "requests": self.requests,
            "warmup": self.warmup,
            "workload": self.workload.describe(),
            "slo": None if self.options.slo is None else self.options.slo.text,
            "knee_gain": self.options.knee_gain,
            "confidence": self.options.confidence,
            "until_ci": self.options.until_ci,
            "max_repeats": self.options.max_repeats if self.options.until_ci else None,
            "max_error_rate": self.max_error_rate,
            "down_after": self.down_after,
            "max_in_flight": self.max_in_flight if self.shape == "rate" else None,
            "rate_seed": self.rate_seed if self.shape == "rate" else None,
            "arrivals": self.arrivals if self.shape == "rate" else None,
            "surface": self.target.surface or None,
        }


def _measure(plan: Plan, model: str, say: Say) -> Measure:
    """The `Measure` the shapes call: one run at one level, against this model."""

    async def measure(level: float) -> Measurement:
        tick = LevelProgress(model, level_label(plan.shape, level), duration=plan.duration, say=say)
        watch = DownWatch(plan.down_after, started=time.perf_counter())
        if plan.shape == "concurrency":
            # One warm-up per slot: every slot's first answer (cache, graph) stays out.
            warmup = int(level) if plan.warmup is None else plan.warmup
            done = await driver.run_concurrency(
                plan.target,
                plan.workload,
                model,
                int(level),
                duration=plan.duration,
                requests=plan.requests,
                warmup=warmup,
                progress=tick,
                watch=watch,
            )
        else:
            done = await driver.run_rate(
                plan.target,
                plan.workload,
                model,
                level,
                duration=plan.duration,
                requests=plan.requests,
                seed=plan.rate_seed,
                max_in_flight=plan.max_in_flight,
                warmup=1 if plan.warmup is None else plan.warmup,
                progress=tick,
                watch=watch,
                arrivals=plan.arrivals,
            )
        # A run that ended in failures without an answer: is the target still there?
        await watch.at_end(plan.target.url, done)
        return done

    return measure


async def _shape(plan: Plan, measure: Measure, options: ShapeOptions) -> ShapeResult:
    if plan.mode == "fixed":
        return await run_fixed(measure, plan.levels[0], shape=plan.shape, options=options)
    if plan.mode == "sweep":
        return await run_sweep(measure, plan.levels, shape=plan.shape, options=options)
    start, maximum = plan.levels
    return await search_knee(
        measure, maximum=maximum, start=start, shape=plan.shape, options=options
    )


def point_line(model: str, point: dict[str, Any]) -> str:
    """The progress line of one finished point: level, TTFT p50, tokens/s, errors, SLO."""
    summary = point["summary"]

    def med(key: str) -> float | None:
        value = summary.get(key, {}).get("median")
        return None if value is None else float(value)

    ttft, rate, errors = (
        med("ttft_seconds.p50"),
        med("output_tokens_per_second"),
        med("error_rate"),
    )
    parts = [f"{model}: {level_label(point['shape'], point['level'])}"]
    parts.append("TTFT p50 " + ("-" if ttft is None else f"{ttft * 1000:.0f} ms"))
    parts.append("output " + ("-" if rate is None else f"{rate:.1f} tok/s"))
    output = summary.get("output_tokens_per_second", {})
    if rate and output.get("ci_method") == "t over repeats":
        half = (output["ci_high"] - output["ci_low"]) / 2
        parts[-1] += f" +-{half / rate:.1%}"
    parts.append("errors " + ("-" if errors is None else f"{errors:.0%}"))
    achieved = med("achieved_rate")
    if achieved is not None:
        parts.append(f"sent {achieved:.2f} req/s")
        if point["shape"] == "rate" and achieved < 0.9 * point["level"]:
            # the arrivals stop at the window's end by the clock: a client behind its schedule
            # sent fewer than offered, and the point measures the client, not the server
            parts[-1] += " (the client could not keep up)"
    if len(point.get("repeats", ())) > 1:
        parts.append(f"{len(point['repeats'])} repeats")
    if point.get("convergence") is not None:
        parts.append("converged" if point["convergence"]["converged"] else "not converged")
    if point.get("slo_met") is not None:
        parts.append("SLO met" if point["slo_met"] else "SLO missed")
    return "  ".join(parts)


async def _size(plan: Plan, model: str, notes: list[str]) -> dict[str, Any]:
    """The model's size: on disk, resident, on the GPU, parameters (`sizes.model_size`)."""
    headers = {"Authorization": f"Bearer {plan.target.key}"} if plan.target.key else {}
    async with httpx.AsyncClient(
        base_url=plan.target.url.rstrip("/"), headers=headers, timeout=10.0
    ) as client:
        return await model_size(
            client,
            plan.target.api,
            model,
            url=plan.target.url,
            hint=plan.sizes.get(model, plan.sizes.get("")),
            notes=notes,
        )


def _note_empty_answers(model: str, points: Sequence[dict[str, Any]], notes: list[str]) -> None:
    """Say so when completed answers carried no token: the numbers then measure no decoding.

    llama-cpp-python's server, for one, ends the running answer empty when another request
    arrives (`--interrupt_requests`, on by default), and reports it as a normal end.
    """
    levels = [
        point["level"]
        for point in points
        if any(r["metrics"]["output_tokens"].get("min") == 0 for r in point["repeats"])
    ]
    if levels:
        shown = ", ".join(f"{level:g}" for level in levels)
        notes.append(
            f"{model}: some answers ended with no output token at level {shown}: a server that"
            " cuts a running answer short when another arrives (llama-cpp-python: start it"
            " with --interrupt_requests false)?"
        )


async def run_model(plan: Plan, model: str, say: Say, notes: list[str]) -> dict[str, Any]:
    """Benchmark one model: the run document's model entry (see the module docstring).

    Raises:
        driver.BenchError: the target is unreachable, refuses the key or lacks the model.
    """
    server = await driver.check_target(plan.target, model)
    entry: dict[str, Any] = {"model": model, "server": server.get("server", {})}
    entry["through_gateway"] = bool(server.get("through_gateway"))
    entry["cold_load"] = None
    if plan.cold_load:
        say(f"{model}: measuring the cold load")
        entry["cold_load"] = await driver.cold_load(plan.target, model)
        if entry["cold_load"] is None:
            notes.append(f"{model}: no cold load measured: the {plan.target.api} API reports none")

    measured: list[dict[str, Any]] = []

    def progress(point: dict[str, Any]) -> None:
        measured.append(point)  # kept here too: a run cut short saves what it measured
        say("\r" + point_line(model, point) + "\n")

    options = replace(plan.options, progress=progress)
    monitor = ResourceMonitor(
        plan.target.url,
        api=plan.target.api,
        key=plan.target.key,
        through_gateway=entry["through_gateway"],
        interval=plan.sample_interval,
        gpu=plan.gpu,
    )
    lost: TargetLost | None = None
    await monitor.start()
    try:
        result = await _shape(plan, _measure(plan, model, say), options)
    except TargetLost as exc:
        lost = exc
    finally:
        timeline = await monitor.stop()
    if lost is not None:
        kept = [note for note in monitor.notes if note not in notes]
        return _lost_entry(entry, measured, lost, timeline, kept)
    entry.update(result.as_dict())
    _note_empty_answers(model, result.points, notes)
    entry["size"] = await _size(plan, model, notes)
    # A note the run already carries (no GPU) is not repeated under each model.
    entry["resources"] = {
        "timeline": timeline,
        "notes": [note for note in monitor.notes if note not in notes],
    }
    entry["policy"] = None
    if plan.shape == "concurrency":
        entry["policy"] = recommend(
            result.points,
            result.knee,
            result.slo_limit,
            target_queue_wait=plan.target_queue_wait,
            replicas=plan.replicas,
            upstream_url=plan.upstream_url,
        )
    entry["quality"] = None
    if plan.quality:
        say(f"{model}: quality probe")
        entry["quality"] = await probe_quality(
            plan.target.url,
            model,
            api=plan.target.api,
            key=plan.target.key,
            seed=plan.workload.sampling.seed,
            notes=notes,
            endpoint=plan.probe.endpoint,
            questions=plan.probe.questions,
            question_set=plan.probe.question_set,
            max_tokens=plan.probe.max_tokens,
        )
    return entry


def _lost_entry(
    entry: dict[str, Any],
    measured: list[dict[str, Any]],
    lost: TargetLost,
    timeline: Any,
    resource_notes: list[str],
) -> dict[str, Any]:
    """The model entry of a run the target's death cut short: the points measured, `partial`.

    No knee, SLO limit, policy, size or quality: each would be read from a server that is gone,
    or from a curve cut off at an arbitrary level.
    """
    points = [*measured, *([] if lost.point is None else [lost.point])]
    points.sort(key=lambda point: point["level"])
    last = lost.point or (points[-1] if points else None)
    entry.update(
        points=points,
        knee=None,
        slo_limit=None,
        stopped={"level": None if last is None else last["level"], "reason": str(lost)},
        size={"disk_bytes": None, "loaded_bytes": None, "vram_bytes": None},
        resources={"timeline": timeline, "notes": resource_notes},
        policy=None,
        quality=None,
        partial=True,
    )
    return entry


def error_verdict(doc: dict[str, Any], limit: float) -> str | None:
    """Why the run failed too many requests (more than `limit` of all measured), or None.

    Counts every measured request of every point and repeat (warm-up excluded): a server that
    answers 2% of a run with errors has not been measured as it serves, whatever the latencies
    of the rest. The message names the points that failed most.
    """
    sent = failed = 0
    worst: list[tuple[float, str]] = []
    for entry in doc.get("models", []):
        for point in entry.get("points", []):
            p_sent = sum(int(r.get("requests") or 0) for r in point.get("repeats", []))
            p_failed = sum(int(r.get("errors") or 0) for r in point.get("repeats", []))
            sent, failed = sent + p_sent, failed + p_failed
            if p_failed:
                unit = "concurrency" if point.get("shape") == "concurrency" else "req/s"
                where = f"{entry.get('model')} {unit} {point.get('level'):g}"
                worst.append((p_failed / max(p_sent, 1), f"{where}: {p_failed}/{p_sent}"))
    if not sent or failed / sent <= limit:
        return None
    worst.sort(reverse=True)
    shown = "; ".join(text for _, text in worst[:3])
    return (
        f"{failed} of {sent} requests failed ({failed / sent:.1%}, more than the"
        f" --max-error-rate of {limit:.1%}): {shown}"
    )


def redact(value: Any, key: str | None) -> Any:
    """`value` (a run document or any part of one) with `key` replaced by `REDACTED`.

    A server may echo the key (an error body quoting the `Authorization` header), and run
    documents are shared (CI artefacts): the key must not travel in one. Keys of mappings are
    redacted too; numbers and None pass through. A start of the key left by a cut is redacted
    too (`gateway.clients.keyfile.redact_key`); server text is also redacted where it enters a
    record,
    before it is cut, so this is the last net, not the only one.
    """
    if not key:
        return value
    if isinstance(value, str):
        return redact_key(value, key)
    if isinstance(value, dict):
        return {redact(k, key): redact(v, key) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, key) for v in value]
    return value


async def run_benchmark(
    plan: Plan, *, say: Say | None = None, argv: Sequence[str] | None = None
) -> dict[str, Any]:
    """Run the plan for every model and return the run document.

    Args:
        plan: The validated job.
        say: Where progress goes (a line per point; text starting with a carriage return
            updates the line in place); None: silent.
        argv: The command line to record (`command`); default `sys.argv`. Keys never appear
            on it: they come from the environment or a file.

    Returns:
        `{"schema", "created", "finished", "command", "fingerprint", "parameters", "notes",
        "models": [entry, ...], "partial", "partial_reason"}` (docs/benchmarking.md "The run
        document"); `partial` is true when the target stopped answering and the run stopped.

    Raises:
        driver.BenchError: a target check failed (nothing is measured for later models).
    """
    speak: Say = say or (lambda _text: None)
    notes: list[str] = []
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    started = time.perf_counter()
    gpus = gpu_inventory(notes=notes) if plan.gpu else []
    entries: list[dict[str, Any]] = []
    partial: str | None = None
    for index, model in enumerate(plan.models):
        entries.append(await run_model(plan, model, speak, notes))
        if entries[-1].get("partial"):
            partial = str(entries[-1]["stopped"]["reason"])
            left = plan.models[index + 1 :]
            if left:
                notes.append(f"not measured (the run stopped): {', '.join(left)}")
            break
    through = any(entry["through_gateway"] for entry in entries)
    parameters = plan.parameters(through)
    if through:
        notes.append(
            "through the gateway the model server's runtime and version are not visible (the "
            "gateway answers for it): bench the server directly to gate a runtime upgrade"
        )
    doc = {
        "schema": SCHEMA,
        "created": created,
        "elapsed_seconds": round(time.perf_counter() - started, 3),
        "command": list(sys.argv if argv is None else argv),
        "fingerprint": collect_fingerprint(
            {
                entry["model"]: {
                    "server": entry["server"],
                    "through_gateway": entry["through_gateway"],
                }
                for entry in entries
            },
            parameters,
            gpus,
        ),
        "parameters": parameters,
        "notes": notes,
        "models": entries,
        "partial": partial is not None,
        "partial_reason": partial,
    }
    redacted: dict[str, Any] = redact(doc, plan.target.key)
    return redacted
