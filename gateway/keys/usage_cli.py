# ruff: noqa: T201 (a command-line interface prints by design)
"""`gateway keys usage`: what keys used, per UTC day and model, from `gateway_usage`.

A table by default (one line per day, key and model, then a total line); `--json` prints
`{"since", "until", "rows", "totals"}` (`gateway.metering.report.UsageReport.to_json`). Days are
UTC dates, `--since` and `--until` inclusive; without them, the last 30 days up to today.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta

from gateway.keys.store import KeyStore
from gateway.metering.report import UsageReport, UsageTotals, read_usage
from gateway.settings import Settings

#: Days shown without `--since`: today and the 29 before it.
DEFAULT_DAYS = 30

Runner = Callable[[Settings, Callable[[KeyStore], Awaitable[int]]], int]
"""How `gateway.keys.cli` runs one action on a fresh key store (its error handling included)."""


def parse_day(text: str) -> date:
    """Parse `YYYY-MM-DD` for argparse.

    Raises:
        argparse.ArgumentTypeError: not a date in that form.
    """
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date as YYYY-MM-DD, got {text!r}") from None


def _mean_ttft(totals: UsageTotals) -> str:
    mean = totals.mean_ttft_s
    return "-" if mean is None else f"{mean * 1000:.0f} ms"


def _print_table(report: UsageReport) -> None:
    header = ("DAY", "KEY", "NAME", "MODEL", "REQUESTS", "ERRORS", "INPUT", "OUTPUT", "MEAN TTFT")
    numbers = ("requests", "errors", "input_tokens", "output_tokens")

    def cells(totals: UsageTotals) -> tuple[str, ...]:
        return (*(str(getattr(totals, name)) for name in numbers), _mean_ttft(totals))

    rows = [
        (row.day.isoformat(), row.key_id, row.key_name or "-", row.model, *cells(row.totals))
        for row in report.rows
    ]
    rows.append(("total", "", "", "", *cells(report.totals)))
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    right = range(4, len(header))  # numbers are right-aligned
    for row in [header, *rows]:
        line = "  ".join(
            cell.rjust(width) if column in right else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        print(line.rstrip())


def _usage(args: argparse.Namespace, settings: Settings, *, run: Runner) -> int:
    until: date = args.until or datetime.now(UTC).date()
    since: date = args.since or until - timedelta(days=DEFAULT_DAYS - 1)
    if since > until:
        parser: argparse.ArgumentParser = args.parser
        parser.error(f"--since {since} is after --until {until}")

    async def action(store: KeyStore) -> int:
        report = await read_usage(
            store.engine, key_id=args.key_id, model=args.model, since=since, until=until
        )
        if args.json:
            print(
                json.dumps(
                    {"since": since.isoformat(), "until": until.isoformat()} | report.to_json()
                )
            )
        elif report.rows:
            _print_table(report)
        else:
            print(f"No usage from {since} to {until} (UTC days).")
        return 0

    return run(settings, action)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser], run: Runner) -> None:
    """Add `keys usage` to the `keys` subcommands.

    Args:
        commands: The `keys` command's subparsers.
        run: Runs the command's action on a key store (`gateway.keys.cli`).
    """
    usage = commands.add_parser(
        "usage", help="show what keys used per UTC day and model (requests, errors, tokens, TTFT)"
    )
    usage.add_argument("key_id", nargs="?", metavar="ID", help="only this key (default: all)")
    usage.add_argument("--since", type=parse_day, metavar="YYYY-MM-DD", help="first UTC day")
    usage.add_argument(
        "--until", type=parse_day, metavar="YYYY-MM-DD", help="last UTC day (default: today)"
    )
    usage.add_argument("--model", metavar="M", help="only this model (`x` is `x:latest`)")
    usage.add_argument("--json", action="store_true", help="print rows and totals as JSON")
    usage.set_defaults(handler=functools.partial(_usage, run=run), parser=usage)
