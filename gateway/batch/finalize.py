"""Ending a batch: completed, cancelled or expired, with its output and error files.

The output and error files are written from the line rows in the transaction that ends the
batch: every `custom_id` is in exactly one of them, once.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.batch.files import FileStore
from gateway.batch.render import result_line
from gateway.db.tables import BatchEventRow, BatchLineRow, BatchRow, as_utc

#: Line rows read at a time when a batch's result files are written: the event loop gets a
#: turn between two pages (a 2,000-line batch ended in one 7.8 s step before).
_RESULT_PAGE = 100


class Finalizer:
    """Ends the batches that have no line left to run (any replica may; each ends once).

    Args:
        engine: The gateway's database.
        files: Where the output and error files go.

    Attributes:
        open_batches: Batches in progress or cancelling at the last `finalize`, less the ones
            it ended: 0 means no line of any batch can be claimed or counted as queued.
    """

    def __init__(self, engine: AsyncEngine, files: FileStore) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._postgres = engine.dialect.name == "postgresql"
        self._files = files
        self.open_batches = 0

    async def finalize(self) -> list[str]:
        """End every batch that has no line left to run; return their ids and end states.

        In progress with every line done: `completed`. Cancelling, or past its window, with
        no line running: `cancelled` or `expired`, the lines that never ran in the error file
        (`batch_cancelled`, `batch_expired`). Each batch ends in one transaction that also
        writes its output and error files.
        """
        now = as_utc(None)
        ended: list[str] = []
        async with self._sessions() as session:
            candidates = (
                await session.scalars(
                    select(BatchRow.id).where(BatchRow.status.in_(("in_progress", "cancelling")))
                )
            ).all()
        for batch_id in candidates:
            if await self._finalize_one(batch_id, now):
                ended.append(batch_id)
        self.open_batches = len(candidates) - len(ended)
        return ended

    async def _finalize_one(self, batch_id: str, now: datetime) -> bool:
        async with self._sessions.begin() as session:
            query = select(BatchRow).where(BatchRow.id == batch_id)
            if self._postgres:
                query = query.with_for_update(skip_locked=True)
            batch = await session.scalar(query)
            if batch is None or batch.status not in ("in_progress", "cancelling"):
                return False
            states = dict(
                (
                    await session.execute(
                        select(BatchLineRow.state, func.count())
                        .where(BatchLineRow.batch_id == batch_id)
                        .group_by(BatchLineRow.state)
                    )
                ).all()
            )
            running = states.get("running", 0)
            pending = states.get("pending", 0)
            expired = batch.expires_at <= now
            if batch.status == "cancelling":
                if running:
                    return False
                final = "cancelled"
            elif pending or running:
                if not expired or running:
                    return False
                final = "expired"
            else:
                final = "completed"
            output, errors = await _result_files(session, batch_id, final)
            if output:
                row = await self._files.new_row(
                    batch.key_id, f"{batch_id}_output.jsonl", "batch_output", output
                )
                session.add(row)
                batch.output_file_id = row.id
            if errors:
                row = await self._files.new_row(
                    batch.key_id, f"{batch_id}_error.jsonl", "batch_output", errors
                )
                session.add(row)
                batch.error_file_id = row.id
            batch.status = final
            batch.finalizing_at = now
            setattr(batch, f"{final}_at", now)
            session.add(BatchEventRow(batch_id=batch_id, at=now, event=final))
        return True


async def _result_files(session: AsyncSession, batch_id: str, final: str) -> tuple[bytes, bytes]:
    """The output and error files' bytes (OpenAI's line shapes) from a batch's line rows.

    The rows are read `_RESULT_PAGE` at a time (each read gives the event loop a turn), and a
    line's stored answer is spliced in as the JSON text it is rather than parsed and encoded
    again: parsing a 2,000-line batch's answers held the event loop for 7.8 s.
    """
    output: list[bytes] = []
    errors: list[bytes] = []
    last = 0
    columns = (
        BatchLineRow.line_no,
        BatchLineRow.custom_id,
        BatchLineRow.state,
        BatchLineRow.status_code,
        BatchLineRow.request_id,
        BatchLineRow.result,
        BatchLineRow.error_code,
        BatchLineRow.error_message,
    )
    while True:
        page = (
            await session.execute(
                select(*columns)
                .where(BatchLineRow.batch_id == batch_id, BatchLineRow.line_no > last)
                .order_by(BatchLineRow.line_no)
                .limit(_RESULT_PAGE)
            )
        ).all()
        if not page:
            break
        for line in page:
            succeeded, text = result_line(batch_id, line, final)
            (output if succeeded else errors).append(text)
        last = page[-1].line_no
    joined = (b"\n".join(output) + b"\n") if output else b""
    return joined, (b"\n".join(errors) + b"\n") if errors else b""
