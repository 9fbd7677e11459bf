"""Ollama's metadata routes: `/`, `/api/version`, `/api/tags`, `/api/show`, `/api/ps`.

With these, the generation routes and `gateway.api.ollama.manage`, an Ollama client needs only
`OLLAMA_HOST=<gateway>` and a key header. `GET|HEAD /` answers `Ollama is running` without a key
(tools probe it) and says nothing else; every other route needs a key.

Lists are the union over the upstreams, in pool order (the first entry of a name wins), filtered
by the key's allow-list, and `{"models": []}` rather than null. An Ollama upstream contributes
its own `/api/tags` and `/api/ps` entries, every field kept. An OpenAI-style upstream (llama.cpp,
vLLM) has no `/api/*` and is never sent one: its `/api/tags` entries and `/api/show` answers are
built from the gateway's catalogue of its models, and it has nothing loaded to report in
`/api/ps`. An upstream that fails is left out (and logged); when all fail, 502.

Every route here but `/` and `/api/version` asks the upstreams, so each request counts against
the key's RPM and in-flight limits (`KeyLimiter.admitted`), as a generation does.

`/api/show` answers 404 `model '<name:tag>' not found` both for a model no upstream has and for
one the key may not use: like `/v1/models/{model}`, a key does not learn which models exist
beyond its own.

Over ~300 lines for one reason: the five metadata routes share one way of asking the upstreams
(`_fetch`, `_union`: each upstream in parallel within one budget, failures left out and logged)
and of answering from the catalogue for OpenAI-style ones; split by route, each would carry its
own copy of that merge or reach into the others'.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import PlainTextResponse

from gateway.api.auth import PrincipalDep, require_principal
from gateway.api.ollama.body import parse_body, requested_model
from gateway.api.ollama.passthrough import error_of, fetch, transport_error
from gateway.auth.principal import Principal
from gateway.context import request_context
from gateway.deps import PoolDep, RelayDep, SettingsDep
from gateway.errors import (
    BadRequestError,
    GatewayError,
    NotFoundError,
    UpstreamUnavailableError,
)
from gateway.metering.metrics import OTHER_MODEL
from gateway.settings import Settings
from gateway.upstream.dialects.base import ModelInfo
from gateway.upstream.pool import Upstream, UpstreamPool
from gateway.wire.body import read_body
from gateway.wire.json import parse_listing, parse_request_body

logger = logging.getLogger("gateway.api")

#: What `/api/version` reports: the Ollama release whose API the gateway was written and tested
#: against (the protocol reference's revision, v0.33.0-rc2, and the emulator's version). Clients
#: such as Open WebUI compare it to decide which features to use; the upstreams' own versions
#: are not exposed.
OLLAMA_VERSION = "0.33.0"

JSON_TYPE = "application/json; charset=utf-8"

public_router = APIRouter()
router = APIRouter(prefix="/api", dependencies=[Depends(require_principal)])


def json_answer(value: Any, status: int = 200) -> Response:
    """A JSON response as Ollama sends it (gin `c.JSON`)."""
    return Response(json.dumps(value).encode(), status, media_type=JSON_TYPE)


def tagged(model: str) -> str:
    """`name` as `name:latest`, the way Ollama names a model in its messages (section 2.1)."""
    return model if ":" in model.rsplit("/", 1)[-1] else f"{model}:latest"


def _name(entry: dict[str, Any]) -> str | None:
    value = entry.get("model") or entry.get("name")
    return value if isinstance(value, str) else None


def _entries(data: Any) -> list[dict[str, Any]]:
    """The well-formed entries of `{"models": [...]}`: objects with a string name."""
    models = data.get("models") if isinstance(data, dict) else ()
    if models is None:  # Go's nil slice
        return []
    if not isinstance(models, list):
        raise ValueError("the answer has no models list")
    return [entry for entry in models if isinstance(entry, dict) and _name(entry)]


def _timestamp(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _synthesized(info: ModelInfo) -> dict[str, Any]:
    """An `/api/tags` entry for a model of an OpenAI-style upstream, from the catalogue."""
    modified = _timestamp(info.created)
    return {
        "name": info.id,
        "model": info.id,
        "modified_at": modified,
        "size": 0,
        "digest": "",
        "details": {},
    }


async def _fetch(upstream: Upstream, path: str, budget: float) -> list[dict[str, Any]]:
    """GET an Ollama upstream's model list at `path` within `budget` seconds."""
    response = await fetch(upstream.client, "GET", path, budget=budget)
    response.raise_for_status()
    return _entries(parse_listing(response.content))


