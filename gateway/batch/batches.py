"""Batches: creating one with its lines, reading, listing and cancelling it, its own log.

Owns the `gateway_batches` rows from creation to `cancelling` (a batch and all its lines are
written in one transaction) and the batch-creation check slots; the lines' runs are
`gateway.batch.queue`'s, the end of a batch `gateway.batch.finalize`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from gateway.batch.records import RUNNING, new_id, owned, page
from gateway.batch.render import batch_object, event_object
from gateway.batch.slots import KeySlots
from gateway.batch.validate import InputLine, LineError
from gateway.db.tables import BatchEventRow, BatchLineRow, BatchRow, as_utc

#: The completion windows accepted (OpenAI accepts only `24h`; shorter ones help tests).
WINDOWS = {"24h": 86_400.0, "1h": 3_600.0}
#: Line rows written per INSERT when a batch is created.
_INSERT_CHUNK = 1000


def parse_window(window: str) -> float | None:
    """The completion window in seconds (`24h`, `1h`, or `<n>s`/`<n>m` for tests), else None."""
    if window in WINDOWS:
        return WINDOWS[window]
    # ASCII digits only: str.isdigit() also takes superscripts (int() refuses them).
    if not re.fullmatch(r"[0-9]{1,6}[smh]", window):
        return None
    seconds = int(window[:-1]) * {"s": 1, "m": 60, "h": 3600}[window[-1]]
    return float(seconds) if 0 < seconds <= 86_400 else None


class BatchStore:
    """The Batch API's batches on one `AsyncEngine` (the key store's).

    Args:
        engine: The gateway's database.

    Attributes:
        checks: Held by a batch creation while its file is checked (its checked lines are in
            memory, at most about the file's size). Apart from the files' `uploads`: a batch
            creation never waits behind another key's slow upload.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self.checks = KeySlots("batch creations", per_key=1, total=2, wait=30.0)

    async def queued_lines(self, key_id: str) -> int:
        """Lines of `key_id`'s running batches not finished yet (pending or running)."""
        async with self._sessions() as session:
            count = await session.scalar(
                select(func.count())
                .select_from(BatchLineRow)
                .join(BatchRow, BatchRow.id == BatchLineRow.batch_id)
                .where(
                    BatchRow.key_id == key_id,
                    BatchRow.status.in_(RUNNING),
                    BatchLineRow.state.in_(("pending", "running")),
                )
            )
        return int(count or 0)

    async def create_batch(
        self,
        key_id: str,
        *,
        endpoint: str,
        input_file_id: str,
        window: str,
        window_seconds: float,
        metadata: dict[str, str] | None,
        lines: Sequence[InputLine],
        errors: Sequence[LineError],
    ) -> dict[str, Any]:
        """Create a batch with its lines (one transaction); `failed` at once if `errors`."""
        now = as_utc(None)
        row = BatchRow(
            id=new_id("batch_"),
            key_id=key_id,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=window,
            status="failed" if errors else "in_progress",
            batch_metadata=metadata,
            errors=[e.as_openai() for e in errors] or None,
            total=0 if errors else len(lines),
            created_at=now,
            expires_at=now + timedelta(seconds=window_seconds),
            in_progress_at=None if errors else now,
            failed_at=now if errors else None,
        )
        async with self._sessions.begin() as session:
            session.add(row)
            await session.flush()
            # Core bulk inserts in chunks rather than 50,000 ORM objects at once: the event
            # loop gets a turn while each chunk is written (it stalled 0.9 s before).
            for start in range(0, 0 if errors else len(lines), _INSERT_CHUNK):
                await session.execute(
                    insert(BatchLineRow),
                    [
                        {
                            "batch_id": row.id,
                            "line_no": line.line_no,
                            "custom_id": line.custom_id,
                            "model": line.model,
                            "body": line.body,
                            "state": "pending",
                            "attempts": 0,
                        }
                        for line in lines[start : start + _INSERT_CHUNK]
                    ],
                )
            session.add(
                BatchEventRow(
                    batch_id=row.id,
                    at=now,
                    event="failed" if errors else "created",
                    message=f"{len(errors)} validation errors" if errors else f"{len(lines)} lines",
                )
            )
        return await self._object(row)

    async def _counts(self, batch_id: str) -> dict[str, int]:
        async with self._sessions() as session:
            rows = await session.execute(
                select(BatchLineRow.state, func.count())
                .where(BatchLineRow.batch_id == batch_id)
                .group_by(BatchLineRow.state)
            )
            return {str(state): int(count) for state, count in rows.all()}

    async def _object(self, row: BatchRow) -> dict[str, Any]:
        return batch_object(row, await self._counts(row.id))

    async def get_batch(self, key_id: str, batch_id: str) -> dict[str, Any] | None:
        """The batch object, if it exists and is `key_id`'s."""
        async with self._sessions() as session:
            row = await owned(session, BatchRow, key_id, batch_id)
        if row is None:
            return None
        return await self._object(row)

    async def list_batches(
        self, key_id: str, *, limit: int, after: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        """`key_id`'s batches, newest first, after the batch `after`; (objects, has_more)."""
        query = select(BatchRow).where(BatchRow.key_id == key_id)
        async with self._sessions() as session:
            rows, more = await page(session, BatchRow, query, key_id, limit, after)
        return [await self._object(r) for r in rows], more

    async def cancel(self, key_id: str, batch_id: str) -> dict[str, Any] | None:
        """Stop claiming the batch's lines (`cancelling`); running lines finish."""
        now = as_utc(None)
        async with self._sessions.begin() as session:
            row = await owned(session, BatchRow, key_id, batch_id)
            if row is None:
                return None
            if row.status == "in_progress":
                row.status = "cancelling"
                row.cancelling_at = now
                session.add(BatchEventRow(batch_id=batch_id, at=now, event="cancelling"))
        return await self._object(row)

    async def events(self, key_id: str, batch_id: str, limit: int) -> list[dict[str, Any]] | None:
        """The batch's own log, oldest first (at most `limit` entries)."""
        async with self._sessions() as session:
            batch = await owned(session, BatchRow, key_id, batch_id)
            if batch is None:
                return None
            rows = await session.scalars(
                select(BatchEventRow)
                .where(BatchEventRow.batch_id == batch_id)
                .order_by(BatchEventRow.id)
                .limit(limit)
            )
            return [event_object(r) for r in rows]
