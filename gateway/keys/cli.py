# ruff: noqa: T201 (a command-line interface prints by design)
"""The `gateway keys` commands: create, list, update, revoke and rotate API keys from a shell.

`gateway keys usage` (what keys used) lives in `gateway.keys.usage_cli` and runs through
`run_store_action`.

Each command opens the key store at `Settings.database_url`, brings its schema up to date
(`gateway.db.migrate`; refused when it is newer, or behind with auto upgrade off), does one
thing and closes the store. A new key is printed once, to stdout, and nowhere else; listings
never show secrets (the store has none to show). Errors go to stderr with exit code 1.

Over ~300 lines for one reason: the five `gateway keys` commands (`_create`, `_list`,
`_update`, `_revoke`, `_rotate`) and their argparse definitions (`add_parser`, about 120 lines
of options) sit together, so each option is next to the handler that reads it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from gateway.db.engine import masked_url
from gateway.db.migrate import DatabaseSchemaError
from gateway.keys import usage_cli
from gateway.keys.audit import Actor
from gateway.keys.store import InvalidKeyError, KeyNotFoundError, KeyRecord, KeyStore
from gateway.keys.validation import (
    parse_duration,
    parse_grace,
    parse_limit,
    parse_limit_or_default,
    parse_models,
    parse_name,
)
from gateway.settings import Settings

CommandHandler = Callable[[argparse.Namespace, Settings], int]
"""What each subcommand stores as `handler`: takes the parsed arguments, returns an exit code."""

_NOT_SHOWN_AGAIN = "Store this key now: it will not be shown again."
_LIMITS = ("rpm", "tpm", "max_concurrent")
"""The per-key limits, as named by `KeyRecord`, `KeyStore` and the `--json` output."""
_LIMIT_FLAGS = (
    ("--rpm", "requests per minute"),
    ("--tpm", "tokens per minute, prompt plus output"),
    ("--max-concurrent", "requests in flight at once"),
)


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _limit(value: int | None) -> str:
    if value is None:
        return "default"
    return "unlimited" if value == 0 else str(value)


def _models(record: KeyRecord) -> str:
    return "all" if record.models is None else ", ".join(record.models)


def _expiry(record: KeyRecord) -> str:
    return "never" if record.expires_at is None else _when(record.expires_at)


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _limits(record: KeyRecord) -> str:
    return ", ".join(
        f"{field.replace('_', ' ')} {_limit(getattr(record, field))}" for field in _LIMITS
    )


def _record_json(record: KeyRecord, now: datetime) -> dict[str, Any]:
    def iso(moment: datetime | None) -> str | None:
        return None if moment is None else moment.isoformat()

    return {
        "id": record.id,
        "name": record.name,
        "models": None if record.models is None else list(record.models),
        "created_at": iso(record.created_at),
        "expires_at": iso(record.expires_at),
        "revoked_at": iso(record.revoked_at),
        "last_used_at": iso(record.last_used_at),
        "status": record.status(now),
        "rpm": record.rpm,
        "tpm": record.tpm,
        "max_concurrent": record.max_concurrent,
        "manage_models": record.manage_models,
        "rotation_grace_until": iso(record.rotation_grace_until),
    }


def _print_table(records: list[KeyRecord], now: datetime) -> None:
    header = (
        *("ID", "NAME", "MODELS", "RPM", "TPM", "CONCURRENT", "MANAGE MODELS"),
        *("CREATED", "EXPIRES", "LAST USED", "STATUS"),
    )
    rows = [
        (
            record.id,
            record.name,
            "all" if record.models is None else ",".join(record.models),
            _limit(record.rpm),
            _limit(record.tpm),
            _limit(record.max_concurrent),
            _yes_no(record.manage_models),
            _when(record.created_at),
            "never" if record.expires_at is None else _when(record.expires_at),
            "never" if record.last_used_at is None else _when(record.last_used_at),
            record.status(now),
        )
        for record in records
    ]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def run_store_action(
    settings: Settings, action: Callable[[KeyStore], Awaitable[int]], *, prog: str = "gateway keys"
) -> int:
    """Run one store action on a fresh store and map expected failures to exit code 1.

    Args:
        settings: Where the store is (`database_url`).
        action: The command's work; returns its exit code.
        prog: The command's name, prefixed to error messages.

    Returns:
        The action's exit code, or 1 after printing why the store failed.
    """

    async def with_store() -> int:
        store = KeyStore.from_url(settings.database_url)
        try:
            await store.create_schema(auto_upgrade=settings.database_auto_upgrade)
            return await action(store)
        finally:
            await store.close()

    try:
        return asyncio.run(with_store())
    except KeyNotFoundError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
    except DatabaseSchemaError as exc:
        # The URL may carry a password; show it masked.
        print(f"{prog}: {masked_url(settings.database_url)}: {exc}", file=sys.stderr)
    except (SQLAlchemyError, OSError) as exc:
        url = masked_url(settings.database_url)
        print(f"{prog}: key store {url} failed: {exc}", file=sys.stderr)
    return 1


def _print_new_key(record: KeyRecord, key: str, *, as_json: bool, verb: str) -> None:
    now = datetime.now(UTC)
    if as_json:
        print(json.dumps({**_record_json(record, now), "key": key}))
        return
    print(
        f"{verb} key {record.id} ({record.name}); models: {_models(record)}; "
        f"expires: {_expiry(record)}"
    )
    print(f"Limits: {_limits(record)}; manage models: {_yes_no(record.manage_models)}")
    print(key)
    print(_NOT_SHOWN_AGAIN)


def _create(args: argparse.Namespace, settings: Settings) -> int:
    expires_at = None if args.expires_in is None else datetime.now(UTC) + args.expires_in

    async def action(store: KeyStore) -> int:
        record, key = await store.create_key(
            args.name,
            models=args.models,
            expires_at=expires_at,
            rpm=args.rpm,
            tpm=args.tpm,
            max_concurrent=args.max_concurrent,
            manage_models=args.manage_models,
            actor=Actor.cli(),
        )
        _print_new_key(record, key, as_json=args.json, verb="Created")
        return 0

    return run_store_action(settings, action)


def _list(args: argparse.Namespace, settings: Settings) -> int:
    async def action(store: KeyStore) -> int:
        records = await store.list_keys()
        now = datetime.now(UTC)
        if args.json:
            print(json.dumps([_record_json(record, now) for record in records]))
        elif records:
            _print_table(records, now)
        else:
            print("No API keys yet; create one with `gateway keys create --name NAME`.")
        return 0

    return run_store_action(settings, action)


def _update(args: argparse.Namespace, settings: Settings) -> int:
    # The update flags default to argparse.SUPPRESS: absent means "leave as is" (for a limit,
    # None means "default").
    fields = ("name", "models", *_LIMITS, "manage_models")
    changes = {field: getattr(args, field) for field in fields if hasattr(args, field)}
    if hasattr(args, "expires_in"):
        changes["expires_at"] = (
            None if args.expires_in is None else datetime.now(UTC) + args.expires_in
        )
    if not changes:
        parser: argparse.ArgumentParser = args.parser
        parser.error(
            "give at least one of --name, --models/--all-models, --expires-in/--no-expiry, "
            "--rpm, --tpm, --max-concurrent and --[no-]manage-models"
        )

    async def action(store: KeyStore) -> int:
        record = await store.update(args.key_id, **changes, actor=Actor.cli())
        if args.json:
            print(json.dumps(_record_json(record, datetime.now(UTC))))
        else:
            print(
                f"Updated key {record.id} ({record.name}); models: {_models(record)}; "
                f"expires: {_expiry(record)}; limits: {_limits(record)}; "
                f"manage models: {_yes_no(record.manage_models)}"
            )
        return 0

    return run_store_action(settings, action)


def _revoke(args: argparse.Namespace, settings: Settings) -> int:
    async def action(store: KeyStore) -> int:
        record = await store.revoke(args.key_id, actor=Actor.cli())
        print(f"Revoked key {record.id} ({record.name}) at {_when(record.revoked_at)}.")
        return 0

    return run_store_action(settings, action)


def _rotate(args: argparse.Namespace, settings: Settings) -> int:
    async def action(store: KeyStore) -> int:
        try:
            record, key = await store.rotate(args.key_id, grace=args.grace, actor=Actor.cli())
        except InvalidKeyError:
            print(f"gateway keys: key {args.key_id} is revoked; create a new one", file=sys.stderr)
            return 1
        if record.rotation_grace_until is None:
            verb = "Rotated (old secret revoked)"
        else:
            verb = f"Rotated (old secret works until {_when(record.rotation_grace_until)})"
        _print_new_key(record, key, as_json=args.json, verb=verb)
        return 0

    return run_store_action(settings, action)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `keys` command: `create`, `list`, `update`, `revoke`, `rotate` and `usage`.

    Args:
        subparsers: The top-level `gateway` parser's subparsers. Each leaf parser sets
            `handler`, a `CommandHandler`.
    """
    keys = subparsers.add_parser(
        "keys", help="create, list, update, revoke and rotate API keys; show their usage"
    )
    commands = keys.add_subparsers(title="commands", metavar="COMMAND", required=True)

    create = commands.add_parser("create", help="create a key and print it once")
    create.add_argument("--name", required=True, type=parse_name, help="who the key is for")
    create.add_argument(
        "--models",
        type=parse_models,
        metavar="M1,M2",
        help="comma-separated models the key may use (default: all)",
    )
    create.add_argument(
        "--expires-in",
        type=parse_duration,
        metavar="DURATION",
        help="lifetime such as 90s, 15m, 12h, 30d or 2w (default: never expires)",
    )
    for flag, what in _LIMIT_FLAGS:
        create.add_argument(
            flag,
            type=parse_limit,
            metavar="N",
            help=f"{what}; 0 = unlimited (default: the gateway's default from settings)",
        )
    create.add_argument(
        "--manage-models",
        action="store_true",
        help="let the key use Ollama's model-management endpoints: pull, push, create, copy, "
        "delete, blobs (default: it gets 403 there)",
    )
    create.add_argument("--json", action="store_true", help="print one JSON object")
    create.set_defaults(handler=_create)

    list_ = commands.add_parser("list", help="list keys (never their secrets)")
    list_.add_argument("--json", action="store_true", help="print one JSON array")
    list_.set_defaults(handler=_list)

    update = commands.add_parser(
        "update", help="change a key's name, models, expiry, limits or permission"
    )
    update.add_argument("key_id", metavar="ID", help="the key's id (the 12 hex characters)")
    update.add_argument("--name", type=parse_name, default=argparse.SUPPRESS, help="a new name")
    models = update.add_mutually_exclusive_group()
    models.add_argument(
        "--models",
        type=parse_models,
        default=argparse.SUPPRESS,
        metavar="M1,M2",
        help="the models the key may use from now on",
    )
    models.add_argument(
        "--all-models",
        dest="models",
        action="store_const",
        const=None,
        default=argparse.SUPPRESS,
        help="let the key use every model",
    )
    expiry = update.add_mutually_exclusive_group()
    expiry.add_argument(
        "--expires-in",
        type=parse_duration,
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="expire this long from now (90s, 15m, 12h, 30d, 2w)",
    )
    expiry.add_argument(
        "--no-expiry",
        dest="expires_in",
        action="store_const",
        const=None,
        default=argparse.SUPPRESS,
        help="never expire",
    )
    for flag, what in _LIMIT_FLAGS:
        update.add_argument(
            flag,
            type=parse_limit_or_default,
            default=argparse.SUPPRESS,
            metavar="N|default",
            help=f"{what}; 0 = unlimited, `default` = the gateway's default from settings",
        )
    update.add_argument(
        "--manage-models",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,
        help="grant (or, with --no-manage-models, clear) the use of Ollama's model-management "
        "endpoints",
    )
    update.add_argument("--json", action="store_true", help="print one JSON object")
    update.set_defaults(handler=_update, parser=update)

    revoke = commands.add_parser("revoke", help="revoke a key for good")
    revoke.add_argument("key_id", metavar="ID", help="the key's id (the 12 hex characters)")
    revoke.set_defaults(handler=_revoke)

    rotate = commands.add_parser("rotate", help="give a key a new secret and print it once")
    rotate.add_argument("key_id", metavar="ID", help="the key's id (the 12 hex characters)")
    rotate.add_argument(
        "--grace",
        type=parse_grace,
        default=timedelta(0),
        metavar="DURATION",
        help="keep the old secret working this long (up to 30d), so apps can move to the new "
        "one (default: refused at once)",
    )
    rotate.add_argument("--json", action="store_true", help="print one JSON object")
    rotate.set_defaults(handler=_rotate)

    usage_cli.add_parser(commands, run_store_action)
