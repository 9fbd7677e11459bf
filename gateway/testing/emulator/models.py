"""The emulator's model routes on both faces: listing, showing, copying, deleting, blobs.

Owns `GET /api/tags`, `GET /api/ps`, `POST /api/show` (reference §6.3-6.5), `POST /api/copy`,
`DELETE /api/delete`, `HEAD|POST /api/blobs/:digest` (§6.7), `GET /v1/models` and
`GET /v1/models/{model}` (§7.3). The installed models are `config.models`; copy adds to it and
delete removes from it through `EmulatorState`, so the lists reflect them. The long-running
pull, push and create live in `transfer`; what a model looks like, in `catalog`.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import TYPE_CHECKING, Any

from starlette.responses import Response
from starlette.routing import Route

from gateway.testing.emulator.catalog import canonical, listing, resolve, show_body
from gateway.testing.emulator.engine import Endpoint
from gateway.testing.emulator.openai import error_object
from gateway.testing.emulator.state import request_context
from gateway.testing.emulator.wire import format_local_time, json_response, read_json

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp

    from gateway.testing.emulator.state import EmulatorState

_DIGEST = re.compile(r"sha256[:-][0-9a-fA-F]{64}")


def go_quote(text: str) -> str:
    """Quote like Go's `%q` (close enough for names: a JSON string without HTML escaping)."""
    return json.dumps(text, ensure_ascii=False)


def _by_modified(state: EmulatorState, models: list[str]) -> list[str]:
    """Most recently modified first, as `ListHandler` sorts; ties keep the config order.

    Ollama compares whole seconds; exact times keep the order deterministic in fast tests.
    """
    return sorted(models, key=lambda name: -state.modified_at(name))


def _owner(name: str) -> str:
    """Return the namespace part of `[host/]namespace/model:tag`, `library` when there is none."""
    parts = name.split(":", 1)[0].split("/")
    return parts[-2] if len(parts) >= 2 else "library"


def model_object(state: EmulatorState, name: str, model_id: str) -> dict[str, Any]:
    """One `/v1/models` entry (`ToModel`): `created` is the model's `modified_at` (§7.3)."""
    created = int(state.modified_at(name))
    return {"id": model_id, "object": "model", "created": created, "owned_by": _owner(model_id)}


async def _tags(request: Request) -> ASGIApp:
    state, config, _ = request_context(request)
    models = [
        {**listing(name), "modified_at": format_local_time(state.modified_at(name))}
        for name in _by_modified(state, config.models)
    ]
    return json_response(200, {"models": models})


async def _ps(request: Request) -> ASGIApp:
    """`GET /api/ps` (§6.4): the loaded models, latest `expires_at` first.

    Without residency (`EmulatorConfig.resident`) every model unless `cold_load` is set, each
    expiring 5 minutes from now; with it, the models loaded now, with their configured size
    (`size` = `size_vram`: all on the GPU) and the end of their `keep_alive` after last use.
    """
    state, config, _ = request_context(request)
    capacity = state.capacity
    capacity.expire(config)
    now, wall = time.monotonic(), time.time()
    entries: list[tuple[float, dict[str, Any]]] = []
    for name in config.models:
        runner = capacity.runner(name)
        if not runner.loaded(config):
            continue
        entry = listing(name)
        if config.resident:
            entry["size"] = round(config.size_of(name) * 1e9)
            keep = config.keep_alive
            expires = wall + (keep - (now - runner.last_used) if keep >= 0 else 10 * 365 * 86400)
            if runner.running:  # in use: the timer restarts when it is idle again
                expires = wall + max(keep, 0)
        else:
            expires = wall + 300  # the default keep_alive, 5m
        entry |= {"expires_at": format_local_time(expires), "size_vram": entry["size"]}
        entries.append((expires, entry | {"context_length": config.context_length}))
    entries.sort(key=lambda item: -item[0])
    return json_response(200, {"models": [entry for _, entry in entries]})


