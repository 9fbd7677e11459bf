# ruff: noqa: T201 (a benchmark prints its table)
"""Time of the admin API's key list over many keys: first pages, filtered, on SQLite and PostgreSQL.

Run: `.venv/bin/python -m benchmarks.admin_keys [--keys 10000] [--postgres URL] [--calls 30]`.

Seeds `--keys` keys straight into a fresh database (a temporary SQLite file; with `--postgres`,
also a role and schema of their own in that server, dropped afterwards): one in 50 revoked, one
in 50 expired, names `team-<n>`, each with an allow-list (`llama3.2`, and for one in three
`qwen2.5:7b` too: before `gateway.keys.schema.may_use` the model filter ran in Python alone, so
a model no key may use read every row). Then a real gateway (uvicorn on a loopback port, the app
as `gateway serve` builds it, an upstream nobody answers) serves `GET /admin/v1/keys` for each
query below, `--calls` times after two warm-up calls; the table shows the median and the
slowest wall time of the HTTP round trip (loopback adds well under a millisecond) and the rows
answered.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import insert, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from gateway.app import create_app
from gateway.auth.jwt import mint_token
from gateway.keys.schema import ApiKeyRow
from gateway.keys.store import KeyStore
from gateway.settings import Settings
from gateway.testing.server import LoopbackServer

SECRET = secrets.token_urlsafe(32)
#: (label, query string) of each measured call.
QUERIES = [
    ("first page", "limit=100"),
    ("name contains (1 match)", "limit=100&name=team-04242"),
    ("name contains (1,111 match)", "limit=100&name=team-0"),
    ("status=active", "limit=100&status=active"),
    ("status=revoked", "limit=100&status=revoked"),
    ("status=expired", "limit=100&status=expired"),
    ("model (1 in 3 may)", "limit=100&model=qwen2.5:7b"),
    ("model (none may)", "limit=100&model=mistral"),
    ("model (part of listed names)", "limit=100&model=llama3"),
    ("page 50 (cursor)", None),
]


async def seed(url: str, keys: int) -> None:
    """Create the schema and `keys` keys, oldest first, in one transaction."""
    store = KeyStore.from_url(url)
    try:
        await store.create_schema()
    finally:
        await store.close()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        {
            "id": secrets.token_hex(6),
            "name": f"team-{n:05d}",
            "secret_hash": secrets.token_hex(32),
            "models": ["llama3.2", "qwen2.5:7b"] if n % 3 == 0 else ["llama3.2"],
            "created_at": start + timedelta(seconds=n),
            "expires_at": start if n % 50 == 1 else None,
            "revoked_at": start if n % 50 == 0 else None,
            "manage_models": False,
        }
        for n in range(keys)
    ]
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(insert(ApiKeyRow), rows)
    finally:
        await engine.dispose()


def measure(url: str, calls: int) -> list[tuple[str, float, float, int]]:
    """Serve the admin API on `url`'s store; (label, median ms, max ms, rows) per query."""
    settings = Settings(
        _env_file=None,
        database_url=url,
        admin_jwt_secret=SECRET,
        upstream_url="http://127.0.0.1:9",  # nothing listens: the monitor's polls just fail
    )
    token = mint_token(SECRET, subject="bench", scope="read", ttl=timedelta(hours=1))
    results = []
    with (
        LoopbackServer(create_app(settings)) as server,
        httpx.Client(
            base_url=f"{server.url}/admin/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ) as client,
    ):
        params = {"limit": "100"}
        for _ in range(49):  # the cursor of page 50
            params["cursor"] = client.get("/keys", params=params).json()["next_cursor"]
        cursor = params["cursor"]
        for label, query in QUERIES:
            path = f"/keys?{query}" if query is not None else f"/keys?limit=100&cursor={cursor}"
            times = []
            for attempt in range(calls + 2):
                began = time.perf_counter()
                response = client.get(path)
                elapsed = time.perf_counter() - began
                response.raise_for_status()
                if attempt >= 2:  # two warm-up calls: connections, statement caches
                    times.append(elapsed * 1000)
            rows = len(response.json()["data"])
            results.append((label, statistics.median(times), max(times), rows))
    return results


@contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """A role whose search_path is a schema of its own in `url`'s server; its URL."""
    name = f"gw_bench_{secrets.token_hex(4)}"

    async def run(*statements: str) -> None:
        engine = create_async_engine(url, poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                for statement in statements:
                    await conn.execute(text(statement))
        finally:
            await engine.dispose()

    asyncio.run(
        run(
            f'CREATE ROLE "{name}" LOGIN',
            f'CREATE SCHEMA "{name}" AUTHORIZATION "{name}"',
            f'ALTER ROLE "{name}" SET search_path = "{name}"',
        )
    )
    try:
        user = httpx.URL(url.replace("postgresql+asyncpg", "http", 1)).username
        yield url.replace(f"{user}@", f"{name}@", 1)
    finally:
        asyncio.run(run(f'DROP SCHEMA "{name}" CASCADE', f'DROP ROLE "{name}"'))


def report(backend: str, results: list[tuple[str, float, float, int]]) -> None:
    """Print one backend's table."""
    print(f"\n{backend}")
    print(f"{'query':<30} {'median ms':>10} {'max ms':>8} {'rows':>5}")
    for label, median, slowest, rows in results:
        print(f"{label:<30} {median:>10.1f} {slowest:>8.1f} {rows:>5}")


def main() -> None:
    """Seed, measure and print each backend."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument(
        "--postgres", help="a superuser URL, e.g. postgresql+asyncpg://postgres@127.0.0.1/test"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite+aiosqlite:///{Path(directory) / 'keys.db'}"
        asyncio.run(seed(url, args.keys))
        report(f"SQLite, {args.keys} keys", measure(url, args.calls))
    if args.postgres:
        with postgres_schema(args.postgres) as url:
            asyncio.run(seed(url, args.keys))
            report(f"PostgreSQL, {args.keys} keys", measure(url, args.calls))


if __name__ == "__main__":
    main()
