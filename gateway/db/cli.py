# ruff: noqa: T201 (a command-line interface prints by design)
"""The `gateway db` commands: `upgrade` the schema to this code's head, show the `current` one.

Both open `Settings.database_url` (its password masked in every message) and close it again.
`upgrade` works whatever `GATEWAY_DATABASE_AUTO_UPGRADE` says: it is how an operator upgrades
when start-up does not. Errors go to stderr with exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db.engine import masked_url, open_engine
from gateway.db.migrate import DatabaseSchemaError, database_state, upgrade_database
from gateway.settings import Settings


def _run(settings: Settings, action: Callable[[AsyncEngine, str], Awaitable[int]]) -> int:
    """Run one action on a fresh engine; map expected failures to exit code 1."""
    url = masked_url(settings.database_url)

    async def with_engine() -> int:
        engine = open_engine(settings.database_url)
        try:
            return await action(engine, url)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(with_engine())
    except DatabaseSchemaError as exc:
        print(f"gateway db: {url}: {exc}", file=sys.stderr)
    except (SQLAlchemyError, OSError) as exc:
        print(f"gateway db: database {url} failed: {exc}", file=sys.stderr)
    return 1


def _upgrade(args: argparse.Namespace, settings: Settings) -> int:  # noqa: ARG001 (handler)
    async def action(engine: AsyncEngine, url: str) -> int:
        before = await upgrade_database(engine)
        if before.status == "current":
            print(f"{url}: already at revision {before.head}")
        else:
            origin = before.current or (
                "none (key table from before migrations)" if before.unstamped_keys else "none"
            )
            print(f"{url}: upgraded from {origin} to {before.head}")
        return 0

    return _run(settings, action)


def _current(args: argparse.Namespace, settings: Settings) -> int:  # noqa: ARG001 (handler)
    async def action(engine: AsyncEngine, url: str) -> int:
        state = await database_state(engine)
        print(f"{url}: {state.describe()}")
        if state.status == "behind":
            print("Back the database up, then run `gateway db upgrade`.", file=sys.stderr)
        elif state.status == "newer":
            print(
                "A newer gateway has upgraded this database: run that version, or restore "
                "the backup taken before the upgrade.",
                file=sys.stderr,
            )
        return 0 if state.status == "current" else 1

    return _run(settings, action)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `db` command and its `upgrade` and `current` subcommands.

    Args:
        subparsers: The top-level `gateway` parser's subparsers. Each leaf parser sets
            `handler`, a `gateway.keys.cli.CommandHandler`.
    """
    db = subparsers.add_parser("db", help="upgrade the database schema, or show its revision")
    commands = db.add_subparsers(title="commands", metavar="COMMAND", required=True)
    upgrade = commands.add_parser(
        "upgrade", help="upgrade the schema to this gateway's newest revision (back up first)"
    )
    upgrade.set_defaults(handler=_upgrade)
    current = commands.add_parser(
        "current",
        help="print the database's revision and this gateway's; exit 1 unless they match",
    )
    current.set_defaults(handler=_current)