Lister = Callable[[Upstream], Awaitable[list[dict[str, Any]]]]


async def _union(upstreams: list[Upstream], lister: Lister, what: str) -> list[dict[str, Any]]:
    """Every upstream's entries, in pool order, the first of each name kept.

    Raises:
        UpstreamUnavailableError: there were upstreams to ask and none answered.
    """
    lists: dict[int, list[dict[str, Any]]] = {}

    async def one(index: int, upstream: Upstream) -> None:
        try:
            lists[index] = await lister(upstream)
        except (
            httpx.HTTPError,
            ValueError,
            TypeError,
            KeyError,
            TimeoutError,
            GatewayError,
        ) as exc:
            logger.warning("upstream %s: %s unavailable (%s)", upstream.name, what, exc)

    async with anyio.create_task_group() as group:
        for index, upstream in enumerate(upstreams):
            group.start_soon(one, index, upstream)
    if upstreams and not lists:
        raise UpstreamUnavailableError(f"could not list the upstreams' {what}")
    seen: set[str] = set()
    merged = []
    for index in sorted(lists):
        for entry in lists[index]:
            key = tagged(str(_name(entry)).lower())
            if key not in seen:
                seen.add(key)
                merged.append(entry)
    return merged


@public_router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> PlainTextResponse:
    """Ollama's liveness answer (reference section 6.1); no key needed."""
    return PlainTextResponse("Ollama is running")


@router.api_route("/version", methods=["GET", "HEAD"])
async def version() -> Response:
    """The Ollama version the gateway's API matches (`OLLAMA_VERSION`)."""
    return json_answer({"version": OLLAMA_VERSION})


@router.api_route("/tags", methods=["GET", "HEAD"])
async def tags(
    principal: PrincipalDep, pool: PoolDep, settings: SettingsDep, relay: RelayDep
) -> Response:
    """The models this key may use, over every upstream (reference section 6.3).

    Each Ollama upstream is asked, so it counts against the key's RPM and in-flight limits.
    """

    async def lister(upstream: Upstream) -> list[dict[str, Any]]:
        if upstream.dialect.name == "ollama":
            return await _fetch(upstream, "/api/tags", settings.connect_timeout)
        return [_synthesized(info) for info in await upstream.catalog.current()]

    async with relay.limiter.admitted(principal):
        models = await _union(pool.upstreams, lister, "models")
    return json_answer({"models": _with_aliases(models, principal, settings)})


def _with_aliases(
    models: list[dict[str, Any]], principal: Principal, settings: Settings
) -> list[dict[str, Any]]:
    """The entries this key may use, with its exact aliases (`GATEWAY_MODEL_ALIASES`).

    An alias is listed as a copy of its target's entry under its own name, when the key may
    use the target and an upstream lists it; a pattern alias has no name to list. An entry
    whose name an alias takes is left out: asking for it runs the target.
    """
    aliases = settings.aliases
    allowed = [m for m in models if principal.allows_model(str(_name(m)))]
    listed = [m for m in allowed if aliases.target(str(_name(m))) is None]
    for alias, target in aliases.exact.items():
        wanted = tagged(target.lower())
        entry = next((m for m in allowed if tagged(str(_name(m)).lower()) == wanted), None)
        if entry is not None:
            listed.append({**entry, "name": alias, "model": alias})
    return listed


@router.get("/ps")
async def ps(
    principal: PrincipalDep, pool: PoolDep, settings: SettingsDep, relay: RelayDep
) -> Response:
    """The models loaded on the Ollama upstreams that this key may use (section 6.4).

    Each Ollama upstream is asked, so it counts against the key's RPM and in-flight limits.
    """

    async def lister(upstream: Upstream) -> list[dict[str, Any]]:
        return await _fetch(upstream, "/api/ps", settings.connect_timeout)

    ollama = [u for u in pool.upstreams if u.dialect.name == "ollama"]
    async with relay.limiter.admitted(principal):
        models = await _union(ollama, lister, "loaded models")
    return json_answer({"models": [m for m in models if principal.allows_model(str(_name(m)))]})


