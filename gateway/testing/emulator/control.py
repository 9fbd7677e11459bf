"""The emulator's own routes, off Ollama's API paths: what it served, and a reset between runs.

Owns `GET /emulator/stats` (counters per model and in total, the loaded models, the GPU knobs a
harness needs to interpret them), `GET /emulator/events` (the journal of slot, load and eviction
changes, wall-clock stamped: `gateway.testing.emulator.counters`) and `POST /emulator/reset`
(fresh runners: empty prefix caches, zero counters, only the preloaded models loaded; records
cleared). A benchmark reads them between runs; no Ollama client calls them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from gateway.testing.emulator.counters import ModelCounters
from gateway.testing.emulator.engine import Endpoint
from gateway.testing.emulator.state import request_context
from gateway.testing.emulator.wire import json_response

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp


async def _stats(request: Request) -> ASGIApp:
    """`GET /emulator/stats`: `{"total": counters, "models": {name: counters}, "loaded", ...}`.

    Counters are `ModelCounters`' fields; `prefix_hit_rate` is cached / prompt tokens.
    """
    state, config, _ = request_context(request)
    capacity = state.capacity
    capacity.expire(config)
    models = capacity.counters()
    total = ModelCounters()
    for counters in models.values():
        total.add(counters)
    prompt = total.prompt_tokens
    body: dict[str, Any] = {
        "total": asdict(total),
        "prefix_hit_rate": total.cached_tokens / prompt if prompt else 0.0,
        "models": {name: asdict(counters) for name, counters in sorted(models.items())},
        "loaded": sorted(name for name, r in capacity.runners().items() if r.loaded(config)),
        "parallel": config.parallel,
        "memory": config.memory,
    }
    return json_response(200, body)


async def _events(request: Request) -> ASGIApp:
    """`GET /emulator/events`: `{"events": [{"t", "model", "kind", "value"}, ...]}`."""
    state, _, _ = request_context(request)
    return json_response(200, {"events": state.capacity.journal.dump()})


async def _reset(request: Request) -> ASGIApp:
    """`POST /emulator/reset`: start over (`EmulatorState.reset`); answers `{}`."""
    state, _, _ = request_context(request)
    state.reset()
    return json_response(200, {})


ROUTES = (
    Route("/emulator/stats", Endpoint(_stats), methods=["GET"]),
    Route("/emulator/events", Endpoint(_events), methods=["GET"]),
    Route("/emulator/reset", Endpoint(_reset), methods=["POST"]),
)
"""The emulator's own routes, as `create_emulator_app` mounts them."""
