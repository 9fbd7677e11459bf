"""The schema migrations (gateway.db.migrate) on SQLite files and the PostgreSQL server.

Databases made by earlier releases are rebuilt here from their frozen DDL, so that an upgrade is
tested against what is really deployed, not against what today's metadata would create.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from asgi_lifespan import LifespanManager
from sqlalchemy import bindparam, column, text
from sqlalchemy import table as sql_table
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from gateway.app import create_app
from gateway.cli import main
from gateway.db.engine import open_engine
from gateway.db.migrate import (
    DatabaseBehindError,
    DatabaseNewerError,
    DatabaseSchemaError,
    database_state,
    head_revision,
    prepare_database,
    upgrade_database,
)
from gateway.db.migrations import VERSION_TABLE
from gateway.db.tables import Base, UTCDateTime
from gateway.keys import apikey
from gateway.settings import Settings
from tests.support.servers import PG_URL, Database, in_ci

HEAD = "0005"
CREATED = datetime(2020, 1, 1, tzinfo=UTC)

# What `git show ba74001:gateway/keys/schema.py`'s metadata emitted (`CreateTable`), per dialect:
# the key table of the release deployed before migrations. Frozen: never regenerate it.
RELEASE_0_1_TABLE = {
    "sqlite": """
CREATE TABLE gateway_api_keys (
	id VARCHAR(32) NOT NULL,
	name VARCHAR(200) NOT NULL,
	secret_hash VARCHAR(64) NOT NULL,
	models JSON,
	created_at DATETIME NOT NULL,
	expires_at DATETIME,
	revoked_at DATETIME,
	last_used_at DATETIME,
	rpm INTEGER,
	tpm INTEGER,
	max_concurrent INTEGER,
	manage_models BOOLEAN,
	PRIMARY KEY (id)
)
""",
    "postgresql": """
