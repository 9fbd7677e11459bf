# ruff: noqa: T201 (a command-line interface prints by design)
"""`gateway batch submit|list|show|cancel|download`: the Batch API from the command line.

Talks HTTP to a running gateway with an app key (docs/batch.md#the-cli). The key is never an
argument (a command line is visible to every user of the machine and lands in shell history):
it comes from `GATEWAY_API_KEY` or `--key-file`, and is never printed. No gateway settings are
loaded: the command may run on any machine that can reach the gateway.

Exit codes: 0 success (with `--wait`: the batch completed), 1 the batch ended failed, expired
or cancelled, 2 an error (one line on stderr, the server's message included).

Over ~300 lines for one reason: one subcommand per Batch API operation, each a few lines over the
shared `Api` client, `read_key` and `_escape`, with the exit-code rule above and `add_parser`
declaring them together; split per command, every part would import the same client and rules back.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import httpx

from gateway.clients.keyfile import KeyInputError, read_client_key

#: The gateway's id shapes (`gateway.batch.records.new_id`); a file is named after the batch id.
BATCH_ID = re.compile(r"batch_[0-9a-f]{24}")
FILE_ID = re.compile(r"file-[0-9a-f]{24}")

KEY_ENV = "GATEWAY_API_KEY"
URL_ENV = "GATEWAY_URL"
DEFAULT_URL = "http://127.0.0.1:8080"
ENDED = ("completed", "failed", "expired", "cancelled")


class CliError(Exception):
    """A failure reported as one line on stderr with exit code 2."""


def _escape(text: str) -> str:
    """The text with control characters escaped (a server's message cannot redraw the TTY)."""
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


def read_key(key_file: Path | None) -> str:
    """The key from `--key-file` (first line, stripped) or `GATEWAY_API_KEY`.

    Raises:
        CliError: no key, or one `read_client_key` refuses (the file or the key is wrong).
    """
    try:
        key = read_client_key(key_file, KEY_ENV)
    except KeyInputError as exc:
        raise CliError(str(exc)) from None
    if not key:
        raise CliError(f"no API key: set ${KEY_ENV} or pass --key-file")
    return key


class Api:
    """A small client of the gateway's `/v1/files` and `/v1/batches`."""

    def __init__(self, url: str, key: str, timeout: float = 60.0) -> None:
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request; raise CliError with the server's message on a non-2xx answer."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the gateway: {exc}") from None
        if response.is_success:
            return response
        message = response.text[:500]
        try:
            error = response.json().get("error")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                message = error["message"]
        except (ValueError, AttributeError):
            pass
        raise CliError(f"{method} {path}: HTTP {response.status_code}: {message}")

    def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """The JSON object of a successful answer."""
        value = self.request(method, path, **kwargs).json()
        if not isinstance(value, dict):
            raise CliError(f"{method} {path}: the answer is not a JSON object")
        return value


def _metadata(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--metadata takes key=value, not {pair!r}")
        out[key] = value
    return out


def _progress(batch: dict[str, Any], start: float, start_done: int) -> str:
    counts = batch.get("request_counts") or {}
    done = int(counts.get("completed", 0))
    failed = int(counts.get("failed", 0))
    total = int(counts.get("total", 0))
    elapsed = max(time.monotonic() - start, 1e-9)
    rate = (done + failed - start_done) / elapsed
    left = total - done - failed
    eta = f"{left / rate:.0f}s" if rate > 0 and left > 0 else "-"
    return (
        f"{batch.get('status')}: {done} done, {failed} failed, {total} total, "
        f"{rate:.1f} lines/s, ETA {eta}"
    )


def wait_for(
    api: Api, batch_id: str, *, poll: float, stderr: TextIO, every: float = 5.0
) -> dict[str, Any]:
    """Poll the batch until it ends, drawing a progress line on `stderr`; the ended batch."""
    tty = stderr.isatty()
    start = time.monotonic()
    last_drawn: float | None = None  # the first look is always drawn
    batch = api.json("GET", f"/v1/batches/{batch_id}")
    counts = batch.get("request_counts") or {}
    start_done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
    while True:
        line = _progress(batch, start, start_done)
        ended = batch.get("status") in ENDED
        now = time.monotonic()
        if tty:
            stderr.write(f"\r\x1b[K{line}" + ("\n" if ended else ""))
            stderr.flush()
        elif ended or last_drawn is None or now - last_drawn >= every:
            stderr.write(line + "\n")
            stderr.flush()
            last_drawn = now
        if ended:
            return batch
        time.sleep(poll)
        batch = api.json("GET", f"/v1/batches/{batch_id}")


def _submit(api: Api, args: argparse.Namespace) -> int:
    path: Path = args.file
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    uploaded = api.json(
        "POST",
        "/v1/files",
        files={"file": (path.name, content, "application/jsonl")},
        data={"purpose": "batch"},
    )
    body: dict[str, Any] = {
        "input_file_id": uploaded["id"],
        "endpoint": args.endpoint,
        "completion_window": args.window,
    }
    metadata = _metadata(args.metadata)
    if metadata is not None:
        body["metadata"] = metadata
    batch = api.json("POST", "/v1/batches", json=body)
    print(batch["id"], flush=True)
    if batch.get("status") == "failed" and batch.get("errors"):
        for error in (batch["errors"] or {}).get("data") or []:
            where = f"line {error.get('line')}: " if error.get("line") is not None else ""
            print(_escape(f"{where}{error.get('code')}: {error.get('message')}"), file=sys.stderr)
    if not args.wait:
        return 1 if batch.get("status") == "failed" else 0
    ended = wait_for(api, batch["id"], poll=args.poll, stderr=sys.stderr)
    return 0 if ended.get("status") == "completed" else 1


def _list(api: Api, args: argparse.Namespace) -> int:
    params: dict[str, Any] = {"limit": args.limit}
    if args.after:
        params["after"] = args.after
    answer = api.json("GET", "/v1/batches", params=params)
    for batch in answer.get("data") or []:
        counts = batch.get("request_counts") or {}
        print(
            f"{batch['id']}  {batch['status']:<11}  {batch['endpoint']:<20}  "
            f"{counts.get('completed', 0)}/{counts.get('failed', 0)}/{counts.get('total', 0)}"
        )
    return 0


def _show(api: Api, args: argparse.Namespace) -> int:
    path = f"/v1/batches/{args.id}" + ("/events" if args.log else "")
    shown = json.dumps(api.json("GET", path), indent=2, ensure_ascii=False)
    print("\n".join(_escape(line) for line in shown.split("\n")))
    return 0


def _cancel(api: Api, args: argparse.Namespace) -> int:
    batch = api.json("POST", f"/v1/batches/{args.id}/cancel")
    print(f"{batch['id']} {batch['status']}")
    return 0


def _download(api: Api, args: argparse.Namespace) -> int:
    if not BATCH_ID.fullmatch(args.id):
        raise CliError(f"not a batch id: {_escape(args.id)}")
    batch = api.json("GET", f"/v1/batches/{args.id}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    wrote = 0
    for field, suffix in (("output_file_id", "output"), ("error_file_id", "error")):
        file_id = batch.get(field)
        if not file_id:
            continue
        if not isinstance(file_id, str) or not FILE_ID.fullmatch(file_id):
            raise CliError(f"the server named a malformed file id: {_escape(str(file_id))}")
        content = api.request("GET", f"/v1/files/{file_id}/content").content
        # Named from the id we checked, never from the server's answer (no path in it).
        target = out / f"{args.id}_{suffix}.jsonl"
        target.write_bytes(content)
        print(target)
        wrote += 1
    if not wrote:
        status = batch.get("status")
        if status not in ENDED:
            raise CliError(f"batch {batch['id']} is {status}: no result files yet")
        print(f"batch {batch['id']} ended {status} with no result files", file=sys.stderr)
    return 0


HANDLERS = {
    "submit": _submit,
    "list": _list,
    "show": _show,
    "cancel": _cancel,
    "download": _download,
}


def _main(args: argparse.Namespace) -> int:
    try:
        key = read_key(args.key_file)
        api = Api(args.url, key)
        try:
            return HANDLERS[args.batch_command](api, args)
        finally:
            api.close()
    except CliError as exc:
        print(f"gateway batch: {_escape(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gateway batch: interrupted", file=sys.stderr)
        return 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `batch` command; its leaves set `bench_handler` (no gateway settings needed)."""
    batch = subparsers.add_parser(
        "batch",
        help="submit and follow OpenAI-style batch jobs on a running gateway",
        description=f"Batch jobs through a gateway's /v1/batches. The key comes from ${KEY_ENV} "
        "or --key-file, never from an argument. Exit codes: 0 ok, 1 the batch did not "
        "complete, 2 error.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"the gateway's base URL (default: ${URL_ENV} or {DEFAULT_URL})",
    )
    common.add_argument("--key-file", type=Path, help=f"file holding the key (else ${KEY_ENV})")
    commands = batch.add_subparsers(
        title="commands", metavar="COMMAND", dest="batch_command", required=True
    )
    submit = commands.add_parser(
        "submit", parents=[common], help="upload a JSONL file and create a batch; print its id"
    )
    submit.add_argument("file", type=Path, help="the input file (OpenAI batch JSONL)")
    submit.add_argument(
        "--endpoint",
        required=True,
        choices=("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"),
    )
    submit.add_argument("--window", default="24h", help="completion window (default: 24h)")
    submit.add_argument(
        "--metadata", action="append", metavar="KEY=VALUE", help="a metadata pair (repeatable)"
    )
    submit.add_argument(
        "--wait", action="store_true", help="follow the batch until it ends (progress on stderr)"
    )
    submit.add_argument(
        "--poll", type=float, default=2.0, help="seconds between polls with --wait (default: 2)"
    )
    listing = commands.add_parser("list", parents=[common], help="the key's batches, newest first")
    listing.add_argument("--limit", type=int, default=20, help="how many (1-100, default: 20)")
    listing.add_argument("--after", metavar="BATCH_ID", help="the page after this batch (older)")
    show = commands.add_parser("show", parents=[common], help="print a batch as JSON")
    show.add_argument("id")
    show.add_argument("--log", action="store_true", help="print the batch's event log instead")
    cancel = commands.add_parser("cancel", parents=[common], help="cancel a batch")
    cancel.add_argument("id")
    download = commands.add_parser(
        "download", parents=[common], help="write <id>_output.jsonl and <id>_error.jsonl"
    )
    download.add_argument("id")
    download.add_argument("--out", type=Path, default=Path(), help="directory (default: .)")
    batch.set_defaults(bench_handler=_main)
    # No prefixes: `--key gw_...` would be taken as `--key-file` and the key echoed back.
    batch.allow_abbrev = False
    for leaf in commands.choices.values():
        leaf.allow_abbrev = False
