"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from gateway.app import create_app
from gateway.keys.store import KeyStore
from gateway.settings import Settings
from gateway.testing.emulator.app import EmulatorConfig, EmulatorState, create_emulator_app
from gateway.testing.server import LoopbackServer

PG_URL = os.environ.get(
    "GATEWAY_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
"""The PostgreSQL server the `postgres` tests use (a superuser: they make roles and schemas)."""

REDIS_URL = "redis://127.0.0.1:6379/0"
"""The Redis server the multi-worker tests share limits in (each under a key prefix of its own)."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in {"", "0", "false", "no"}


@pytest.fixture
def anyio_backend() -> str:
    """Run `@pytest.mark.anyio` tests on asyncio only (the gateway's event loop)."""
    return "asyncio"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL URL whose role sees only a schema of its own (its default search_path).

    For tests that start `gateway serve` processes, which cannot be handed an engine option: the
    role's own search_path isolates them. Dropped with everything in it afterwards.
    """
    name = f"gw_test_{secrets.token_hex(6)}"

    async def run(*statements: str) -> None:
        admin = create_async_engine(PG_URL, poolclass=NullPool, connect_args={"timeout": 5})
        try:
            async with admin.begin() as conn:
                for statement in statements:
                    await conn.execute(text(statement))
        finally:
            await admin.dispose()

    try:
        asyncio.run(
            run(
                f'CREATE ROLE "{name}" LOGIN',
                f'CREATE SCHEMA "{name}" AUTHORIZATION "{name}"',
                f'ALTER ROLE "{name}" SET search_path = "{name}"',
            )
        )
    except (OSError, SQLAlchemyError) as exc:
        message = f"PostgreSQL at {PG_URL} is not reachable: {exc!r}"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield PG_URL.replace("postgres@", f"{name}@", 1)
    finally:
        asyncio.run(run(f'DROP SCHEMA "{name}" CASCADE', f'DROP ROLE "{name}"'))


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A Redis key prefix of this test's own, its keys deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        message = f"Redis at {REDIS_URL} is not reachable: {exc!r}"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    prefix = f"gwtest-{secrets.token_hex(6)}"
    try:
        yield prefix
    finally:
        for name in client.scan_iter(f"{prefix}*"):
            client.delete(name)
        client.close()


@pytest.fixture(params=[1, 2], ids=["1-worker", "2-workers"])
def serve_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """`GATEWAY_*` variables for `gateway serve` with one worker, then with `--workers 2`."""
    if request.param == 1:
        return {}
    return {
        "GATEWAY_WORKERS": "2",
        "GATEWAY_RATE_LIMIT_STORAGE": REDIS_URL,
        "GATEWAY_RATE_LIMIT_KEY_PREFIX": request.getfixturevalue("redis_prefix"),
    }


# --- gateway + emulator over real loopback sockets ------------------------------------------


@dataclass
class Emulator:
    """A running Ollama emulator: its base URL and its state (config and records)."""

    url: str
    state: EmulatorState

    @property
    def config(self) -> EmulatorConfig:
        return self.state.config


@dataclass
class Gateway:
    """A running gateway: base URL, a valid key, the settings it runs with."""

    url: str
    key: str
    key_id: str
    settings: Settings
    database_url: str

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def metrics_text(self) -> str:
        return httpx.get(f"{self.url}/metrics").text

    def create_key(self, name: str, **kwargs: Any) -> tuple[str, str]:
        """Create another key in the gateway's store; returns (id, full key)."""
        return asyncio.run(_create_key(self.database_url, name, **kwargs))

    def revoke(self, key_id: str) -> None:
        asyncio.run(_revoke(self.database_url, key_id))


async def _create_key(database_url: str, name: str, **kwargs: Any) -> tuple[str, str]:
    store = KeyStore.from_url(database_url)
    try:
        await store.create_schema()
        record, key = await store.create_key(name, **kwargs)
        return record.id, key
    finally:
        await store.close()


async def _revoke(database_url: str, key_id: str) -> None:
    store = KeyStore.from_url(database_url)
    try:
        await store.revoke(key_id)
    finally:
        await store.close()


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """An Ollama emulator on a loopback port, fresh for each test."""
    app = create_emulator_app(EmulatorConfig())
    with LoopbackServer(app) as server:
        yield Emulator(server.url, app.state.emulator)


@pytest.fixture
def make_gateway(tmp_path: Path, emulator: Emulator) -> Iterator[Callable[..., Gateway]]:
    """Start gateways in front of the emulator; keyword arguments override settings.

    `span_exporter` (an SDK `SpanExporter`) turns tracing on and receives the spans.
    """
    servers: list[LoopbackServer] = []

    def make(*, span_exporter: Any = None, **overrides: Any) -> Gateway:
        database_url = f"sqlite+aiosqlite:///{tmp_path}/keys-{len(servers)}.db"
        values: dict[str, Any] = {
            "upstream_url": emulator.url,
            "database_url": database_url,
            "first_byte_timeout": 10.0,
            "idle_timeout": 10.0,
        }
        values.update(overrides)
        database_url = values["database_url"]  # an override (PostgreSQL) holds the key too
        settings = Settings(**values)
        key_id, key = asyncio.run(_create_key(database_url, "test-key"))
        server = LoopbackServer(create_app(settings, span_exporter=span_exporter))
        server.__enter__()
        servers.append(server)
        return Gateway(server.url, key, key_id, settings, database_url)

    yield make
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    """A gateway with default settings in front of the emulator (Ollama dialect)."""
    return make_gateway()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum the samples of `name` in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


# --- the key store on both backends ----------------------------------------------------


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


async def _postgres_database() -> AsyncIterator[Database]:
    schema = f"gw_test_{secrets.token_hex(6)}"
    admin = create_async_engine(PG_URL, poolclass=NullPool, connect_args={"timeout": 5})
    try:
        async with admin.begin() as conn:
            await conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except (OSError, SQLAlchemyError) as exc:
        await admin.dispose()
        message = f"PostgreSQL at {PG_URL} is not reachable: {exc!r}"
        if _in_ci():
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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    if request.param == "sqlite":
        yield Database(f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}")
    else:
        async for database in _postgres_database():
            yield database


@pytest.fixture
async def store(database: Database) -> AsyncIterator[KeyStore]:
    key_store = database.open()
    try:
        await key_store.create_schema()
        yield key_store
    finally:
        await key_store.close()
