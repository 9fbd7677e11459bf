"""Files, batches and batch lines in the gateway's database (SQLite or PostgreSQL).

Durability (docs/batch.md): a batch and all its lines are written in one transaction when it is
created; each line then moves `pending -> running -> succeeded | failed` through conditional
updates. A line is claimed with a lease (`lease_owner`, `lease_expires`); a result is kept only
if the lease is still the writer's, so a line taken over from a stalled replica is recorded
once. The output and error files are written from the line rows in the transaction that ends
the batch: every `custom_id` is in exactly one of them, once. A line may run twice (a replica
killed after the upstream answered and before the result was written); it is recorded once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import sqlite3
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
from sqlalchemy import LargeBinary, Select, and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.batch.slots import KeySlots
from gateway.batch.validate import InputLine, LineError
from gateway.db.tables import BatchEventRow, BatchLineRow, BatchRow, FileRow, as_utc

_Row = TypeVar("_Row", FileRow, BatchRow)

#: Statuses in which a batch's lines may still be claimed.
RUNNING = ("in_progress",)
#: Statuses a batch ends in.
ENDED = ("completed", "failed", "expired", "cancelled")
#: The completion windows accepted (OpenAI accepts only `24h`; shorter ones help tests).
WINDOWS = {"24h": 86_400.0, "1h": 3_600.0}


def new_id(prefix: str) -> str:
    """A random public id such as `file-3f9c...` (96 bits)."""
    return f"{prefix}{secrets.token_hex(12)}"


#: Line rows written per INSERT when a batch is created.
_INSERT_CHUNK = 1000
#: Bytes of a file read at a time (a download, a batch's checks): what one reader holds.
CHUNK = 1024 * 1024
#: The same on PostgreSQL: a `substr` range of a compressed value decompresses it from its
#: start, so reading a 100 MiB file of JSONL by 1 MiB ranges cost the server 10.5 s, by 4 MiB
#: ranges 3.2 s (reading it whole: 0.3 s, and the whole file in this process).
PG_CHUNK = 4 * CHUNK
#: Line rows read at a time when a batch's result files are written: the event loop gets a
#: turn between two pages (a 2,000-line batch ended in one 7.8 s step before).
_RESULT_PAGE = 100

#: The shape of every id `new_id` makes: anything else names nothing, and is not looked up
#: (PostgreSQL refuses a NUL in a text parameter with an error, not a miss).
_ID = re.compile(r"(?:file-|batch_)[0-9a-f]{24}")


def parse_window(window: str) -> float | None:
    """The completion window in seconds (`24h`, `1h`, or `<n>s`/`<n>m` for tests), else None."""
    if window in WINDOWS:
        return WINDOWS[window]
    # ASCII digits only: str.isdigit() also takes superscripts (int() refuses them).
    if not re.fullmatch(r"[0-9]{1,6}[smh]", window):
        return None
    seconds = int(window[:-1]) * {"s": 1, "m": 60, "h": 3600}[window[-1]]
    return float(seconds) if 0 < seconds <= 86_400 else None


class UnknownCursorError(LookupError):
    """A list's `after` names no object of the key (deleted, never existed, another key's)."""


class FileGoneError(LookupError):
    """A file was deleted while its bytes were being read."""


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One file's metadata (OpenAI's file object)."""

    id: str
    key_id: str
    filename: str
    purpose: str
    size: int
    created_at: datetime

    def as_openai(self) -> dict[str, Any]:
        """OpenAI's file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.size,
            "created_at": int(self.created_at.timestamp()),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


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


def _file(row: FileRow) -> FileRecord:
    return FileRecord(row.id, row.key_id, row.filename, row.purpose, row.size, row.created_at)


def _ts(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


class BatchStore:
    """The Batch API's storage on one `AsyncEngine` (the key store's).

    Args:
        engine: The gateway's database.
        storage_dir: Where file contents go; None keeps them in the database.

    Attributes:
        uploads: Held by an upload while its body arrives and is stored (one per key, four
            per process: an upload holds its file once in memory while it is stored).
        downloads: Held by a download while it streams (`CHUNK` bytes in memory each).
        checks: Held by a batch creation while its file is checked (its checked lines are in
            memory, at most about the file's size). Apart from `uploads`: a batch creation
            never waits behind another key's slow upload.
    """

    def __init__(self, engine: AsyncEngine, storage_dir: str | None = None) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._dir = Path(storage_dir) if storage_dir else None
        if self._dir is not None:
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._postgres = engine.dialect.name == "postgresql"
        database = engine.url.database if engine.dialect.name == "sqlite" else None
        # A file database that a second connection can open (not `:memory:`).
        self._sqlite_file = database if database and database != ":memory:" else None
        self.uploads = KeySlots("uploads", per_key=1, total=4, wait=10.0)
        self.downloads = KeySlots("downloads", per_key=4, total=32, wait=10.0)
        self.checks = KeySlots("batch creations", per_key=1, total=2, wait=30.0)

    # --- files -------------------------------------------------------------------------------

    def _path(self, file_id: str) -> Path:
        assert self._dir is not None  # noqa: S101
        return self._dir / file_id

    def _write(self, file_id: str, content: bytes) -> None:
        path = self._path(file_id)
        temporary = path.with_name(f".{file_id}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)

    async def _file_row(self, key_id: str, filename: str, purpose: str, content: bytes) -> FileRow:
        """A new file's row; with a storage directory its bytes are written there first."""
        file_id = new_id("file-")
        if self._dir is not None:  # file I/O off the event loop (100 MiB: a second of fsync)
            await anyio.to_thread.run_sync(self._write, file_id, content)
        return FileRow(
            id=file_id,
            key_id=key_id,
            filename=filename[:255],
            purpose=purpose,
            size=len(content),
            created_at=as_utc(None),
            content=None if self._dir is not None else content,
        )

    async def create_file(
        self, key_id: str, filename: str, purpose: str, content: bytes
    ) -> FileRecord:
        """Store an uploaded file for `key_id`; return its record."""
        row = await self._file_row(key_id, filename, purpose, content)
        try:
            async with self._sessions.begin() as session:
                session.add(row)
        except BaseException:
            if self._dir is not None:  # no row will ever name these bytes
                self._path(row.id).unlink(missing_ok=True)
            raise
        return _file(row)

    async def get_file(self, key_id: str, file_id: str) -> FileRecord | None:
        """The file, if it exists and is `key_id`'s (else None: a 404 either way).

        Its metadata only: the bytes are never loaded here (`FileRow.content` is deferred).
        """
        async with self._sessions() as session:
            row = await _owned(session, FileRow, key_id, file_id)
            return None if row is None else _file(row)

    async def content(self, record: FileRecord) -> AsyncGenerator[bytes, None]:
        """The bytes of the file `record` (from `get_file`), `CHUNK` at a time.

        From the database as `substr` ranges (SQLite and PostgreSQL both take byte ranges of a
        blob), else from the storage directory: a reader holds one chunk, however large the
        file, and a reader that stops reading holds no more.

        Raises:
            FileGoneError: the file was deleted before all its bytes were read.
        """
        async with self._sessions() as session:
            # length() reads a blob's size from its header, never the blob (IS NOT NULL does).
            stored = await session.scalar(
                select(func.length(FileRow.content)).where(FileRow.id == record.id)
            )
            if stored is None and await session.get(FileRow, record.id) is None:
                raise FileGoneError(record.id)
        if stored is None:  # in the storage directory
            async for part in self._file_chunks(record.id):
                yield part
            return
        offset = 0
        while offset < record.size:
            piece = await self._db_part(record.id, offset)
            if not piece:
                raise FileGoneError(record.id)
            offset += len(piece)
            yield piece

    async def _db_part(self, file_id: str, offset: int) -> bytes | None:
        """A range of a file held in the database, from `offset`; None once it is gone.

        SQLite's `substr` reads the whole blob for every range (0.2 s and 100 MiB of memory per
        range of a 100 MiB file): on SQLite the range is read through SQLite's incremental blob
        I/O instead, `CHUNK` bytes, on a connection of its own in a worker thread, one short
        read transaction per range (a download that stalls holds no lock). PostgreSQL reads
        the range itself, `PG_CHUNK` bytes.
        """
        if self._sqlite_file is not None:
            return await anyio.to_thread.run_sync(_sqlite_part, self._sqlite_file, file_id, offset)
        async with self._sessions() as session:
            part = await session.scalar(
                select(func.substr(FileRow.content, offset + 1, PG_CHUNK, type_=LargeBinary)).where(
                    FileRow.id == file_id
                )
            )
        return None if part is None else bytes(part)

    async def _file_chunks(self, file_id: str) -> AsyncGenerator[bytes, None]:
        try:
            handle = await anyio.open_file(self._path(file_id), "rb")
        except FileNotFoundError:  # deleted meanwhile (the row went first)
            raise FileGoneError(file_id) from None
        async with handle:
            while part := await handle.read(CHUNK):
                yield part

    async def stored_bytes(self, key_id: str) -> int:
        """Bytes of every file `key_id` holds (inputs, outputs and error files)."""
        async with self._sessions() as session:
            total = await session.scalar(
                select(func.coalesce(func.sum(FileRow.size), 0)).where(FileRow.key_id == key_id)
            )
        return int(total or 0)

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

    async def list_files(
        self, key_id: str, *, purpose: str | None, limit: int, after: str | None
    ) -> tuple[list[FileRecord], bool]:
        """`key_id`'s files, newest first, after the file `after`; (files, has_more)."""
        query = select(FileRow).where(FileRow.key_id == key_id)
        if purpose:
            query = query.where(FileRow.purpose == purpose)
        async with self._sessions() as session:
            rows, more = await _page(session, FileRow, query, key_id, limit, after)
        return [_file(r) for r in rows], more

    async def delete_file(self, key_id: str, file_id: str) -> bool:
        """Delete `key_id`'s file; False if there is none."""
        async with self._sessions.begin() as session:
            row = await _owned(session, FileRow, key_id, file_id)
            if row is None:
                return False
            await session.delete(row)
        if self._dir is not None:  # the bytes are there unless stored before it was set
            self._path(file_id).unlink(missing_ok=True)
        return True

    # --- batches -----------------------------------------------------------------------------

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
        counts = await self._counts(row.id)
        done = counts.get("succeeded", 0)
        failed = counts.get("failed", 0)
        if row.status in ("cancelled", "expired"):
            failed = row.total - done  # the lines that never ran are in the error file
        return {
            "id": row.id,
            "object": "batch",
            "endpoint": row.endpoint,
            "errors": None if not row.errors else {"object": "list", "data": row.errors},
            "input_file_id": row.input_file_id,
            "completion_window": row.completion_window,
            "status": row.status,
            "output_file_id": row.output_file_id,
            "error_file_id": row.error_file_id,
            "created_at": _ts(row.created_at),
            "in_progress_at": _ts(row.in_progress_at),
            "expires_at": _ts(row.expires_at),
            "finalizing_at": _ts(row.finalizing_at),
            "completed_at": _ts(row.completed_at),
            "failed_at": _ts(row.failed_at),
            "expired_at": _ts(row.expired_at),
            "cancelling_at": _ts(row.cancelling_at),
            "cancelled_at": _ts(row.cancelled_at),
            "request_counts": {"total": row.total, "completed": done, "failed": failed},
            "metadata": row.batch_metadata,
        }

    async def get_batch(self, key_id: str, batch_id: str) -> dict[str, Any] | None:
        """The batch object, if it exists and is `key_id`'s."""
        async with self._sessions() as session:
            row = await _owned(session, BatchRow, key_id, batch_id)
        if row is None:
            return None
        return await self._object(row)

    async def list_batches(
        self, key_id: str, *, limit: int, after: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        """`key_id`'s batches, newest first, after the batch `after`; (objects, has_more)."""
        query = select(BatchRow).where(BatchRow.key_id == key_id)
        async with self._sessions() as session:
            rows, more = await _page(session, BatchRow, query, key_id, limit, after)
        return [await self._object(r) for r in rows], more

    async def cancel(self, key_id: str, batch_id: str) -> dict[str, Any] | None:
        """Stop claiming the batch's lines (`cancelling`); running lines finish."""
        now = as_utc(None)
        async with self._sessions.begin() as session:
            row = await _owned(session, BatchRow, key_id, batch_id)
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
            batch = await _owned(session, BatchRow, key_id, batch_id)
            if batch is None:
                return None
            rows = await session.scalars(
                select(BatchEventRow)
                .where(BatchEventRow.batch_id == batch_id)
                .order_by(BatchEventRow.id)
                .limit(limit)
            )
            return [
                {
                    "at": _ts(r.at),
                    "event": r.event,
                    "line": r.line_no,
                    "custom_id": r.custom_id,
                    "attempt": r.attempt,
                    "status_code": r.status_code,
                    "message": r.message,
                }
                for r in rows
            ]

    # --- the runner's side -------------------------------------------------------------------

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
                row = await self._file_row(
                    batch.key_id, f"{batch_id}_output.jsonl", "batch_output", output
                )
                session.add(row)
                batch.output_file_id = row.id
            if errors:
                row = await self._file_row(
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
            succeeded, text = _result_line(batch_id, line, final)
            (output if succeeded else errors).append(text)
        last = page[-1].line_no
    joined = (b"\n".join(output) + b"\n") if output else b""
    return joined, (b"\n".join(errors) + b"\n") if errors else b""


def _result_line(batch_id: str, line: Any, final: str) -> tuple[bool, bytes]:
    """One result file line for a line row: (in the output file, the line's bytes)."""
    head = {"id": f"batch_req_{batch_id[6:]}_{line.line_no}", "custom_id": line.custom_id}
    answered = line.state == "succeeded" or (
        line.state == "failed" and line.status_code is not None and line.result
    )
    if answered:
        meta = {"status_code": line.status_code, "request_id": line.request_id}
        # The stored answer is JSON the gateway wrote (a relayed answer or an OpenAI error
        # object): raw CR and LF in valid JSON are only whitespace, so a space keeps it one
        # JSONL line without reading the rest of it.
        body = (line.result or b"null").replace(b"\r", b" ").replace(b"\n", b" ")
        text = (
            _open_object(head)
            + b', "response": '
            + _open_object(meta)
            + b', "body": '
            + body
            + b'}, "error": null}'
        )
        return line.state == "succeeded", text
    never_ran = {"cancelled": "batch_cancelled", "expired": "batch_expired"}.get(final)
    code = line.error_code if line.state == "failed" else never_ran
    message = (
        line.error_message
        if line.state == "failed"
        else {"cancelled": "the batch was cancelled", "expired": "the batch expired"}[final]
    )
    item = {**head, "response": None, "error": {"code": code or "error", "message": message or ""}}
    return False, json.dumps(item, ensure_ascii=False).encode()


def _open_object(value: dict[str, Any]) -> bytes:
    """`value` as JSON without its closing brace, for more members to follow."""
    return json.dumps(value, ensure_ascii=False).encode()[:-1]


async def _page(
    session: AsyncSession,
    table: type[_Row],
    query: Select[_Row],
    key_id: str,
    limit: int,
    after: str | None,
) -> tuple[Sequence[_Row], bool]:
    """One page of `query`, newest first, after the row `after`; (rows, has_more).

    Keyset paging on `(created_at, id)`, so rows created meanwhile neither repeat nor go
    missing. An `after` that is not one of `key_id`'s rows is refused rather than read as
    "from the start", which would hand a paging client the first page again (a loop).

    Raises:
        UnknownCursorError: `after` is none of `key_id`'s rows (deleted, never existed, or
            another key's: the same answer for all three).
    """
    if after:
        anchor = await _owned(session, table, key_id, after)
        if anchor is None:
            raise UnknownCursorError(after)
        query = query.where(
            or_(
                table.created_at < anchor.created_at,
                and_(table.created_at == anchor.created_at, table.id < anchor.id),
            )
        )
    query = query.order_by(table.created_at.desc(), table.id.desc()).limit(limit + 1)
    rows = (await session.scalars(query)).all()
    return rows[:limit], len(rows) > limit


async def _owned(
    session: AsyncSession, table: type[_Row], key_id: str, object_id: str
) -> _Row | None:
    """The row `object_id` of `table` if it exists and is `key_id`'s, else None.

    One answer for a malformed id, a missing row and another key's row.
    """
    if not _ID.fullmatch(object_id):
        return None
    row = await session.get(table, object_id)
    return row if row is not None and row.key_id == key_id else None


def _sqlite_part(database: str, file_id: str, offset: int) -> bytes | None:
    """`CHUNK` bytes of a file's blob in the SQLite database `database`, from `offset`.

    Runs in a worker thread, on its own connection, closed before it returns.
    """
    uri = database.startswith("file:")
    with contextlib.closing(sqlite3.connect(database, timeout=30.0, uri=uri)) as db:
        found = db.execute(
            "SELECT rowid, length(content) FROM gateway_files WHERE id = ?", (file_id,)
        ).fetchone()
        if found is None or found[1] is None or offset >= found[1]:
            return None
        with db.blobopen("gateway_files", "content", found[0], readonly=True) as blob:
            blob.seek(offset)
            return blob.read(CHUNK)
