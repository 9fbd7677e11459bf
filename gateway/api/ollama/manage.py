"""Ollama's model management at Ollama's paths (reference section 6.7), for keys that may manage.

`POST /api/pull`, `/api/push`, `/api/create`, `/api/copy`, `DELETE /api/delete`, `HEAD|POST
/api/blobs/{digest}`. A key without `manage_models` gets 403 before its body is read. Each
request counts against the key's RPM (a pull's stream holds no in-flight slot once it runs).
The body the gateway checked is the body it sends.

A key with a model allow-list may only manage the models on it (403), so its bodies may carry
only the fields of Ollama's request structs (`api/types.go`) that name nothing but models, each
checked against the list: not `files` or `adapters` (blob digests: a blob may hold any model's
weights), `remote_host` (a host of the client's choosing), `insecure: true` (a registry not
verified), the deprecated `modelfile` and `path` (their lines name models and files), nor a field
the gateway does not know; and not the blob routes (their digests name no model). A key without
an allow-list may use every model, so all of it is relayed.

Where to: `?upstream=<host:port>` names one upstream (its `name`); unknown: 400. Unnamed, the
only Ollama upstream; with several, copy and delete go to each of them, while pull, push,
create and blobs answer 400: a merged progress stream would tell a client nothing true about
either transfer, and a blob body can only be sent once without holding it. An OpenAI-style
upstream cannot manage models (400).

Pull, push and create relay the upstream's NDJSON progress as it comes (`stream:false`: its
one object), under a disconnect watcher: a client that leaves closes the upstream response,
which makes Ollama cancel the transfer; a shutdown ends the stream with an error line. The
upstream client's per-read timeout applies (the longer of `GATEWAY_FIRST_BYTE_TIMEOUT` and
`GATEWAY_IDLE_TIMEOUT`), so a `stream:false` pull longer than that fails with 504: stream it.

A blob body streams through, never held in memory and not bound by `GATEWAY_MAX_BODY_BYTES`
(models are gigabytes; Ollama checks the digest). The httptools and aiohttp transports read a
request body whole before sending it (`gateway.upstream.httptools_transport`,
`gateway.upstream.transport`), so with them an upload goes through a short-lived httpx client of
its own to the same upstream.

Over ~300 lines for one reason: `Manager` applies the rules above to one set of routes
(`admitted` with `_check_fields` for allow-lists, `targets`, `progress`, `each`, `blob` with
`_upload`); the route functions are one-line fronts, and split, the rules would be apart from
the relays they guard.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

import anyio
import httpx
from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.requests import ClientDisconnect

from gateway.api.auth import PrincipalDep, require_principal
from gateway.api.ollama.body import parse_body, requested_model
from gateway.api.ollama.passthrough import (
    ProgressResponse,
    error_of,
    fetch,
    passed,
    send_streamed,
    transport_error,
)
from gateway.auth.principal import Principal
from gateway.context import request_context
from gateway.deps import LifecycleDep, MetricsDep, PoolDep, RelayDep, SettingsDep
from gateway.errors import (
    BadRequestError,
    ClientClosedRequestError,
    ForbiddenError,
    GatewayError,
    ServiceUnavailableError,
)
from gateway.lifecycle import Lifecycle
from gateway.limits.limiter import KeyLimiter
from gateway.metering.metrics import ALL_KEYS, OTHER_MODEL, Metrics
from gateway.neutral import Outcome
from gateway.policies import UpstreamTimeouts
from gateway.relay.admission import Admitted, admitted, upstream_headers
from gateway.routing import route_label
from gateway.settings import Settings
from gateway.upstream.client import build_upstream_client
from gateway.upstream.pool import Upstream, UpstreamPool

router = APIRouter(prefix="/api", dependencies=[Depends(require_principal)])

UpstreamParam = Annotated[str | None, Query(max_length=300, description="host:port")]
_DIGEST = re.compile(r"sha256[:-][0-9a-fA-F]{64}")
Body = dict[str, Any]
Names = Callable[[Body], list[str]]

#: The body fields a key with a model allow-list may send, per route (Ollama's `PullRequest`,
#: `PushRequest`, `CreateRequest`, `CopyRequest`, `DeleteRequest`); `insecure` only as false.
_FIELDS: dict[str, frozenset[str]] = {
    "/api/pull": frozenset({"model", "name", "stream", "insecure"}),
    "/api/push": frozenset({"model", "name", "stream", "insecure"}),
    "/api/create": frozenset(
        {
            "model",
            "name",
            "stream",
            "from",
            "quantize",
            "quantization",
            "template",
            "system",
            "license",
            "parameters",
            "messages",
            "renderer",
            "parser",
            "requires",
            "info",
        }
    ),
    "/api/copy": frozenset({"source", "destination"}),
    "/api/delete": frozenset({"model", "name"}),
}
#: Fields that reach beyond the named models, and how (each refusal says it).
_BEYOND = {
    "files": "names blobs by digest, and a blob may hold any model's weights",
    "adapters": "names blobs by digest, and a blob may hold any model's weights",
    "remote_host": "makes the upstream reach a host the request chooses",
    "insecure": "lets the upstream use a registry it has not verified",
    "modelfile": "its lines name models and files the gateway does not check",
    "path": "names a file on the upstream's disk",
}


def _check_fields(principal: Principal, path: str, body: dict[str, Any]) -> None:
    """Refuse, for a key with a model allow-list, a field that may reach beyond the list.

    An absent field and an empty one (null, false, "", {}, []: Go's zero values, which Ollama
    treats as absent) are the same. A key without an allow-list may send anything.

    Raises:
        ForbiddenError: a field names something other than models, or is unknown (403).
    """
    if principal.models is None:
        return
    allowed = _FIELDS[path]
    for field in body:
        value = body[field]
        if field in allowed and field not in _BEYOND:
            continue
        if value is None or value is False or value in ("", {}, []):  # `insecure: false`
            continue
        why = _BEYOND.get(field, "the gateway does not know what it may name")
        raise ForbiddenError(
            f"this API key may only manage the models on its allow-list; "
            f"{json.dumps(field[:100])} in {path} {why}"
        )


def _model(body: dict[str, Any]) -> list[str]:
    model = requested_model(body)
    if model is None:
        raise BadRequestError("model is required")
    return [model]


def _created(body: dict[str, Any]) -> list[str]:
    source = body.get("from")
    return _model(body) + ([source] if isinstance(source, str) and source else [])


def _copied(body: dict[str, Any]) -> list[str]:
    """`source` and `destination`; a missing one is left for the upstream to refuse."""
    names = (body.get("source"), body.get("destination"))
    return [name for name in names if isinstance(name, str) and name]


@dataclass
class Manager:
    """One management request of a permitted key, and what serving it needs."""

    request: Request
    principal: Principal
    pool: UpstreamPool
    settings: Settings
    metrics: Metrics
    lifecycle: Lifecycle
    limiter: KeyLimiter

    def targets(self, name: str | None, *, several: bool = False) -> list[Upstream]:
        """The upstreams `?upstream=name` (or its absence) selects (module docstring)."""
        if name is not None:
            upstream = self.pool.named(name)
            if upstream is None:
                raise BadRequestError(f"no upstream is named {json.dumps(name[:100])}")
            chosen = [upstream] if upstream.dialect.name == "ollama" else []
        else:
            chosen = [u for u in self.pool.upstreams if u.dialect.name == "ollama"]
        if not chosen:
            raise BadRequestError("the upstream cannot manage models (it has no Ollama API)")
        if len(chosen) > 1 and not several:
            raise BadRequestError("several upstreams can manage models: add ?upstream=<host:port>")
        return chosen

    def admitted(self, path: str, names: Names) -> AbstractAsyncContextManager[Admitted[Body]]:
        """The one admission path (`gateway.relay.admission.admitted`) for this route's body.

        The key's RPM and in-flight slot are held for the block; no tokens are reserved. The
        model named first is noted for the access log and metrics (`Admitted.model`).

        Raises:
            ForbiddenError: it names a model off the key's allow-list, or carries a field that
                may reach beyond it (`_check_fields`).
        """

        def checked(body: Body) -> list[str]:
            _check_fields(self.principal, path, body)
            return names(body)

        return admitted(
            self.limiter,
            self.settings,
            self.principal,
            self.request,
            parse_body,
            checked,
            context=request_context(self.request.scope),
        )

    def headers(
        self, forwarded: dict[str, str], content_type: str = "application/json"
    ) -> dict[str, str]:
        """The upstream request's headers: the forwarded few with the request id, and the type."""
        return {**forwarded, "content-type": content_type}

    def _forwarded(self) -> dict[str, str]:
        """The forwarded headers of a request with no body to admit (the blob routes)."""
        return upstream_headers(self.request, request_context(self.request.scope))

    def record(self, model: str | None, status: int, outcome: Outcome) -> None:
        """Count the request in `gateway_requests_total` and name its outcome in the log."""
        request_context(self.request.scope).set_outcome(outcome)
        route = route_label(self.request.scope)
        key = self.principal.name if self.settings.metrics_per_key else ALL_KEYS
        label = self.pool.label(model) if model else OTHER_MODEL
        self.metrics.requests.labels(route, label, key, f"{status // 100}xx", outcome).inc()

    async def progress(self, path: str, name: str | None, names: Names) -> Response:
        """Pull, push or create: the upstream's progress stream, relayed as it comes."""
        if self.lifecycle.draining:
            raise ServiceUnavailableError("gateway is shutting down", headers={"Retry-After": "1"})
        (upstream,) = self.targets(name)
        # The key's limits are held while the body is checked, not while the transfer runs.
        async with self.admitted(path, names) as ticket:
            raw, model, forwarded = ticket.raw, ticket.model, ticket.headers
        client = upstream.client
        request = client.build_request("POST", path, content=raw, headers=self.headers(forwarded))
        return ProgressResponse(
            partial(send_streamed, client, request),
            self.lifecycle,
            lambda status, outcome: self.record(model, status, outcome),
        )

    async def each(self, method: str, path: str, name: str | None, names: Names) -> Response:
        """Copy or delete on each selected upstream; success when one did it and none failed.

        An upstream without the model (404) is no failure while another had it; when none
        has it, the 404 is the answer. Otherwise the first failure is, the others logged.
        """
        upstreams = self.targets(name, several=True)
        async with self.admitted(path, names) as ticket:
            return await self._each(method, path, upstreams, ticket)

    async def _each(
        self, method: str, path: str, upstreams: list[Upstream], ticket: Admitted[Body]
    ) -> Response:
        raw, model = ticket.raw, ticket.model
        answers: dict[int, httpx.Response | GatewayError] = {}

        async def one(index: int, upstream: Upstream) -> None:
            try:
                response = await fetch(
                    upstream.client,
                    method,
                    path,
                    budget=self.settings.first_byte_timeout,
                    content=raw,
                    headers=self.headers(ticket.headers),
                )
                answers[index] = response if response.is_success else error_of(response)
            except (httpx.HTTPError, TimeoutError) as exc:
                answers[index] = transport_error(exc)
            except GatewayError as exc:  # an over-long answer
                answers[index] = exc

        async with anyio.create_task_group() as group:
            for index, upstream in enumerate(upstreams):
                group.start_soon(one, index, upstream)
        results = [answers[index] for index in range(len(upstreams))]
        done = [r for r in results if isinstance(r, httpx.Response)]
        failed = [r for r in results if isinstance(r, GatewayError) and r.status_code != 404]
        if failed or not done:
            raise (failed or [r for r in results if isinstance(r, GatewayError)])[0]
        self.record(model, done[0].status_code, "completed")
        return passed(done[0])

    async def blob(self, digest: str, name: str | None) -> Response:
        """Whether the upstream has a blob (HEAD), or store one (POST, the body streamed).

        Raises:
            ForbiddenError: the key has a model allow-list: a digest names no model (403).
        """
        if self.principal.models is not None:
            raise ForbiddenError(
                "this API key may only manage the models on its allow-list, and a blob's "
                "digest names no model"
            )
        if not _DIGEST.fullmatch(digest):
            raise BadRequestError("invalid digest format")
        (upstream,) = self.targets(name)
        async with self.limiter.admitted(self.principal):
            return await self._blob(upstream, f"/api/blobs/{digest}")

    async def _blob(self, upstream: Upstream, path: str) -> Response:
        try:
            if self.request.method == "HEAD":
                response = await fetch(
                    upstream.client,
                    "HEAD",
                    path,
                    budget=self.settings.connect_timeout,
                    headers=self.headers(self._forwarded()),
                )
            else:
                response = await self._upload(upstream, path)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise transport_error(exc) from exc
        if response.status_code not in (200, 201, 404):
            raise error_of(response)
        self.record(None, response.status_code, "completed")
        return passed(response)

    async def _upload(self, upstream: Upstream, path: str) -> httpx.Response:
        headers = self.headers(self._forwarded(), "application/octet-stream")
        declared = self.request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise BadRequestError("invalid Content-Length")
            headers["content-length"] = declared
        async with _uploader(upstream, self.settings) as client:
            try:
                stream = self.request.stream()
                return await fetch(
                    client, "POST", path, budget=None, content=stream, headers=headers
                )
            except ClientDisconnect as exc:
                raise ClientClosedRequestError("client closed the connection") from exc


