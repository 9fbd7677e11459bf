"""Bring the database to the schema this code needs, with the Alembic migrations it ships.

- `database_state(engine)`: the database's revision, this code's head, and how they compare.
- `upgrade_database(engine)`: upgrade to the head; a database made before migrations (key table,
  no revision) is adopted first: its key table is completed to revision `0001` (the missing
  nullable columns added, keys untouched) and stamped `0001`.
- `prepare_database(engine, auto_upgrade=...)`: what start-up and every command that opens the
  store call: upgrade, or (auto upgrade off) refuse a database that is behind.

Errors (all `DatabaseSchemaError`, a `RuntimeError`): `DatabaseNewerError` (the database carries
a revision this code does not know: always refused, never touched), `DatabaseBehindError`
(behind, and auto upgrade is off), and `DatabaseSchemaError` itself when a pre-migration key
table lacks a NOT NULL column (nothing can fill it in for existing rows).

Replicas may start at once: a database found current is used as it is; otherwise the check is
made again, and the upgrade run, in one transaction that holds a lock, so one replica upgrades
and the others then find the database current. PostgreSQL: a
transaction-scoped advisory lock, with transactional DDL (a failed upgrade leaves nothing
behind). SQLite: `BEGIN IMMEDIATE`, which takes the file's write lock first; the others wait
for it (the driver's busy timeout), and are retried a few times if that runs out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from gateway.db.migrations import SCRIPT_LOCATION, VERSION_TABLE
from gateway.db.migrations.baseline import API_KEYS, api_key_columns

__all__ = [
    "BASELINE_REVISION",
    "DatabaseBehindError",
    "DatabaseNewerError",
    "DatabaseSchemaError",
    "DatabaseState",
    "database_state",
    "head_revision",
    "prepare_database",
    "upgrade_database",
]

Status = Literal["behind", "current", "newer"]
T = TypeVar("T")

BASELINE_REVISION = "0001"
"""The revision a database made before migrations is adopted at (`baseline.py`)."""

# PostgreSQL advisory lock that serialises schema changes across processes ("gw_keys"): the one
# the pre-migration `create_schema` took, so an old replica and a new one wait for each other.
_LOCK_ID = 0x67775F6B657973
_SQLITE_ATTEMPTS = 3


class DatabaseSchemaError(RuntimeError):
    """The database's schema cannot be used or brought to what this code needs."""


class DatabaseNewerError(DatabaseSchemaError):
    """The database carries a revision this code does not know (a newer gateway migrated it)."""

    def __init__(self, current: str, head: str) -> None:
        super().__init__(
            f"the database is at revision {current}, which this gateway does not know (its "
            f"newest is {head}): a newer gateway has upgraded it. Run that version, or restore "
            "the backup taken before the upgrade; this gateway will not touch it"
        )
        self.current = current
        self.head = head


class DatabaseBehindError(DatabaseSchemaError):
    """The database is behind this code's head and automatic upgrades are off."""

    def __init__(self, current: str | None, head: str) -> None:
        at = "has no gateway revision yet" if current is None else f"is at revision {current}"
        super().__init__(
            f"the database {at} and this gateway needs {head}; automatic upgrades are off "
            "(GATEWAY_DATABASE_AUTO_UPGRADE=false): back it up, then run `gateway db upgrade`"
        )
        self.current = current
        self.head = head


@dataclass(frozen=True)
class DatabaseState:
    """Where a database stands against this code's migrations.

    Attributes:
        current: The revision stamped in the database; None when it has none (an empty
            database, or one made before migrations: see `unstamped_keys`).
        head: The newest revision this code ships.
        status: `current` (at head), `behind` (an upgrade applies), or `newer` (a revision
            this code does not know).
        unstamped_keys: Whether a key table exists without a revision: made by a release
            before migrations; an upgrade adopts it, keys intact.
    """

    current: str | None
    head: str
    status: Status
    unstamped_keys: bool = False

    def describe(self) -> str:
        """One line for people, e.g. `revision 0001, head 0002: behind`."""
        if self.current is not None:
            at = f"revision {self.current}"
        elif self.unstamped_keys:
            at = "no revision (key table from before migrations)"
        else:
            at = "no revision (empty)"
        return f"{at}, head {self.head}: {self.status}"


def head_revision() -> str:
    """The newest revision this code ships, e.g. `0002`."""
    return _head(_scripts())


async def database_state(engine: AsyncEngine) -> DatabaseState:
    """Read where the database stands, changing nothing.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: if the database cannot be read.
    """
    async with engine.connect() as conn:
        return await conn.run_sync(_state)