CREATE TABLE gateway_api_keys (
	id VARCHAR(32) NOT NULL,
	name VARCHAR(200) NOT NULL,
	secret_hash VARCHAR(64) NOT NULL,
	models JSON,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE,
	revoked_at TIMESTAMP WITH TIME ZONE,
	last_used_at TIMESTAMP WITH TIME ZONE,
	rpm INTEGER,
	tpm INTEGER,
	max_concurrent INTEGER,
	manage_models BOOLEAN,
	PRIMARY KEY (id)
)
""",
}

# The key table before per-key limits; {timestamp} is the dialect's DateTime(timezone=True).
BEFORE_LIMITS_TABLE = """
CREATE TABLE gateway_api_keys (
    id VARCHAR(32) NOT NULL,
    name VARCHAR(200) NOT NULL,
    secret_hash VARCHAR(64) NOT NULL,
    models JSON,
    created_at {timestamp} NOT NULL,
    expires_at {timestamp},
    revoked_at {timestamp},
    last_used_at {timestamp},
    PRIMARY KEY (id)
)
"""

# ... and with the limits, before the model-management permission.
BEFORE_MANAGE_MODELS_TABLE = """
CREATE TABLE gateway_api_keys (
    id VARCHAR(32) NOT NULL,
    name VARCHAR(200) NOT NULL,
    secret_hash VARCHAR(64) NOT NULL,
    models JSON,
    created_at {timestamp} NOT NULL,
    expires_at {timestamp},
    revoked_at {timestamp},
    last_used_at {timestamp},
    rpm INTEGER,
    tpm INTEGER,
    max_concurrent INTEGER,
    PRIMARY KEY (id)
)
"""


def _dialect(database: Database) -> str:
    return make_url(database.url).get_backend_name()


def _timestamp(database: Database) -> str:
    return "DATETIME" if _dialect(database) == "sqlite" else "TIMESTAMP WITH TIME ZONE"


@pytest.fixture
async def engine(database: Database) -> AsyncIterator[AsyncEngine]:
    engine = open_engine(database.url, **database.options)
    try:
        yield engine
    finally:
        await engine.dispose()


def _differences(conn: Connection) -> list[Any]:
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return list(compare_metadata(context, Base.metadata))


async def _schema_differences(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        return await conn.run_sync(_differences)


async def _old_key(database: Database, table: str, **columns: Any) -> tuple[str, str]:
    """Create `table` (old DDL) holding one key made as that release made it; (id, full key)."""
    key_id, secret, full_key = apikey.generate_key()
    values: dict[str, Any] = {"id": key_id, "name": "old", "created_at": CREATED, **columns}
    values["secret_hash"] = apikey.hash_secret(secret)
    typed = [column(name, UTCDateTime() if name == "created_at" else None) for name in values]
    insert = sql_table("gateway_api_keys", *typed).insert().values(values)
    await database.execute(text(table), insert)
    return key_id, full_key


def _stamp_statement(revision: str) -> Any:
    return sql_table(VERSION_TABLE, column("version_num")).update().values(version_num=revision)


async def _stamp(database: Database, revision: str) -> None:
    await database.execute(_stamp_statement(revision))


# --- upgrades -----------------------------------------------------------------------------------


def test_the_head_is_the_newest_revision() -> None:
    assert head_revision() == HEAD


@pytest.mark.anyio
async def test_a_fresh_database_is_upgraded_to_the_tables_metadata(engine: AsyncEngine) -> None:
    before = await database_state(engine)
    assert (before.current, before.head, before.status) == (None, HEAD, "behind")
    assert not before.unstamped_keys

    assert await upgrade_database(engine) == before

    after = await database_state(engine)
    assert (after.current, after.status) == (HEAD, "current")
    assert await _schema_differences(engine) == []
    # The comparison can fail: a missing index is a difference.
    async with engine.begin() as conn:
        await conn.execute(text("DROP INDEX ix_gateway_usage_day"))
    assert [diff[0] for diff in await _schema_differences(engine)] == ["add_index"]


@pytest.mark.anyio
async def test_upgrading_a_current_database_changes_nothing(engine: AsyncEngine) -> None:
    await upgrade_database(engine)
    again = await upgrade_database(engine)
    assert (again.current, again.status) == (HEAD, "current")
    assert await _schema_differences(engine) == []


@pytest.mark.anyio
async def test_a_release_0_1_database_is_upgraded_in_place_with_its_keys(
    database: Database, engine: AsyncEngine
) -> None:
    key_id, old_key = await _old_key(
        database, RELEASE_0_1_TABLE[_dialect(database)], rpm=60, manage_models=True
    )
    before = await database_state(engine)
    assert (before.current, before.status, before.unstamped_keys) == (None, "behind", True)

    store = database.open()
    try:
        assert await store.create_schema() == before
        record = await store.authenticate(old_key)
        assert (record.id, record.name, record.created_at) == (key_id, "old", CREATED)
        assert (record.rpm, record.tpm, record.manage_models) == (60, None, True)
        new, new_key = await store.create_key("new")
        assert await store.authenticate(new_key) == new
    finally:
        await store.close()
    assert (await database_state(engine)).status == "current"
    assert await _schema_differences(engine) == []
    rotation = "SELECT previous_secret_hash, previous_secret_expires_at FROM gateway_api_keys"
    async with engine.connect() as conn:
        assert (await conn.execute(text(rotation + " WHERE id = :id"), {"id": key_id})).one() == (
            None,
            None,
        )


@pytest.mark.anyio
async def test_a_table_from_before_the_limits_is_completed_and_upgraded(
    database: Database, engine: AsyncEngine
) -> None:
    key_id, old_key = await _old_key(
        database, BEFORE_LIMITS_TABLE.format(timestamp=_timestamp(database))
    )
    stores = [database.open() for _ in range(3)]
    try:
        await asyncio.gather(*(store.create_schema() for store in stores))

        old = await stores[0].authenticate(old_key)
        assert (old.id, old.name, old.created_at) == (key_id, "old", CREATED)
        assert (old.rpm, old.tpm, old.max_concurrent, old.manage_models) == (None,) * 3 + (False,)
        updated = await stores[1].update_limits(key_id, rpm=30, tpm=0, max_concurrent=1)
        assert (updated.rpm, updated.tpm, updated.max_concurrent) == (30, 0, 1)
        new, new_key = await stores[2].create_key("new", max_concurrent=3)
        assert await stores[0].authenticate(new_key) == new
        assert await stores[0].list_keys() == [updated, new]
    finally:
        for store in stores:
            await store.close()
    assert await _schema_differences(engine) == []


@pytest.mark.anyio
async def test_a_table_from_before_manage_models_gets_it_as_null(
    database: Database, engine: AsyncEngine
) -> None:
    key_id, old_key = await _old_key(
        database, BEFORE_MANAGE_MODELS_TABLE.format(timestamp=_timestamp(database)), rpm=60
    )
    store = database.open()
    try:
        await store.create_schema()
        old = await store.authenticate(old_key)
        assert (old.id, old.rpm, old.manage_models) == (key_id, 60, False)
        # The added column is NULL for the existing key, and NULL reads as False.
        assert await database.scalar(text("SELECT manage_models FROM gateway_api_keys")) is None
        granted = await store.update_limits(key_id, manage_models=True)
        assert (await store.authenticate(old_key)) == granted
    finally:
        await store.close()
    assert await _schema_differences(engine) == []


@pytest.mark.anyio
async def test_a_key_table_lacking_a_not_null_column_is_refused_untouched(
    database: Database, engine: AsyncEngine
) -> None:
    await database.execute(text("CREATE TABLE gateway_api_keys (id VARCHAR(32) PRIMARY KEY)"))
    with pytest.raises(
        DatabaseSchemaError, match=r"lacks NOT NULL column\(s\) name, secret_hash, created_at"
    ):
        await upgrade_database(engine)
    state = await database_state(engine)
    assert (state.current, state.unstamped_keys) == (None, True)  # rolled back: not stamped


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_database_at_an_unknown_revision_is_refused_untouched(
    database: Database, engine: AsyncEngine
) -> None:
    await upgrade_database(engine)
    await _stamp(database, "0099")

    state = await database_state(engine)
    assert (state.current, state.head, state.status) == ("0099", HEAD, "newer")
    for auto_upgrade in (True, False):
        with pytest.raises(DatabaseNewerError, match=r"revision 0099.*newest is 0005") as caught:
            await prepare_database(engine, auto_upgrade=auto_upgrade)
        assert (caught.value.current, caught.value.head) == ("0099", HEAD)
    assert (await database_state(engine)).current == "0099"


@pytest.mark.anyio
async def test_auto_upgrade_off_refuses_a_database_that_is_behind(
    database: Database, engine: AsyncEngine
) -> None:
    await _old_key(database, RELEASE_0_1_TABLE[_dialect(database)])
    store = database.open()
    try:
        with pytest.raises(DatabaseBehindError, match="run `gateway db upgrade`"):
            await store.create_schema(auto_upgrade=False)
        assert (await database_state(engine)).unstamped_keys  # left as it was
        await upgrade_database(engine)
        assert (await store.create_schema(auto_upgrade=False)).status == "current"
    finally:
        await store.close()


@pytest.mark.anyio
async def test_the_audit_trail_is_append_only_in_the_database(
    database: Database, engine: AsyncEngine
) -> None:
    await upgrade_database(engine)
    insert = text(
        "INSERT INTO gateway_audit (at, actor, action) VALUES (:at, 'cli:alice', 'create')"
    ).bindparams(bindparam("at", type_=UTCDateTime()), at=CREATED)
    await database.execute(insert)
    for statement in ("UPDATE gateway_audit SET actor = 'mallory'", "DELETE FROM gateway_audit"):
        with pytest.raises(DBAPIError, match="gateway_audit is append-only"):
            await database.execute(text(statement))
    if _dialect(database) == "postgresql":
        with pytest.raises(DBAPIError, match="gateway_audit is append-only"):
            await database.execute(text("TRUNCATE gateway_audit"))
    assert await database.scalar(text("SELECT actor FROM gateway_audit")) == "cli:alice"


# --- concurrency --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_upgrades_upgrade_once(database: Database) -> None:
    await _old_key(database, BEFORE_LIMITS_TABLE.format(timestamp=_timestamp(database)))
    engines = [open_engine(database.url, **database.options) for _ in range(4)]
    try:
        found = await asyncio.gather(*(upgrade_database(engine) for engine in engines))
        # Under the lock, exactly one found the table unstamped; the others found it current.
        assert sorted(state.status for state in found) == [
            "behind",
            "current",
            "current",
            "current",
        ]
        assert await _schema_differences(engines[0]) == []
    finally:
        for engine in engines:
            await engine.dispose()


@pytest.mark.processes
def test_two_processes_upgrade_one_sqlite_file_once(tmp_path: Path) -> None:
    env = {**os.environ, "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"}
    command = [sys.executable, "-m", "gateway", "db", "upgrade"]
    processes = [
        subprocess.Popen(  # noqa: S603 (our own interpreter and module)
            command,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=90) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    lines = sorted(out.strip().split(": ", 1)[1] for out, _ in outputs)
    assert lines == [f"already at revision {HEAD}", f"upgraded from none to {HEAD}"]


# --- the app and the commands -------------------------------------------------------------------


async def _create_database(admin_url: str, name: str) -> None:
    admin = create_async_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        await admin.dispose()


async def _drop_database(admin_url: str, name: str) -> None:
    admin = create_async_engine(admin_url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A database URL in GATEWAY_DATABASE_URL: a SQLite file, or a PostgreSQL database of its own
    (a URL cannot carry the per-test schema), reached with a password the output must mask."""
    monkeypatch.chdir(tmp_path)  # keep a developer's .env out of Settings
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
        monkeypatch.setenv("GATEWAY_DATABASE_URL", url)
        yield url
        return
    name = f"gw_test_{secrets.token_hex(6)}"
    try:
        asyncio.run(_create_database(PG_URL, name))
    except (OSError, SQLAlchemyError) as exc:
        message = f"PostgreSQL at {PG_URL} is not reachable: {exc!r}"
        if in_ci():
            pytest.fail(f"{message} (CI is set, so this is a failure, not a skip)")
        pytest.skip(message)
    # Trust authentication ignores the password; it is here to be masked.
    masked = make_url(PG_URL).set(password="not-to-be-shown", database=name)
    rendered = masked.render_as_string(hide_password=False)
    monkeypatch.setenv("GATEWAY_DATABASE_URL", rendered)
    try:
        yield rendered
    finally:
        asyncio.run(_drop_database(PG_URL, name))


