"""`open_engine`: the one way the gateway opens its database (SQLite or PostgreSQL, async).

The key store, the migrations' CLI and any other user of the tables share these defaults, so
that each opens the database the same way: a private SQLite file, a wait for its lock, and
connections that survive a PostgreSQL failover.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def open_engine(url: str, **engine_options: Any) -> AsyncEngine:
    """Open an engine on an SQLAlchemy async URL.

    Args:
        url: For example `sqlite+aiosqlite:///./gateway.db` or
            `postgresql+asyncpg://gateway@db/gateway`.
        **engine_options: Extra `create_async_engine` arguments; they replace the defaults
            (PostgreSQL: `pool_pre_ping`, so connections dropped by a failover are replaced;
            SQLite: a 30 s wait for the file lock, as the CLI and the server may write at once).

    Returns:
        A new engine; the caller disposes of it.
    """
    parsed = make_url(url)
    options: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        options["pool_pre_ping"] = True
    elif parsed.get_backend_name() == "sqlite":
        options["connect_args"] = {"timeout": 30.0}
        _create_private(parsed.database)
    options.update(engine_options)
    return create_async_engine(parsed, **options)


def masked_url(url: str) -> str:
    """`url` with its password (if any) shown as `***`, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def _create_private(database: str | None) -> None:
    """Create an SQLite database file readable by its owner only (mode 0600), if it is missing.

    SQLite would create it with the umask's mode (usually 0644: every local user could read the
    key hashes and names). Its journal and WAL files take the database file's mode, so they are
    private too. An existing file is left as it is: its owner chose its mode. A `file:` URI
    database is left to SQLite (and the umask): create it beforehand with the mode you want.
    """
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
