"""Uploaded and result files: their bytes (in the database or a storage directory) and metadata.

Owns the `gateway_files` rows and the bytes they name: storing a file (written and fsynced
before its row is committed), reading it back a chunk at a time, listing and deleting it, and
the per-key upload and download slots.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import LargeBinary, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from gateway.batch.records import new_id, owned, page
from gateway.batch.slots import KeySlots
from gateway.db.tables import FileRow, as_utc

#: Bytes of a file read at a time (a download, a batch's checks): what one reader holds.
CHUNK = 1024 * 1024
#: The same on PostgreSQL: a `substr` range of a compressed value decompresses it from its
#: start, so reading a 100 MiB file of JSONL by 1 MiB ranges cost the server 10.5 s, by 4 MiB
#: ranges 3.2 s (reading it whole: 0.3 s, and the whole file in this process).
PG_CHUNK = 4 * CHUNK


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


def _file(row: FileRow) -> FileRecord:
    return FileRecord(row.id, row.key_id, row.filename, row.purpose, row.size, row.created_at)


class FileStore:
    """The Files API's storage on one `AsyncEngine` (the key store's).

    Args:
        engine: The gateway's database.
        storage_dir: Where file contents go; None keeps them in the database.

    Attributes:
        uploads: Held by an upload while its body arrives and is stored (one per key, four
            per process: an upload holds its file once in memory while it is stored).
        downloads: Held by a download while it streams (`CHUNK` bytes in memory each).
    """

    def __init__(self, engine: AsyncEngine, storage_dir: str | None = None) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._dir = Path(storage_dir) if storage_dir else None
        if self._dir is not None:
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        database = engine.url.database if engine.dialect.name == "sqlite" else None
        # A file database that a second connection can open (not `:memory:`).
        self._sqlite_file = database if database and database != ":memory:" else None
        self.uploads = KeySlots("uploads", per_key=1, total=4, wait=10.0)
        self.downloads = KeySlots("downloads", per_key=4, total=32, wait=10.0)

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

    async def new_row(self, key_id: str, filename: str, purpose: str, content: bytes) -> FileRow:
        """A new file's row, for the caller to add to its transaction.

        With a storage directory its bytes are written (and fsynced) there first; in the
        database they travel in the row.
        """
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
        row = await self.new_row(key_id, filename, purpose, content)
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
            row = await owned(session, FileRow, key_id, file_id)
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

    async def list_files(
        self, key_id: str, *, purpose: str | None, limit: int, after: str | None
    ) -> tuple[list[FileRecord], bool]:
        """`key_id`'s files, newest first, after the file `after`; (files, has_more)."""
        query = select(FileRow).where(FileRow.key_id == key_id)
        if purpose:
            query = query.where(FileRow.purpose == purpose)
        async with self._sessions() as session:
            rows, more = await page(session, FileRow, query, key_id, limit, after)
        return [_file(r) for r in rows], more

    async def delete_file(self, key_id: str, file_id: str) -> bool:
        """Delete `key_id`'s file; False if there is none."""
        async with self._sessions.begin() as session:
            row = await owned(session, FileRow, key_id, file_id)
            if row is None:
                return False
            await session.delete(row)
        if self._dir is not None:  # the bytes are there unless stored before it was set
            self._path(file_id).unlink(missing_ok=True)
        return True


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