async def _upgrade_and_stamp(url: str, revision: str) -> None:
    engine = open_engine(url, poolclass=NullPool)
    try:
        await upgrade_database(engine)
        async with engine.begin() as conn:
            await conn.execute(_stamp_statement(revision))
    finally:
        await engine.dispose()


async def _start_app(url: str, **settings: Any) -> None:
    app = create_app(Settings(database_url=url, **settings))
    async with LifespanManager(app):
        pass


def test_db_commands_upgrade_and_report_with_the_password_masked(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "current"]) == 1
    out, err = capsys.readouterr()
    assert "no revision (empty), head 0005: behind" in out
    assert "gateway db upgrade" in err

    assert main(["db", "upgrade"]) == 0
    assert f"upgraded from none to {HEAD}" in capsys.readouterr().out
    assert main(["db", "upgrade"]) == 0
    assert f"already at revision {HEAD}" in capsys.readouterr().out
    assert main(["db", "current"]) == 0
    out, err = capsys.readouterr()
    assert f"revision {HEAD}, head {HEAD}: current" in out
    assert "not-to-be-shown" not in out + err
    if "postgresql" in database_url:
        assert ":***@" in out


def test_a_newer_database_is_refused_by_the_commands_and_the_app(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_upgrade_and_stamp(database_url, "0099"))

    assert main(["db", "current"]) == 1
    out, err = capsys.readouterr()
    assert "revision 0099, head 0005: newer" in out
    assert "newer gateway" in err
    assert main(["db", "upgrade"]) == 1
    assert main(["keys", "list"]) == 1
    err = capsys.readouterr().err
    assert "revision 0099" in err
    assert "newest is 0005" in err
    assert "not-to-be-shown" not in err
    with pytest.raises(DatabaseNewerError, match="revision 0099"):
        asyncio.run(_start_app(database_url))


def test_auto_upgrade_off_commands_and_app_refuse_a_behind_database(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GATEWAY_DATABASE_AUTO_UPGRADE", "false")

    assert main(["keys", "list"]) == 1
    assert "run `gateway db upgrade`" in capsys.readouterr().err
    with pytest.raises(DatabaseBehindError, match="run `gateway db upgrade`"):
        asyncio.run(_start_app(database_url, database_auto_upgrade=False))

    assert main(["db", "upgrade"]) == 0
    assert main(["keys", "list"]) == 0
    assert "No API keys yet" in capsys.readouterr().out
    asyncio.run(_start_app(database_url, database_auto_upgrade=False))


@pytest.mark.processes
def test_gateway_serve_refuses_a_newer_database(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"
    asyncio.run(_upgrade_and_stamp(url, "0099"))
    env = {**os.environ, "GATEWAY_DATABASE_URL": url}
    served = subprocess.run(
        [sys.executable, "-m", "gateway", "serve"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert served.returncode == 1
    assert "revision 0099" in served.stderr
    assert "newest is 0005" in served.stderr
    # One clear line, not uvicorn's start-up traceback around it.
    assert "Traceback" not in served.stderr
