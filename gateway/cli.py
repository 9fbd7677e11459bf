# ruff: noqa: T201 (a command-line interface prints by design)
"""The `gateway` command: `serve`, `keys`, `audit`, `db`, `admin`, `bench`, `batch`.

`main(argv)` parses the arguments, builds `Settings()` once and hands both to the chosen
subcommand's `handler`, so tests can run any command in-process.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from gateway import __version__
from gateway.auth import token_cli as admin_cli
from gateway.db import cli as db_cli
from gateway.keys import audit_cli
from gateway.keys import cli as keys_cli
from gateway.settings import Settings


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: use 1 to 65535")
    return int(text)


def _workers(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid worker count {text!r}: use 1 or more, or auto")
    return int(text)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here so that `gateway keys ...` does not load the web stack.
    from gateway.serve.server import serve
    from gateway.serve.workers import serve_workers, worker_count

    host = settings.host if args.host is None else args.host
    port = settings.port if args.port is None else args.port
    workers = worker_count(settings.workers if args.workers is None else args.workers)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Inherited from the shell or a unit file: one process would write its metrics there
        # and read a previous run's files back (stale counters, dead processes' gauges).
        print(
            "gateway serve: PROMETHEUS_MULTIPROC_DIR is set; unset it: with --workers N the "
            "gateway makes and removes its own multiprocess directory",
            file=sys.stderr,
        )
        return 2
    if workers > 1:
        return serve_workers(settings, host, port, workers)
    return serve(settings, host=host, port=port)


def build_parser() -> argparse.ArgumentParser:
    """Build the `gateway` argument parser with all its subcommands."""
    parser = argparse.ArgumentParser(
        prog="gateway",
        allow_abbrev=False,
        description="Authenticated inference gateway for Ollama-compatible model servers. "
        "Configuration comes from GATEWAY_* environment variables and .env.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="run the gateway HTTP server")
    serve.add_argument("--host", help="address to bind (default: GATEWAY_HOST)")
    serve.add_argument("--port", type=_port, help="port to listen on (default: GATEWAY_PORT)")
    serve.add_argument(
        "--workers",
        type=_workers,
        help="worker processes behind the one socket, or auto: one per CPU "
        "(default: GATEWAY_WORKERS, 1); more than 1 needs Redis limit storage",
    )
    serve.set_defaults(handler=_serve)

    keys_cli.add_parser(commands)
    audit_cli.add_parser(commands)
    db_cli.add_parser(commands)
    admin_cli.add_parser(commands)
    _add_bench(commands)
    _add_batch(commands)
    return parser


def _add_bench(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Imported here so that `gateway serve` does not load the benchmark.
    from gateway.clients.bench import cli as bench_cli

    bench_cli.add_parser(commands)


def _add_batch(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Imported here so that `gateway serve` does not load the batch client.
    from gateway.clients import batch_cli as batch_cli

    batch_cli.add_parser(commands)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `gateway` command.

    Args:
        argv: The arguments after the program name; default: `sys.argv[1:]`.

    Returns:
        The process exit code: 0 on success, 1 when the command failed, 2 on invalid
        configuration.

    Raises:
        SystemExit: from argparse, on `--help`, `--version` or a usage error (code 2).
    """
    args = build_parser().parse_args(argv)
    bench = getattr(args, "bench_handler", None)
    if bench is not None:
        # A benchmark or a batch client may run on a machine that serves nothing: no gateway
        # settings needed.
        return int(bench(args))
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"gateway: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    handler: keys_cli.CommandHandler = args.handler
    return handler(args, settings)
