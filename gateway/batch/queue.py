"""The line queue: claiming runnable lines under a lease, renewing, recording, releasing them.

Durability (docs/batch.md): each line moves `pending -> running -> succeeded | failed` through
conditional updates. A line is claimed with a lease (`lease_owner`, `lease_expires`); a result
is kept only if the lease is still the writer's, so a line taken over from a stalled replica is
recorded once. A line may run twice (a replica killed after the upstream answered and before
the result was written); it is recorded once.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.batch.records import RUNNING
from gateway.db.tables import BatchEventRow, BatchLineRow, BatchRow, as_utc


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    """A line this process holds the lease of."""

    batch_id: str
    line_no: int
    custom_id: str
    model: str
    body: bytes
    attempts: int
    endpoint: str
    key_id: str


class LineQueue:
    """The batch lines' queue on one `AsyncEngine` (the key store's), shared by every replica.

    Args:
        engine: The gateway's database.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._postgres = engine.dialect.name == "postgresql"

    async def claim(
        self, owner: str, count: int, lease_seconds: float, *, skip_keys: Sequence[str] = ()
    ) -> list[ClaimedLine]:
        """Lease up to `count` runnable lines: pending and due, or running with a lapsed lease.

        Keys take turns: each key's runnable lines are ranked (its oldest batch first, then
        model, so an upstream keeps one model loaded, then line), and the claim takes every
        key's first line before any key's second, so one key's 50,000-line batch cannot hold
        another key's two lines back; only each key's first `count` runnable lines are read,
        so the cost does not grow with the queue (`_pick`), and the lines are returned in turn
        order. Lines of the keys in `skip_keys` (held back by their own rate limits) are left
        alone. On PostgreSQL the rows are locked `FOR UPDATE SKIP
        LOCKED`, so replicas claiming at once take different lines. SQLite has one writer at a
        time but reads outside it: two processes on one file (`gateway serve --workers 2`) can
        read the same runnable lines, so each line is taken with an UPDATE that checks again
        that it is still runnable, and only the lines it updated are claimed (before, both ran
        such a line: 24 of 200 lines ran twice in tests/serve/test_workers.py, the loser's result
        discarded as superseded).
        """
        now = as_utc(None)
        runnable = or_(
            and_(
                BatchLineRow.state == "pending",
                or_(BatchLineRow.not_before.is_(None), BatchLineRow.not_before <= now),
            ),
            and_(BatchLineRow.state == "running", BatchLineRow.lease_expires < now),
        )
        claimed: list[ClaimedLine] = []
        expires = now + timedelta(seconds=lease_seconds)
        async with self._sessions.begin() as session:
            picked = await self._pick(session, now, count, skip_keys)
            if not picked:
                return claimed
            # The lines are picked first, then locked and checked again by the UPDATE below
            # (another replica may have taken one meanwhile). Each by its primary key: SQLite
            # scanned the whole table for a row-value IN, and read every pending line through
            # the state index with `runnable` here.
            keys = [
                and_(BatchLineRow.batch_id == batch_id, BatchLineRow.line_no == line_no)
                for batch_id, line_no in picked
            ]
            query = (
                select(BatchLineRow, BatchRow.endpoint, BatchRow.key_id)
                .join(BatchRow, BatchRow.id == BatchLineRow.batch_id)
                .where(or_(*keys))
            )
            if self._postgres:
                query = query.with_for_update(of=BatchLineRow, skip_locked=True)
            for line, endpoint, key_id in (await session.execute(query)).all():
                taken = await session.execute(
                    update(BatchLineRow)
                    .where(
                        BatchLineRow.batch_id == line.batch_id,
                        BatchLineRow.line_no == line.line_no,
                        runnable,
                    )
                    .values(state="running", lease_owner=owner, lease_expires=expires)
                    .execution_options(synchronize_session=False)
                )
                if not getattr(taken, "rowcount", 0):  # another process took it first
                    continue
                claimed.append(
                    ClaimedLine(
                        line.batch_id,
                        line.line_no,
                        line.custom_id,
                        line.model,
                        line.body,
                        line.attempts,
                        endpoint,
                        key_id,
                    )
                )
        turns = {line: turn for turn, line in enumerate(picked)}
        claimed.sort(key=lambda line: turns[(line.batch_id, line.line_no)])  # in turn order
        return claimed

    async def _pick(
        self, session: AsyncSession, now: datetime, count: int, skip_keys: Sequence[str]
    ) -> list[tuple[str, int]]:
        """The (batch id, line number) of the next `count` runnable lines, in turn order.

        Each line's turn is its rank among its key's runnable lines (oldest batch first, then
        model, then line); lines are taken by turn, then batch age, batch, line. Only a key's
        first `count` lines can be taken, so only those are read: per running batch at most
        `count` pending lines through `ix_gateway_batch_lines_claim`, which serves their order,
        until the key has `count`, plus the lapsed leases (no more than were running). Before,
        every runnable line was ranked at each claim: 1.0-1.5 s on SQLite with 200,000 queued.
        """
        batches = select(BatchRow.key_id, BatchRow.created_at, BatchRow.id).where(
            BatchRow.status.in_(RUNNING), BatchRow.expires_at > now
        )
        if skip_keys:
            batches = batches.where(BatchRow.key_id.not_in(list(skip_keys)))
        order = (BatchRow.key_id, BatchRow.created_at, BatchRow.id)
        rows = (await session.execute(batches.order_by(*order))).all()
        if not rows:
            return []
        lapsed: dict[str, list[tuple[str, int]]] = {}
        expired_leases = select(
            BatchLineRow.batch_id, BatchLineRow.model, BatchLineRow.line_no
        ).where(BatchLineRow.state == "running", BatchLineRow.lease_expires < now)
        for batch_id, model, line_no in (await session.execute(expired_leases)).all():
            lapsed.setdefault(batch_id, []).append((model, line_no))
        ranked: list[tuple[int, datetime, str, int]] = []  # (turn, created_at, batch, line)
        for _, group in itertools.groupby(rows, key=lambda row: row.key_id):
            turn = 0
            for _, created_at, batch_id in group:
                if turn >= count:
                    break
                pending = (
                    select(BatchLineRow.model, BatchLineRow.line_no)
                    .where(
                        BatchLineRow.batch_id == batch_id,
                        BatchLineRow.state == "pending",
                        or_(BatchLineRow.not_before.is_(None), BatchLineRow.not_before <= now),
                    )
                    .order_by(BatchLineRow.model, BatchLineRow.line_no)
                    .limit(count - turn)
                )
                found = [(m, n) for m, n in (await session.execute(pending)).all()]
                for _, line_no in sorted([*found, *lapsed.get(batch_id, [])])[: count - turn]:
                    turn += 1
                    ranked.append((turn, created_at, batch_id, line_no))
        ranked.sort()
        return [(batch_id, line_no) for _, _, batch_id, line_no in ranked[:count]]

    async def renew(self, owner: str, lease_seconds: float) -> None:
        """Extend the leases of every line `owner` is running."""
        expires = as_utc(None) + timedelta(seconds=lease_seconds)
        async with self._sessions.begin() as session:
            await session.execute(
                update(BatchLineRow)
                .where(BatchLineRow.lease_owner == owner, BatchLineRow.state == "running")
                .values(lease_expires=expires)
            )

    def _mine(self, owner: str, line: ClaimedLine) -> Any:
        return and_(
            BatchLineRow.batch_id == line.batch_id,
            BatchLineRow.line_no == line.line_no,
            BatchLineRow.lease_owner == owner,
            BatchLineRow.state == "running",
        )

    async def finish_line(
        self,
        owner: str,
        line: ClaimedLine,
        *,
        succeeded: bool,
        request_id: str,
        status_code: int | None,
        result: bytes | None,
        error_code: str | None = None,
        error_message: str | None = None,
        attempts: int,
    ) -> bool:
        """Record a line's final result, if its lease is still `owner`'s; True if recorded."""
        now = as_utc(None)
        async with self._sessions.begin() as session:
            done = await session.execute(
                update(BatchLineRow)
                .where(self._mine(owner, line))
                .values(
                    state="succeeded" if succeeded else "failed",
                    attempts=attempts,
                    request_id=request_id,
                    status_code=status_code,
                    result=result,
                    error_code=error_code,
                    error_message=error_message,
                    finished_at=now,
                    lease_owner=None,
                    lease_expires=None,
                )
            )
            recorded = bool(getattr(done, "rowcount", 0))
            if recorded and not succeeded:
                session.add(
                    BatchEventRow(
                        batch_id=line.batch_id,
                        at=now,
                        event="line_failed",
                        line_no=line.line_no,
                        custom_id=line.custom_id,
                        attempt=attempts,
                        status_code=status_code,
                        message=error_message,
                    )
                )
        return recorded

    async def release_line(
        self,
        owner: str,
        line: ClaimedLine,
        *,
        not_before: datetime,
        attempts: int,
        event: str | None = None,
        status_code: int | None = None,
        message: str | None = None,
    ) -> None:
        """Put a line back to `pending` until `not_before` (a retry, or no capacity now)."""
        async with self._sessions.begin() as session:
            done = await session.execute(
                update(BatchLineRow)
                .where(self._mine(owner, line))
                .values(
                    state="pending",
                    attempts=attempts,
                    not_before=not_before,
                    lease_owner=None,
                    lease_expires=None,
                )
            )
            if event is not None and bool(getattr(done, "rowcount", 0)):
                session.add(
                    BatchEventRow(
                        batch_id=line.batch_id,
                        at=as_utc(None),
                        event=event,
                        line_no=line.line_no,
                        custom_id=line.custom_id,
                        attempt=attempts,
                        status_code=status_code,
                        message=message,
                    )
                )

    async def queue_depth(self) -> int:
        """Lines waiting to run, over every running batch (all replicas)."""
        async with self._sessions() as session:
            count = await session.scalar(
                select(func.count())
                .select_from(BatchLineRow)
                .join(BatchRow, BatchRow.id == BatchLineRow.batch_id)
                .where(BatchRow.status.in_(RUNNING), BatchLineRow.state == "pending")
            )
        return int(count or 0)