@router.post("/show")
async def show(
    request: Request, principal: PrincipalDep, pool: PoolDep, settings: SettingsDep, relay: RelayDep
) -> Response:
    """One model's details (section 6.5): from an Ollama upstream, else from the catalogue.

    Relayed to an upstream and up to `SMALL_ANSWER_LIMIT` bytes each, so it counts against the
    key's RPM and in-flight limits like a generation (a key cannot hammer its upstreams with it).

    Raises:
        RateLimitedError: the key's RPM or in-flight limit is reached.
    """
    async with relay.limiter.admitted(principal):
        return await _show(request, principal, pool, settings)


async def _show(
    request: Request, principal: Principal, pool: UpstreamPool, settings: Settings
) -> Response:
    raw = await read_body(request, settings.max_body_bytes)
    body = await parse_request_body(parse_body, raw, settings)
    model = requested_model(body)
    if model is None:
        raise BadRequestError("model is required")
    asked = model
    target = settings.aliases.target(model)
    if target is not None:  # an alias shows its target's details (`GATEWAY_MODEL_ALIASES`)
        body = {name: value for name, value in body.items() if name != "name"}
        raw, model = json.dumps({**body, "model": target}).encode(), target
    request_context(request.scope).model = model
    if not principal.allows_model(model):  # named as asked: an alias's target stays hidden
        raise NotFoundError(f"model '{tagged(asked)}' not found")
    ollama = [u for u in pool.upstreams if u.dialect.name == "ollama"]
    knowing = [u for u in ollama if u.catalog.label(model) != OTHER_MODEL]
    knowing.sort(key=lambda u: u.monitor.up is False)  # stable: those that answer first
    failures: list[GatewayError] = []
    budget = settings.connect_timeout
    answer = await _show_from(knowing, raw, failures, budget)
    if answer is None:
        answer = await _catalogued_show(pool, model)
    if answer is None:  # the catalogues may be older than a pull: ask the others too
        others = [u for u in ollama if u not in knowing]
        answer = await _show_from(others, raw, failures, budget)
    if answer is None:
        raise failures[0] if failures else NotFoundError(f"model '{tagged(model)}' not found")
    return answer


async def _show_from(
    upstreams: list[Upstream], raw: bytes, failures: list[GatewayError], budget: float
) -> Response | None:
    """The first answer of `upstreams` to the checked body `raw` other than a 404 or a failure.

    Raises:
        UpstreamStatusError: an upstream refused the request itself (a 4xx other than 404).
    """
    for upstream in upstreams:
        try:
            response = await fetch(
                upstream.client,
                "POST",
                "/api/show",
                budget=budget,
                content=raw,
                headers={"content-type": "application/json"},
            )
        except (httpx.HTTPError, TimeoutError) as exc:
            logger.warning("upstream %s: /api/show failed (%s)", upstream.name, exc)
            failures.append(transport_error(exc))
            continue
        if response.status_code == 404:
            continue
        if response.is_success:
            media = response.headers.get("content-type", JSON_TYPE)
            return Response(response.content, response.status_code, media_type=media)
        failure = error_of(response)
        if failure.status_code < 500:
            raise failure
        failures.append(failure)
    return None


async def _catalogued_show(pool: UpstreamPool, model: str) -> Response | None:
    """`/api/show` for a model only an OpenAI-style upstream offers: what its catalogue knows."""
    for upstream in pool.upstreams:
        if upstream.dialect.name == "ollama":
            continue
        try:  # as the monitor last fetched it; fetched now only if it never was
            models = await upstream.catalog.current()
        except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError):
            continue
        label = upstream.catalog.label(model)
        for info in models:
            if info.id == label:
                return json_answer(
                    {
                        "modelfile": "",
                        "parameters": "",
                        "template": "",
                        "details": {},
                        "model_info": {},
                        "capabilities": ["completion"],
                        "modified_at": _timestamp(info.created),
                    }
                )
    return None
