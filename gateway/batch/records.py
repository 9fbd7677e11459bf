"""Public ids and the lookups every Batch API table shares.

Owns: minting an id (`new_id`) and its shape, the owner-scoped lookup (`owned`: one answer for a
malformed id, a missing row and another key's row), keyset paging (`page`), and the batch
statuses the queue and the batches both read.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import TypeVar

from sqlalchemy import Select, and_, or_
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.db.tables import BatchRow, FileRow

_Row = TypeVar("_Row", FileRow, BatchRow)

#: Statuses in which a batch's lines may still be claimed.
RUNNING = ("in_progress",)
#: Statuses a batch ends in.
ENDED = ("completed", "failed", "expired", "cancelled")


def new_id(prefix: str) -> str:
    """A random public id such as `file-3f9c...` (96 bits)."""
    return f"{prefix}{secrets.token_hex(12)}"


#: The shape of every id `new_id` makes: anything else names nothing, and is not looked up
#: (PostgreSQL refuses a NUL in a text parameter with an error, not a miss).
_ID = re.compile(r"(?:file-|batch_)[0-9a-f]{24}")


class UnknownCursorError(LookupError):
    """A list's `after` names no object of the key (deleted, never existed, another key's)."""


async def page(
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
        anchor = await owned(session, table, key_id, after)
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


async def owned(
    session: AsyncSession, table: type[_Row], key_id: str, object_id: str
) -> _Row | None:
    """The row `object_id` of `table` if it exists and is `key_id`'s, else None.

    One answer for a malformed id, a missing row and another key's row.
    """
    if not _ID.fullmatch(object_id):
        return None
    row = await session.get(table, object_id)
    return row if row is not None and row.key_id == key_id else None
