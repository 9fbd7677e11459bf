"""`gateway keys usage` run in-process through `gateway.cli.main` (as test_cli_keys.py here)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.cli import main
from gateway.keys import usage_cli
from gateway.keys.store import KeyStore
from gateway.metering.usage import UsageSink
from tests.metering.test_usage import SUMMARY

#: Noon of a fixed UTC day: the sink and the CLI both read this clock, so a run that crosses
#: midnight (CI did, once) cannot put the seeded rows and the CLI's "today" on different days.
NOON = datetime(2030, 1, 2, 12, tzinfo=UTC)
TODAY = NOON.date()


class _FrozenDatetime(datetime):
    """`datetime` whose `now()` is `NOON`, for the CLI's default `--until`."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return NOON if tz is None else NOON.astimezone(tz)


@pytest.fixture(autouse=True)
def _frozen_today(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage_cli, "datetime", _FrozenDatetime)


def _seed(url: str) -> tuple[str, str]:
    """Two keys with usage today, and alice's 40 days ago; returns (alice id, bob id)."""

    async def run() -> tuple[str, str]:
        store = KeyStore.from_url(url)
        try:
            await store.create_schema()
            alice, _ = await store.create_key("alice")
            bob, _ = await store.create_key("bob")
            sink = UsageSink(store.engine, clock=NOON.timestamp)
            sink.record(replace(SUMMARY, key_id=alice.id))
            sink.record(replace(SUMMARY, key_id=alice.id, outcome="upstream_error", ttft_s=0.75))
            sink.record(replace(SUMMARY, key_id=bob.id, requested_model="qwen2.5:7b"))
            sink.record(replace(SUMMARY, key_id=alice.id, duration_s=40 * 86_400.0))
            assert await sink.flush()
            return alice.id, bob.id
        finally:
            await store.close()

    return asyncio.run(run())


def test_usage_table_shows_the_last_30_days_and_a_total(
    database_url: str,
    capsys: pytest.CaptureFixture[str],
):
    alice, bob = _seed(database_url)

    assert main(["keys", "usage"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        *("DAY", "KEY", "NAME", "MODEL", "REQUESTS", "ERRORS", "INPUT", "OUTPUT", "MEAN", "TTFT")
    ]
    rows = sorted(line.split() for line in lines[1:-1])
    today = TODAY.isoformat()
    assert rows == sorted(
        [
            [today, alice, "alice", "llama3.2:latest", "2", "1", "24", "32", "500", "ms"],
            [today, bob, "bob", "qwen2.5:7b", "1", "0", "12", "16", "250", "ms"],
        ]
    )
    assert lines[-1].split() == ["total", "3", "1", "36", "48", "417", "ms"]


def test_usage_json_filters_by_key_model_and_days(
    database_url: str,
    capsys: pytest.CaptureFixture[str],
):
    alice, _ = _seed(database_url)
    old = (TODAY - timedelta(days=40)).isoformat()

    assert main(["keys", "usage", alice, "--since", old, "--model", "Llama3.2", "--json"]) == 0

    report = json.loads(capsys.readouterr().out)
    assert (report["since"], report["until"]) == (old, TODAY.isoformat())
    assert [(row["day"], row["name"], row["requests"]) for row in report["rows"]] == [
        (old, "alice", 1),
        (TODAY.isoformat(), "alice", 2),
    ]
    assert report["totals"]["requests"] == 3
    assert report["totals"]["mean_ttft_s"] == pytest.approx((0.25 + 0.75 + 0.25) / 3)

    assert main(["keys", "usage", "--until", old, "--since", old]) == 0
    [row, total] = capsys.readouterr().out.splitlines()[1:]
    assert row.split()[:3] == [old, alice, "alice"]
    assert total.split()[:2] == ["total", "1"]


def test_usage_without_rows_says_so_and_bad_days_are_refused(
    database_url: str,
    capsys: pytest.CaptureFixture[str],
):
    assert main(["keys", "usage", "--until", "2030-01-31"]) == 0
    assert capsys.readouterr().out.strip() == "No usage from 2030-01-02 to 2030-01-31 (UTC days)."
    with pytest.raises(SystemExit) as caught:
        main(["keys", "usage", "--since", "2030-02-01", "--until", "2030-01-01"])
    assert caught.value.code == 2
    assert "is after --until" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["keys", "usage", "--since", "yesterday"])
    assert "YYYY-MM-DD" in capsys.readouterr().err
