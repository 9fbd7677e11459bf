# ruff: noqa: T201 (a command-line interface prints by design)
"""The `gateway audit` command: read the audit trail of admin actions from a shell.

The same entries `GET /admin/v1/audit` serves (`gateway.keys.audit`), oldest first, with the
same filters. Changes show each field's value before and after, never a secret.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from gateway.keys.audit import ACTIONS, MAX_PAGE, AuditEntry
from gateway.keys.cli import run_store_action
from gateway.keys.store import KeyStore
from gateway.settings import Settings


def _moment(text: str) -> datetime:
    """Parse an ISO 8601 time or date (an argparse `type`); without a zone it is UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use ISO 8601, for example 2026-12-01 or 2026-12-01T09:30Z"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _page(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"invalid limit {text!r}: use 1 to {MAX_PAGE}")
    return int(text)


def _describe(entry: AuditEntry) -> str:
    changes = ", ".join(
        f"{field}: {json.dumps(change['before'])} -> {json.dumps(change['after'])}"
        for field, change in (entry.changes or {}).items()
    )
    where = f" from {entry.source}" if entry.source else ""
    line = f"{entry.at:%Y-%m-%d %H:%M:%SZ}  #{entry.id}  {entry.actor}{where}  {entry.action}"
    line += f" {entry.key_id}" if entry.key_id else ""
    # The actor and values may hold anything a token or an admin sent: escape control chars.
    text = f"{line}  {changes}" if changes else line
    return text.encode("unicode_escape").decode("ascii")


def _audit(args: argparse.Namespace, settings: Settings) -> int:
    async def action(store: KeyStore) -> int:
        entries = await store.list_audit(
            key_id=args.key,
            actor=args.actor,
            actions=args.action,
            since=args.since,
            until=args.until,
            limit=args.limit,
        )
        if args.json:
            print(json.dumps([entry.as_json() for entry in entries]))
        elif not entries:
            print("No audit entries match.")
        for entry in [] if args.json else entries:
            print(_describe(entry))
        return 0

    return run_store_action(settings, action, prog="gateway audit")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `audit` command (its leaf parser sets `handler`, a `CommandHandler`)."""
    audit = subparsers.add_parser(
        "audit", help="list admin actions on keys: who, what, when, from where"
    )
    audit.add_argument("--key", metavar="ID", help="only actions on this key")
    audit.add_argument("--actor", help="only actions by this actor (cli:USER or a token subject)")
    audit.add_argument(
        "--action", action="append", choices=ACTIONS, help="only this action (repeatable)"
    )
    audit.add_argument("--since", type=_moment, help="only at or after this time (UTC if no zone)")
    audit.add_argument("--until", type=_moment, help="only before this time (UTC if no zone)")
    audit.add_argument(
        "--limit", type=_page, default=100, help=f"at most this many, 1 to {MAX_PAGE} (100)"
    )
    audit.add_argument("--json", action="store_true", help="print one JSON array")
    audit.set_defaults(handler=_audit)