@asynccontextmanager
async def _uploader(upstream: Upstream, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A client that streams request bodies: the upstream's own only when it runs over httpx's."""
    if settings.upstream_http_client == "httpx":
        yield upstream.client
        return
    async with build_upstream_client(
        upstream.spec, UpstreamTimeouts.of(settings), httpx.AsyncHTTPTransport()
    ) as own:
        yield own


async def get_manager(
    request: Request,
    principal: PrincipalDep,
    pool: PoolDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    lifecycle: LifecycleDep,
    relay: RelayDep,
) -> Manager:
    """The request's `Manager`, for a key that may manage models.

    Raises:
        ForbiddenError: the key may not manage models (403).
    """
    if not principal.manage_models:
        raise ForbiddenError("this API key may not manage models")
    return Manager(request, principal, pool, settings, metrics, lifecycle, relay.limiter)


ManagerDep = Annotated[Manager, Depends(get_manager)]


@router.post("/pull")
async def pull(manager: ManagerDep, upstream: UpstreamParam = None) -> Response:
    """Download a model onto the upstream; NDJSON progress."""
    return await manager.progress("/api/pull", upstream, _model)


@router.post("/push")
async def push(manager: ManagerDep, upstream: UpstreamParam = None) -> Response:
    """Upload a model from the upstream to its registry; NDJSON progress."""
    return await manager.progress("/api/push", upstream, _model)


@router.post("/create")
async def create(manager: ManagerDep, upstream: UpstreamParam = None) -> Response:
    """Create a model on the upstream; NDJSON progress."""
    return await manager.progress("/api/create", upstream, _created)


@router.post("/copy")
async def copy(manager: ManagerDep, upstream: UpstreamParam = None) -> Response:
    """Copy a model on the upstream(s)."""
    return await manager.each("POST", "/api/copy", upstream, _copied)


@router.delete("/delete")
async def delete(manager: ManagerDep, upstream: UpstreamParam = None) -> Response:
    """Delete a model from the upstream(s)."""
    return await manager.each("DELETE", "/api/delete", upstream, _model)


@router.head("/blobs/{digest}")
async def blob_exists(digest: str, manager: ManagerDep, upstream: UpstreamParam = None) -> Response:
    """Whether the upstream has the blob (200 or 404)."""
    return await manager.blob(digest, upstream)


@router.post("/blobs/{digest}")
async def upload_blob(digest: str, manager: ManagerDep, upstream: UpstreamParam = None) -> Response:
    """Store a blob on the upstream, its body streamed through."""
    return await manager.blob(digest, upstream)
