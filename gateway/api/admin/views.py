"""The response bodies of `whoami`, `models` and `live` (docs/admin.md, "Live view").

Each is built from snapshots the owning objects hand out without I/O or locks: the live board
(`gateway.metering.live`), the upstreams' counters, breakers, gates, catalogs and monitors
(`gateway.upstream`), and the names of the keys in flight from the key store.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from typing import Literal

import httpx
from pydantic import BaseModel

from gateway.auth.identity import AdminIdentity
from gateway.metering.live import InFlight, Recent
from gateway.upstream.breaker import CircuitState
from gateway.upstream.pool import Upstream

#: Most keys `in_flight.by_key` lists (the most requests first): bounds the name lookup.
MAX_LIVE_KEYS = 100

_CIRCUITS: dict[CircuitState, Literal["closed", "open", "half_open"]] = {
    CircuitState.CLOSED: "closed",
    CircuitState.HALF_OPEN: "half_open",
    CircuitState.OPEN: "open",
}


class Whoami(BaseModel):
    """`GET /admin/v1/whoami`: who the token names and what it allows."""

    subject: str
    scopes: list[str]
    expires_at: datetime | None
    issuer: str | None = None

    @classmethod
    def of(cls, identity: AdminIdentity) -> Whoami:
        """The view of a verified token."""
        return cls(
            subject=identity.subject,
            scopes=sorted(identity.scopes),
            expires_at=identity.expires_at,
            issuer=identity.issuer,
        )


class CatalogModel(BaseModel):
    """One model id and the upstreams (`host:port`) that list it."""

    id: str
    upstreams: list[str]


class ModelList(BaseModel):
    """`GET /admin/v1/models`: the models the upstreams list, sorted by id."""

    object: Literal["list"] = "list"
    data: list[CatalogModel]


class KeyCount(BaseModel):
    """Requests in flight of one key; `name` None when the key store could not name it."""

    key_id: str
    name: str | None
    requests: int


class ModelCount(BaseModel):
    """Requests in flight for one model (the `model` metrics label)."""

    model: str
    requests: int


class UpstreamCount(BaseModel):
    """Requests in flight to one upstream."""

    upstream: str
    requests: int


class InFlightView(BaseModel):
    """The requests in flight in this process."""

    total: int
    by_key: list[KeyCount]
    by_model: list[ModelCount]
    by_upstream: list[UpstreamCount]


class QueueView(BaseModel):
    """Requests waiting for an upstream slot, over all upstreams."""

    waiting: int


class LoadedView(BaseModel):
    """A model the upstream has in memory (Ollama `/api/ps`)."""

    model: str
    size: int
    size_vram: int
    expires_at: datetime | None


class ReportedView(BaseModel):
    """What the server's own `/metrics` said at the monitor's last poll (vLLM, llama.cpp)."""

    waiting: float | None
    running: float | None
    kv_cache_usage: float | None


class UpstreamView(BaseModel):
    """One upstream as this process sees it."""

    upstream: str
    url: str
    dialect: str
    up: bool | None
    circuit: Literal["closed", "open", "half_open"]
    in_flight: int
    waiting: int
    capacity: int
    models: list[str]
    loaded: list[LoadedView] | None
    reported: ReportedView | None = None

    @classmethod
    def of(cls, upstream: Upstream) -> UpstreamView:
        """Read one upstream's counters, breaker, gate, catalog and monitor (no I/O)."""
        loaded = upstream.monitor.loaded
        report = upstream.monitor.report
        return cls(
            upstream=upstream.name,
            url=public_url(upstream.spec.base),
            dialect=upstream.dialect.name,
            up=upstream.monitor.up,
            circuit=_CIRCUITS[upstream.breaker.state],
            in_flight=upstream.in_flight,
            waiting=upstream.slots.waiting,
            capacity=upstream.slots.capacity,
            models=sorted(info.id for info in upstream.catalog.cached),
            loaded=None
            if loaded is None
            else [
                LoadedView(
                    model=m.model, size=m.size, size_vram=m.size_vram, expires_at=m.expires_at
                )
                for m in loaded
            ],
            reported=None
            if report is None
            else ReportedView(
                waiting=report.waiting, running=report.running, kv_cache_usage=report.kv_usage
            ),
        )


class RecentModelView(BaseModel):
    """The window's answers of one model."""

    model: str
    requests: int
    errors: int
    ttft_mean_s: float | None
    decode_tokens_per_s: float | None


class RecentView(BaseModel):
    """The answers finished in the last `window_seconds` (`gateway.metering.live.Recent`)."""

    window_seconds: float
    requests: int
    errors: int
    output_tokens: int
    ttft_mean_s: float | None
    ttft_p50_s: float | None
    decode_tokens_per_s: float | None
    truncated: bool
    by_model: list[RecentModelView]

    @classmethod
    def of(cls, recent: Recent) -> RecentView:
        """The view of the board's sums."""
        return cls(
            window_seconds=recent.window_seconds,
            requests=recent.requests,
            errors=recent.errors,
            output_tokens=recent.output_tokens,
            ttft_mean_s=recent.ttft_mean_s,
            ttft_p50_s=recent.ttft_p50_s,
            decode_tokens_per_s=recent.decode_tokens_per_s,
            truncated=recent.truncated,
            by_model=[
                RecentModelView(
                    model=m.model,
                    requests=m.requests,
                    errors=m.errors,
                    ttft_mean_s=m.ttft_mean_s,
                    decode_tokens_per_s=m.decode_tokens_per_s,
                )
                for m in recent.by_model
            ],
        )


class LiveView(BaseModel):
    """`GET /admin/v1/live`: this process's requests, queue, upstreams and latest answers."""

    object: Literal["live"] = "live"
    replica: str
    at: datetime
    in_flight: InFlightView
    queue: QueueView
    upstreams: list[UpstreamView]
    recent: RecentView


def replica() -> str:
    """`<host>:<pid>`: which process answered (each replica or worker keeps its own view)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def public_url(url: str) -> str:
    """`url` without its user, password, query and fragment (where credentials could hide)."""
    return str(httpx.URL(url).copy_with(username=None, password=None, query=None, fragment=None))


def live_view(
    in_flight: InFlight, names: dict[str, str], upstreams: list[Upstream], recent: Recent
) -> LiveView:
    """Assemble the live view from the snapshots (`names`: key id -> name, for `by_key`)."""
    by_key = [
        KeyCount(key_id=key_id, name=names.get(key_id), requests=count)
        for key_id, count in busiest(in_flight.by_key, MAX_LIVE_KEYS)
    ]
    by_model = [ModelCount(model=model, requests=n) for model, n in busiest(in_flight.by_model)]
    views = [UpstreamView.of(upstream) for upstream in upstreams]
    return LiveView(
        replica=replica(),
        at=datetime.now(UTC),
        in_flight=InFlightView(
            total=in_flight.total,
            by_key=by_key,
            by_model=by_model,
            by_upstream=[
                UpstreamCount(upstream=view.upstream, requests=view.in_flight) for view in views
            ],
        ),
        queue=QueueView(waiting=sum(view.waiting for view in views)),
        upstreams=views,
        recent=RecentView.of(recent),
    )


def busiest(counts: dict[str, int], limit: int | None = None) -> list[tuple[str, int]]:
    """`counts` most first (ties by name), at most `limit` of them (None: all)."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ordered if limit is None else ordered[:limit]
