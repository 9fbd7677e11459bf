"""The usage sink: per (key, model, UTC day) sums in memory, added to `gateway_usage` in batches.

On the request path `UsageSink.record` (a finished request's `RequestSummary`) and
`record_rejection` (a request refused after authentication) only add integers to a dict entry:
no I/O, no await. `run` writes the pending sums every `GATEWAY_USAGE_FLUSH_SECONDS` (sooner when
half of `GATEWAY_USAGE_MAX_PENDING_ROWS` rows are pending), and once more when it is stopped,
after the server has finished its in-flight requests (`open_usage`, `gateway.lifespan`).

Exactness (docs/keys.md, "Usage"):

* One flush is one transaction of upserts that add (`col = col + excluded.col`): all rows of
  the batch commit or none do, and the sums leave memory only after the commit, so a failed
  flush is retried at the next interval without counting anything twice, and replicas add up
  without reading first. Rows are written in key order, so two replicas never deadlock.
* Durations are whole microseconds, so sums from any number of replicas are exact.
* Memory is bounded: a request that would add a row beyond `max_rows` pending rows (the batch
  being written included) is dropped and counted in `gateway_usage_dropped_total`.

What a request adds is decided in `gateway.metering.counting`; the day is the UTC date of the
request's arrival. The model is the one that ran (`RequestSummary.requested_model`, canonical),
except for a request that failed for a model no upstream lists (the `model` label `other`): it
is recorded under `other`, as Prometheus counts it, so made-up model names cannot make a row
each (one key could otherwise add thousands of rows a minute); the rows per key and day stay
bounded by the catalog.

Over ~300 lines for one reason: `UsageSink`'s adds on the request path and its flushes share the
pending sums and their bound, and the exactness rules above hold only across both (the sums leave
memory after the commit, a failed batch is put back, drops are counted).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db.tables import UsageRow
from gateway.metering.counting import (
    COLUMNS,
    canonical_model,
    rejection_deltas,
    summary_deltas,
)
from gateway.metering.metrics import OTHER_MODEL
from gateway.neutral import RequestSummary

logger = logging.getLogger("gateway.metering")

#: Longest wait for the final flush at shutdown, seconds.
SHUTDOWN_FLUSH_TIMEOUT = 10.0
_DAY_SECONDS = 86_400.0

RowKey = tuple[str, str, date]
"""(key id, canonical model, UTC day): the primary key of a `gateway_usage` row."""


class _Other:
    """The model of a failed request for a model no upstream lists: recorded as `other`.

    A type of its own, not the string: a real model named `other` is `other:latest`.
    """


_OTHER = _Other()


def _bounded(model: str | None, label: str | None) -> _Other | str | None:
    """`model`, or `_OTHER` when its label (given only for a failed request) is `other`."""
    return _OTHER if model is not None and label == OTHER_MODEL else model


class UsageSink:
    """Pending usage sums, and their flushes; see the module docstring.

    Args:
        engine: The database holding `gateway_usage` (SQLite or PostgreSQL).
        registry: Where the sink's metrics are registered (the app's `Metrics.registry`).
        flush_seconds: Interval between flushes (`GATEWAY_USAGE_FLUSH_SECONDS`).
        max_rows: Most pending rows (`GATEWAY_USAGE_MAX_PENDING_ROWS`).
        clock: Wall-clock seconds since the epoch (tests pass their own).

    Raises:
        ValueError: the engine's dialect has no upsert here (neither SQLite nor PostgreSQL).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        registry: CollectorRegistry | None = None,
        flush_seconds: float = 2.0,
        max_rows: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if engine.dialect.name not in ("sqlite", "postgresql"):
            raise ValueError(f"usage accounting needs SQLite or PostgreSQL, not {engine.dialect}")
        self._engine = engine
        self._interval = flush_seconds
        self._max_rows = max_rows
        self._high_water = max(1, max_rows // 2)
        self._clock = clock
        self._pending: dict[RowKey, list[int]] = {}
        self._writing = 0  # rows of the batch being written: they count against the bound
        self._lock = anyio.Lock()
        self._wake = anyio.Event()
        self._stopped = anyio.Event()
        self._closed = False
        self._unreported_drops = 0
        self._day: tuple[float, float, date] = (0.0, 0.0, date.min)
        registry = registry or CollectorRegistry(auto_describe=True)
        self.dropped = Counter(
            "gateway_usage_dropped",
            "Requests whose usage was not recorded: the pending rows were at their bound, or "
            "the final flush at shutdown failed.",
            registry=registry,
        )
        self.flush_failures = Counter(
            "gateway_usage_flush_failures",
            "Usage flushes that failed (the sums are kept and retried at the next interval).",
            registry=registry,
        )
        self.pending_rows = Gauge(
            "gateway_usage_pending_rows",
            "Usage rows waiting to be written (the batch being written included).",
            multiprocess_mode="livesum",
            registry=registry,
        )
        # With workers (gateway.serve.workers) values are read from files, not from a function:
        # the gauge is set where the count changes instead.
        self._set_pending = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        if not self._set_pending:
            self.pending_rows.set_function(lambda: len(self._pending) + self._writing)

    def record(self, summary: RequestSummary) -> None:
        """Add one finished request (no I/O); a summary without a key id is ignored.

        A failed request whose `model` label is `other` (no upstream lists its model: the
        upstream's 404 for a made-up name) is recorded under `other` (module docstring).
        """
        if summary.key_id is not None:
            arrived = self._clock() - summary.duration_s
            failed = summary.status >= 400 or summary.outcome != "completed"
            model = _bounded(summary.requested_model, summary.model if failed else None)
            self._add(summary.key_id, model, arrived, summary_deltas(summary))

    def record_rejection(
        self,
        key_id: str,
        model: str | None,
        *,
        status: int,
        outcome: str,
        elapsed_s: float,
        label: str | None = None,
    ) -> None:
        """Add one request refused after authentication, before the relay (no I/O).

        Args:
            key_id: The authenticated key's id.
            model: The model the body named, or None if it was refused before that was known.
            status: The refusal's HTTP status.
            outcome: The refusal's outcome (`rate_limited`, `forbidden`, ...).
            elapsed_s: Seconds since the request arrived (to date its arrival).
            label: `model`'s Prometheus `model` label (`UpstreamPool.label`): `other`, a model
                no upstream lists, is recorded under `other`, not under the name sent.
        """
        arrived = self._clock() - elapsed_s
        self._add(key_id, _bounded(model, label), arrived, rejection_deltas(status, outcome))

    def _add(
        self, key_id: str, model: _Other | str | None, arrived: float, deltas: Sequence[int]
    ) -> None:
        name = OTHER_MODEL if isinstance(model, _Other) else canonical_model(model)
        key = (key_id, name, self._utc_day(arrived))
        row = self._pending.get(key)
        if row is None:
            if self._closed or len(self._pending) + self._writing >= self._max_rows:
                self.dropped.inc()
                self._unreported_drops += 1
                return
            row = self._pending[key] = [0] * len(COLUMNS)
            self._show_pending()
            if len(self._pending) >= self._high_water:
                self._wake.set()
        for index, delta in enumerate(deltas):
            row[index] += delta

    def _utc_day(self, moment: float) -> date:
        """The UTC date of `moment` (epoch seconds), with the current day's bounds cached."""
        start, end, day = self._day
        if start <= moment < end:
            return day
        day = datetime.fromtimestamp(moment, UTC).date()
        start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        self._day = (start, start + _DAY_SECONDS, day)
        return day

    @property
    def pending(self) -> dict[RowKey, tuple[int, ...]]:
        """A copy of the pending sums, by row key, in `COLUMNS` order (for tests and logs)."""
        return {key: tuple(row) for key, row in self._pending.items()}

    async def flush(self) -> bool:
        """Write the pending sums in one transaction; True when nothing is left unwritten.

        On failure the batch goes back into the pending sums (merged with what arrived
        meanwhile) and is written by a later flush; the failure is logged and counted.
        """
        async with self._lock:
            if not self._pending:
                return True
            batch, self._pending = self._pending, {}
            self._writing = len(batch)
            self._show_pending()
            try:
                await self._write(batch)
            except BaseException as exc:  # cancelled too: nothing committed, keep the sums
                self._restore(batch)
                self.flush_failures.inc()
                if not isinstance(exc, Exception):
                    raise
                logger.warning(
                    "usage flush of %d rows failed, kept for the next one: %s",
                    len(batch),
                    type(exc).__name__,
                )
                return False
            finally:
                self._writing = 0
                self._show_pending()
            return True

    def _show_pending(self) -> None:
        if self._set_pending:
            self.pending_rows.set(len(self._pending) + self._writing)

    def _restore(self, batch: dict[RowKey, list[int]]) -> None:
        for key, sums in batch.items():
            row = self._pending.get(key)
            if row is None:
                self._pending[key] = sums
            else:
                for index, value in enumerate(sums):
                    row[index] += value

    async def _write(self, batch: dict[RowKey, list[int]]) -> None:
        rows: list[dict[str, Any]] = [
            {"key_id": key_id, "model": model, "day": day, **dict(zip(COLUMNS, sums, strict=True))}
            for (key_id, model, day), sums in sorted(batch.items())
        ]
        dialect = postgresql if self._engine.dialect.name == "postgresql" else sqlite
        insert = dialect.insert(UsageRow)
        table = UsageRow.__table__.c
        upsert = insert.on_conflict_do_update(
            index_elements=["key_id", "model", "day"],
            set_={name: table[name] + insert.excluded[name] for name in COLUMNS},
        )
        async with self._engine.begin() as connection:
            await connection.execute(upsert, rows)

    async def run(self) -> None:
        """Flush every interval, or sooner when half full, until `stop`; then a last time.

        After a failed flush the next try waits for the interval even when the sink fills up,
        so a database that is down is not hammered. The final flush waits at most
        `SHUTDOWN_FLUSH_TIMEOUT` seconds, even when the caller is being cancelled.
        """
        try:
            while not self._stopped.is_set():
                with anyio.move_on_after(self._interval):
                    await self._wake.wait()
                if self._stopped.is_set():
                    break
                self._wake = anyio.Event()
                written = await self.flush()
                self._report_drops()
                if not written:
                    with anyio.move_on_after(self._interval):
                        await self._stopped.wait()
        finally:
            with anyio.move_on_after(SHUTDOWN_FLUSH_TIMEOUT, shield=True):
                await self.flush()
            self._close()

    def stop(self) -> None:
        """Make `run` write what is pending and return (call once requests have finished)."""
        self._stopped.set()
        self._wake.set()

    def _close(self) -> None:
        """Stop taking sums; what could not be written now is lost, logged and counted."""
        self._closed = True
        lost = sum(row[0] for row in self._pending.values())
        if lost:
            self.dropped.inc(lost)
            logger.error("usage of %d requests could not be written at shutdown", lost)
        self._pending.clear()
        self._report_drops()

    def _report_drops(self) -> None:
        if self._unreported_drops:
            logger.warning(
                "usage of %d requests dropped: %d rows pending (GATEWAY_USAGE_MAX_PENDING_ROWS)",
                self._unreported_drops,
                self._max_rows,
            )
            self._unreported_drops = 0


@asynccontextmanager
async def open_usage(
    engine: AsyncEngine,
    registry: CollectorRegistry,
    *,
    enabled: bool = True,
    flush_seconds: float = 2.0,
    max_rows: int = 10_000,
) -> AsyncIterator[UsageSink | None]:
    """Run a `UsageSink`'s flush loop for the duration of the block; None when disabled.

    Leave the block only after the last request has been recorded (the lifespan's end, which
    uvicorn reaches after its in-flight requests finished): leaving it stops the loop and
    writes what is pending.
    """
    if not enabled:
        yield None
        return
    sink = UsageSink(engine, registry=registry, flush_seconds=flush_seconds, max_rows=max_rows)
    async with anyio.create_task_group() as group:
        group.start_soon(sink.run)
        try:
            yield sink
        finally:
            sink.stop()