async def upgrade_database(engine: AsyncEngine) -> DatabaseState:
    """Upgrade the database to this code's head, adopting a pre-migration key table first.

    Idempotent, and safe while other processes do the same (see the module docstring).

    Returns:
        The state found under the lock, before upgrading: `current` is where it came from
        (`status` is `current` when there was nothing to do); it is now at `head`.

    Raises:
        DatabaseNewerError: if the database is at a revision this code does not know.
        DatabaseSchemaError: if a pre-migration key table lacks a NOT NULL column.
        sqlalchemy.exc.SQLAlchemyError: if the database refuses; nothing is changed on
            PostgreSQL (transactional DDL); SQLite rolls back what it can.
    """
    # The usual case, a current database, takes no lock (on SQLite: no write lock at every
    # start and every `gateway keys` command); whatever else is decided again under the lock.
    state = await database_state(engine)
    if state.status == "current":
        return state
    return await _locked(engine, _upgrade)


async def prepare_database(engine: AsyncEngine, *, auto_upgrade: bool) -> DatabaseState:
    """Make sure the database fits this code before it is used (start-up, CLI commands).

    Args:
        engine: The database.
        auto_upgrade: `Settings.database_auto_upgrade`: upgrade a database that is behind;
            when False, refuse it instead.

    Returns:
        The state before any upgrade.

    Raises:
        DatabaseNewerError: if the database is newer than this code (whatever `auto_upgrade`).
        DatabaseBehindError: if it is behind and `auto_upgrade` is False.
        DatabaseSchemaError: see `upgrade_database`.
    """
    if auto_upgrade:
        return await upgrade_database(engine)
    state = await database_state(engine)
    if state.status == "newer":
        raise DatabaseNewerError(str(state.current), state.head)
    if state.status == "behind":
        raise DatabaseBehindError(state.current, state.head)
    return state


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def _head(scripts: ScriptDirectory) -> str:
    head = scripts.get_current_head()
    if head is None:  # pragma: no cover - the package ships its revisions
        raise DatabaseSchemaError("the gateway's migrations are missing")
    return head


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["connection"] = connection
    return config


def _state(conn: Connection) -> DatabaseState:
    scripts = _scripts()
    head = _head(scripts)
    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    heads = context.get_current_heads()
    known = {script.revision for script in scripts.walk_revisions()}
    if any(revision not in known for revision in heads):
        return DatabaseState(",".join(heads), head, "newer")
    if heads == (head,):
        return DatabaseState(head, head, "current")
    if not heads:
        return DatabaseState(None, head, "behind", unstamped_keys=inspect(conn).has_table(API_KEYS))
    return DatabaseState(",".join(heads), head, "behind")


def _upgrade(conn: Connection) -> DatabaseState:
    state = _state(conn)
    if state.status == "newer":
        raise DatabaseNewerError(str(state.current), state.head)
    if state.status == "current":
        return state
    config = _config(conn)
    if state.unstamped_keys:
        _complete_baseline(conn)
        command.stamp(config, BASELINE_REVISION)
    command.upgrade(config, "head")
    return state


def _complete_baseline(conn: Connection) -> None:
    """Add the nullable `0001` columns a pre-migration key table lacks (NULL in existing rows).

    Raises:
        DatabaseSchemaError: if it lacks a NOT NULL one, which no value can be made up for.
    """
    present = {column["name"] for column in inspect(conn).get_columns(API_KEYS)}
    missing = [column for column in api_key_columns() if column.name not in present]
    required = [column.name for column in missing if not column.nullable]
    if required:
        raise DatabaseSchemaError(
            f"table {API_KEYS} lacks NOT NULL column(s) {', '.join(required)}: it was not made "
            "by the gateway, or was altered; migrate it by hand"
        )
    operations = Operations(MigrationContext.configure(conn))
    for column in missing:
        operations.add_column(API_KEYS, column)


async def _locked(engine: AsyncEngine, work: Callable[[Connection], T]) -> T:
    """Run `work` in one transaction that holds the database's schema lock, then commit."""
    if engine.dialect.name == "postgresql":
        async with engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
            return await conn.run_sync(work)
    if engine.dialect.name != "sqlite":
        async with engine.begin() as conn:
            return await conn.run_sync(work)
    retrying = AsyncRetrying(
        retry=retry_if_exception(_sqlite_locked),
        stop=stop_after_attempt(_SQLITE_ATTEMPTS),
        wait=wait_exponential(multiplier=0.1, max=1.0),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await _sqlite_immediate(engine, work)
    raise AssertionError("unreachable")  # pragma: no cover - reraise=True raises instead


async def _sqlite_immediate(engine: AsyncEngine, work: Callable[[Connection], T]) -> T:
    # The driver's own transaction handling never begins before DDL and begins DEFERRED
    # (no write lock until the first write: two processes could both find the database behind).
    # With the driver in autocommit, this connection says BEGIN IMMEDIATE and COMMIT itself;
    # SQLAlchemy and Alembic see a transaction already begun and join it.
    async with engine.connect() as base:
        conn = await base.execution_options(isolation_level="AUTOCOMMIT")
        await conn.exec_driver_sql("BEGIN IMMEDIATE")
        try:
            result = await conn.run_sync(work)
        except BaseException:
            await conn.exec_driver_sql("ROLLBACK")
            raise
        await conn.exec_driver_sql("COMMIT")
        return result


def _sqlite_locked(error: BaseException) -> bool:
    return isinstance(error, OperationalError) and "database is locked" in str(error)