async def _show(request: Request) -> ASGIApp:
    """`POST /api/show` (§6.5): `model`, or the deprecated `name`."""
    state, config, record = request_context(request)
    error = await read_json(request, record, "api.ShowRequest", "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    wanted = record.body.get("model") or record.body.get("name") or ""
    if not isinstance(wanted, str) or not wanted:
        return json_response(400, {"error": "model is required"})
    name = resolve(wanted, config.models)
    if name is None:  # /api/show names the canonical `name:tag` (§4.2)
        return json_response(404, {"error": f"model '{canonical(wanted)}' not found"})
    modified = format_local_time(state.modified_at(name))
    verbose = record.body.get("verbose") is True
    return json_response(200, show_body(name, config, modified_at=modified, verbose=verbose))


async def _copy(request: Request) -> ASGIApp:
    """`POST /api/copy` (§6.7): 200 with an empty body, and the destination is installed."""
    state, config, record = request_context(request)
    error = await read_json(request, record, "api.CopyRequest", "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    source, destination = record.body.get("source"), record.body.get("destination")
    for field, value in (("source", source), ("destination", destination)):
        if not isinstance(value, str) or not value:
            return json_response(400, {"error": f"{field} {go_quote(str(value or ''))} is invalid"})
    if resolve(str(source), config.models) is None:
        return json_response(404, {"error": f"model {go_quote(str(source))} not found"})
    state.install(canonical(str(destination)))
    return Response(status_code=200)


async def _delete(request: Request) -> ASGIApp:
    """`DELETE /api/delete` (§6.7): 200 with an empty body; an unknown model is 404."""
    state, config, record = request_context(request)
    error = await read_json(request, record, "api.DeleteRequest", "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    wanted = record.body.get("model") or record.body.get("name") or ""
    if not isinstance(wanted, str) or not wanted:
        return json_response(400, {"error": f"name {go_quote(str(wanted))} is invalid"})
    name = resolve(wanted, config.models)
    if name is None:
        return json_response(404, {"error": f"model '{wanted}' not found"})
    state.uninstall(name)
    return Response(status_code=200)


async def _blob(request: Request) -> ASGIApp:
    """`HEAD /api/blobs/:digest` (200 or 404) and `POST` (201 once stored, 200 if it was)."""
    state, _, _ = request_context(request)
    given = request.path_params["digest"]
    if not _DIGEST.fullmatch(given):
        return json_response(400, {"error": "invalid digest format"})
    key = f"sha256:{given[7:].lower()}"
    if request.method == "HEAD":
        if key in state.blobs:
            return Response(status_code=200)
        return json_response(404, {"error": f"blob {go_quote(given)} not found"})
    if key in state.blobs:
        return Response(status_code=200)
    got = f"sha256:{hashlib.sha256(await request.body()).hexdigest()}"
    if got != key:
        message = f"digest mismatch, expected {go_quote(given)}, got {go_quote(got)}"
        return json_response(400, {"error": message})
    state.blobs.add(key)
    return Response(status_code=201)


async def _v1_models(request: Request) -> ASGIApp:
    """`GET /v1/models` (§7.3): `data` is null, not `[]`, without models (Go `var data []Model`)."""
    state, config, _ = request_context(request)
    data = [model_object(state, name, name) for name in _by_modified(state, config.models)]
    return json_response(200, {"object": "list", "data": data or None})


async def _v1_model(request: Request) -> ASGIApp:
    """`GET /v1/models/{model}` (§7.3): `id` is the name as asked; unknown is a 404 error."""
    state, config, _ = request_context(request)
    wanted = request.path_params["model"]
    name = resolve(wanted, config.models)
    if name is None:
        return json_response(404, error_object(404, f"model '{canonical(wanted)}' not found"))
    return json_response(200, model_object(state, name, wanted))


# Starlette adds HEAD to every GET route, as Ollama has.
ROUTES = (
    Route("/api/tags", Endpoint(_tags), methods=["GET"]),
    Route("/api/ps", Endpoint(_ps), methods=["GET"]),
    Route("/api/show", Endpoint(_show), methods=["POST"]),
    Route("/api/copy", Endpoint(_copy), methods=["POST"]),
    Route("/api/delete", Endpoint(_delete), methods=["DELETE"]),
    Route("/api/blobs/{digest}", Endpoint(_blob), methods=["HEAD", "POST"]),
    Route("/v1/models", Endpoint(_v1_models), methods=["GET"]),
    Route("/v1/models/{model:path}", Endpoint(_v1_model), methods=["GET"]),
)
"""The model routes, in the order `create_emulator_app` mounts them."""
