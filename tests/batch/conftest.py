"""Fixtures of the batch tests: a database with the gateway's tables (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.db.tables import Base
from tests.support.servers import Database


@pytest.fixture
async def engine(database: Database) -> AsyncIterator[AsyncEngine]:
    """An engine on `database` (each backend in turn) with every table created."""
    engine = create_async_engine(database.url, **database.options)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    try:
        yield engine
    finally:
        await engine.dispose()
