"""Fixtures shared by the whole test suite (the helpers they hand out live in `tests/support/`)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from gateway.app import create_app
from gateway.keys.store import KeyStore
from gateway.serve.coalesce import CoalescingHttpToolsProtocol
from gateway.settings import Settings
from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from gateway.testing.stack import ManagedProcess, create_key, gateway_process
from tests.support.oidc import OidcProvider, start_oidc_provider
from tests.support.servers import PG_URL, REDIS_URL, Database, in_ci, postgres_database
from tests.support.stack import Emulator, Gateway, store_key

#: The markers of slow classes (pyproject.toml describes each); a test of any is `slow` too.
SLOW_CLASSES = ("e2e", "soak", "crash", "processes", "prometheus", "clients", "tools", "browser")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, so `-m "not slow"` sees the mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` every test of a slow class: `./scripts/test --fast` runs `-m "not slow"`."""
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_CLASSES):
            item.add_marker(pytest.mark.slow)


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
        if in_ci():
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
        if in_ci():
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


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """An Ollama emulator on a loopback port, fresh for each test."""
    app = create_emulator_app(EmulatorConfig())
    with LoopbackServer(app) as server:
        yield Emulator(server.url, app.state.emulator)


@pytest.fixture
def make_gateway(tmp_path: Path, emulator: Emulator) -> Iterator[Callable[..., Gateway]]:
    """Start gateways in front of the emulator; keyword arguments override settings.

    Each runs under the protocol `gateway serve` uses (`CoalescingHttpToolsProtocol`), so a
    stream takes the push path (`gateway.relay.push`) as in production.

    `span_exporter` (an SDK `SpanExporter`) turns tracing on and receives the spans; `port`
    (from `free_port`) fixes the gateway's port, for settings that name its own URL.
    """
    servers: list[LoopbackServer] = []

    def make(*, span_exporter: Any = None, port: int = 0, **overrides: Any) -> Gateway:
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
        key_id, key = asyncio.run(store_key(database_url, "test-key"))
        # The protocol `gateway serve` runs (the door, one write per head, the push path's
        # writer), so that every relay test covers what production serves.
        app = create_app(settings, span_exporter=span_exporter)
        server = LoopbackServer(app, port=port, http=CoalescingHttpToolsProtocol)
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


# --- the test OpenID provider (single sign-on on the admin page) -----------------------------


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """oidc-provider-mock on a loopback port, with `tests.support.oidc.USERS`, for the session.

    Skips (fails under CI) without `.venv/oidc` (scripts/oidc-mock). Mark the tests that use
    it `processes`: it is a process of its own.
    """
    with start_oidc_provider(tmp_path_factory.mktemp("oidc") / "provider.log") as provider:
        yield provider


# --- the key store on both backends ----------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    if request.param == "sqlite":
        yield Database(f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}")
    else:
        async for database in postgres_database():
            yield database


@pytest.fixture
async def store(database: Database) -> AsyncIterator[KeyStore]:
    key_store = database.open()
    try:
        await key_store.create_schema()
        yield key_store
    finally:
        await key_store.close()


# --- `gateway serve` processes ------------------------------------------------------------


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[str, str], tuple[str, str, str]]]:
    """Start `gateway serve` (its own process, as deployed) in front of one upstream.

    `start(url, dialect)` returns its URL, an attacker's key and a victim's key (the stall tests
    of tests/relay/test_answer_bounds.py and tests/wire/test_body_stalls.py).
    """
    started: list[ManagedProcess] = []

    def start(url: str, dialect: str) -> tuple[str, str, str]:
        env = {
            "GATEWAY_UPSTREAM_URL": url,
            "GATEWAY_UPSTREAM_DIALECT": dialect,
            "GATEWAY_FIRST_BYTE_TIMEOUT": "60",
            "GATEWAY_IDLE_TIMEOUT": "60",
        }
        process = gateway_process(tmp_path, env)
        process.__enter__()
        started.append(process)
        attacker = str(create_key(process.extra_env, "attacker")["key"])
        victim = str(create_key(process.extra_env, "victim")["key"])
        return process.url, attacker, victim

    yield start
    for process in started:
        process.stop()
