"""The admin API's read-only views of this process: `whoami`, `models` and `live`.

Included into the admin router (`gateway.api.admin.routes`), so these share its token check,
its error responses and its OpenAPI document. `live` is per process (docs/admin.md, "Live
view"): the answer names its `replica`, and each replica must be asked in turn, or Prometheus
read for the sums of all.
"""

from __future__ import annotations

import logging

import httpx
from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError

from gateway.api.admin.auth import IdentityDep, ReaderDep
from gateway.api.admin.body import BoundedBodyRoute
from gateway.api.admin.views import (
    MAX_LIVE_KEYS,
    CatalogModel,
    LiveView,
    ModelList,
    Whoami,
    busiest,
    live_view,
)
from gateway.deps import KeysDep, MetricsDep, PoolDep

logger = logging.getLogger("gateway.admin")

router = APIRouter(route_class=BoundedBodyRoute)


@router.get("/whoami")
async def whoami(identity: IdentityDep, _: ReaderDep) -> Whoami:
    """Who the token names, its scopes and when it expires."""
    return Whoami.of(identity)


@router.get("/models")
async def models(pool: PoolDep, _: ReaderDep) -> ModelList:
    """The models the upstreams list (as last fetched), sorted by id, with who lists each."""
    listed: dict[str, list[str]] = {}
    for upstream in pool.upstreams:
        try:
            infos = await upstream.catalog.current()  # fetched now only if it never was
        except (httpx.HTTPError, ValueError, TypeError, KeyError, TimeoutError):
            logger.warning("upstream %s: model list unavailable", upstream.name)
            continue
        for info in infos:
            listed.setdefault(info.id, []).append(upstream.name)
    return ModelList(
        data=[CatalogModel(id=model, upstreams=listed[model]) for model in sorted(listed)]
    )


@router.get("/live")
async def live(metrics: MetricsDep, pool: PoolDep, store: KeysDep, _: ReaderDep) -> LiveView:
    """This replica's requests in flight, queue, upstreams and last minute of answers."""
    board = metrics.live
    in_flight, recent = board.in_flight(), board.recent()  # both before the await below
    shown = [key_id for key_id, _count in busiest(in_flight.by_key, MAX_LIVE_KEYS)]
    try:
        names = await store.names(shown)
    except (SQLAlchemyError, OSError) as exc:  # the names are a courtesy: show the ids
        logger.warning("live view: key names unavailable (%s)", type(exc).__name__)
        names = {}
    return live_view(in_flight, names, pool.upstreams, recent)
