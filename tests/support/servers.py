"""The PostgreSQL and Redis servers the tests use, and `Database`: where a key store connects."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from gateway.keys.store import KeyStore

PG_URL = os.environ.get(
    "GATEWAY_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
"""The PostgreSQL server the `postgres` tests use (a superuser: they make roles and schemas)."""

REDIS_URL = "redis://127.0.0.1:6379/0"
"""The Redis server the multi-worker tests share limits in (each under a key prefix of its own)."""


def in_ci() -> bool:
    """True when `CI` is set: a server that is not reachable then fails a test, not skips it."""
    return os.environ.get("CI", "").lower() not in {"", "0", "false", "no"}


@dataclass
class Database:
    """Where a test's stores connect: a URL plus extra engine options."""

    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def open(self) -> KeyStore:
        return KeyStore.from_url(self.url, **self.options)

    async def execute(self, *statements: Any) -> None:
        """Run raw SQL outside any KeyStore, in one transaction."""
        engine = create_async_engine(self.url, poolclass=NullPool, **self.options)
        try:
            async with engine.begin() as conn:
                for statement in statements:
                    await conn.execute(statement)
        finally:
            await engine.dispose()

    async def scalar(self, statement: Any) -> Any:
        """Run one raw SQL query outside any KeyStore and return its first value."""
        engine = create_async_engine(self.url, poolclass=NullPool, **self.options)
        try:
            async with engine.connect() as conn:
                return await conn.scalar(statement)
        finally:
            await engine.dispose()


async def postgres_database() -> AsyncIterator[Database]:
    """A `Database` on a schema of its own in `PG_URL`, dropped afterwards (skips if down)."""
    schema = f"gw_test_{secrets.token_hex(6)}"
    admin = create_async_engine(PG_URL, poolclass=NullPool, connect_args={"timeout": 5})
    try:
        async with admin.begin() as conn:
            await conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except (OSError, SQLAlchemyError) as exc:
        await admin.dispose()
        message = f"PostgreSQL at {PG_URL} is not reachable: {exc!r}"
        if in_ci():
            pytest.fail(f"{message} (CI is set, so this is a failure, not a skip)")
        pytest.skip(f"{message}; start it or set GATEWAY_TEST_POSTGRES_URL")
    try:
        yield Database(
            PG_URL, {"connect_args": {"timeout": 5, "server_settings": {"search_path": schema}}}
        )
    finally:
        async with admin.begin() as conn:
            await conn.execute(text(f'DROP TABLE IF EXISTS "{schema}".gateway_api_keys'))
            await conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        await admin.dispose()
