# ruff: noqa: T201 (a command-line interface prints by design)
"""The `gateway admin` commands: `gateway admin token` mints an HS256 admin token.

The token goes to stdout alone, so `TOKEN=$(gateway admin token --scope read)` works; what it is
for goes to stderr. The token is never logged.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from datetime import UTC, datetime, timedelta

from gateway.auth.jwt import MAX_SUBJECT_CHARS, MAX_TTL, mint_token
from gateway.keys.validation import parse_duration
from gateway.settings import Settings


def _ttl(text: str) -> timedelta:
    """`parse_duration`, capped at `MAX_TTL` (an argparse `type`)."""
    ttl = parse_duration(text)
    if ttl > MAX_TTL:
        raise argparse.ArgumentTypeError(
            f"--ttl {text} is over 24h: an admin token cannot be revoked before it expires, "
            "so its lifetime is what a leaked one costs; mint a new one when it runs out"
        )
    return ttl


def _subject(text: str) -> str:
    if not text.strip() or len(text) > MAX_SUBJECT_CHARS or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"--subject must be 1 to {MAX_SUBJECT_CHARS} printable characters"
        )
    return text


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name, no passwd entry (some containers)
        return "unknown"


def _token(args: argparse.Namespace, settings: Settings) -> int:
    if settings.admin_jwt_secret is None:
        print(
            "gateway: GATEWAY_ADMIN_JWT_SECRET is not set, so there is nothing to sign admin "
            'tokens with; generate one with: python -c "import secrets; '
            'print(secrets.token_urlsafe(48))"',
            file=sys.stderr,
        )
        return 1
    subject = args.subject or f"token:{_os_user()}"
    now = datetime.now(UTC)
    token = mint_token(
        settings.admin_jwt_secret.get_secret_value(),
        subject=subject,
        scope=args.scope,
        ttl=args.ttl,
        now=now,
    )
    print(token)
    expires = (now + args.ttl).strftime("%Y-%m-%d %H:%M:%SZ")
    print(f"admin token for {subject!r}, scope {args.scope}, expires {expires}", file=sys.stderr)
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `admin` command and its `token` subcommand.

    Args:
        subparsers: The top-level `gateway` parser's subparsers. Each leaf parser sets
            `handler`, a `CommandHandler`.
    """
    admin = subparsers.add_parser("admin", help="admin API tokens")
    commands = admin.add_subparsers(title="commands", metavar="COMMAND", required=True)
    token = commands.add_parser(
        "token", help="mint an HS256 admin token (signed with GATEWAY_ADMIN_JWT_SECRET)"
    )
    token.add_argument(
        "--scope",
        required=True,
        choices=["admin", "read"],
        help="admin: everything; read: list, get, usage and audit only",
    )
    token.add_argument(
        "--ttl",
        type=_ttl,
        default=timedelta(minutes=15),
        metavar="DURATION",
        help="lifetime such as 15m, 8h or 24h, at most 24h (default: 15m)",
    )
    token.add_argument(
        "--subject",
        type=_subject,
        metavar="NAME",
        help="who the token is for, recorded in the audit trail (default: token:<os user>)",
    )
    token.set_defaults(handler=_token)
