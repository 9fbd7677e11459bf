"""The usage sink and `read_usage` on SQLite and on the PostgreSQL server on this machine.

The sink is driven with hand-made `RequestSummary`s and a fixed clock; what it writes is read
back with `read_usage`. PostgreSQL tests run in a schema of their own (`tests.keys.test_keystore`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from gateway.auth.principal import Principal
from gateway.keys.store import KeyStore
from gateway.metering.counting import UNKNOWN_MODEL, canonical_model, is_error
from gateway.metering.report import UsageTotals, read_usage
from gateway.metering.usage import UsageSink
from gateway.neutral import RequestSummary

#: 2030-01-02 00:00:05 UTC: five seconds into a UTC day.
NOW = datetime(2030, 1, 2, 0, 0, 5, tzinfo=UTC).timestamp()
DAY = date(2030, 1, 2)
YESTERDAY = date(2030, 1, 1)

SUMMARY = RequestSummary(
    route="/api/generate",
    model="llama3.2:latest",
    key="alice",
    upstream="127.0.0.1:11434",
    outcome="completed",
    status=200,
    duration_s=1.5,
    ttft_s=0.25,
    queue_wait_s=0.01,
    tokens_in=12,
    tokens_out=16,
    key_id="k1",
    requested_model="llama3.2",
)


def _sink(store: KeyStore, **options: Any) -> UsageSink:
    return UsageSink(store.engine, clock=lambda: NOW, **options)


def _dropped(sink: UsageSink) -> float:
    return sink.dropped._value.get()


async def _totals(store: KeyStore, **filters: Any) -> dict[tuple[str, str, date], UsageTotals]:
    report = await read_usage(store.engine, **filters)
    return {(row.key_id, row.model, row.day): row.totals for row in report.rows}


def test_canonical_model_is_the_allow_lists_form():
    for asked in ("llama3.2", "Llama3.2:Latest", " llama3.2 ", "library/qwen2.5:7b", "a/b"):
        assert Principal("k", "n", (canonical_model(asked),)).allows_model(asked)
    assert canonical_model("Llama3.2") == canonical_model("llama3.2:latest") == "llama3.2:latest"
    assert canonical_model("x" * 500) == "x" * 200
    assert canonical_model(None) == canonical_model("  ") == UNKNOWN_MODEL
    assert ":" not in UNKNOWN_MODEL  # so no model a client names can be recorded under it
    # What no database stores as text is replaced, so that one request cannot stop every flush.
    assert canonical_model("m1\ud800") == "m1?:latest"
    assert canonical_model("m\x00x") == "m?x:latest"
    assert canonical_model("Llamé") == "llamé:latest"


@pytest.mark.anyio
async def test_a_model_name_no_database_can_store_does_not_stop_the_flushes(store: KeyStore):
    sink = _sink(store)
    sink.record(replace(SUMMARY, requested_model="m1\ud800"))  # a lone surrogate, as escaped
    sink.record(replace(SUMMARY, requested_model="m2\x00"))
    sink.record(replace(SUMMARY, key_id="k2"))
    assert await sink.flush()
    rows = await _totals(store)
    assert {(key, model) for key, model, _ in rows} >= {
        ("k1", "m1?:latest"),
        ("k2", "llama3.2:latest"),
    }


@pytest.mark.parametrize(
    ("outcome", "status", "error"),
    [
        ("completed", 200, False),
        ("client_disconnect", 200, False),  # cut short by the client mid-stream
        ("client_disconnect", 499, False),  # left before the first byte
        ("completed", 404, True),
        ("upstream_error", 200, True),  # an error line mid-stream
        ("upstream_error", 502, True),
        ("timeout", 200, True),
        ("shutdown", 200, True),
        ("rate_limited", 429, True),
        ("client_error", 404, True),
    ],
)
def test_what_counts_as_an_error(outcome: str, status: int, error: bool):
    assert is_error(outcome, status) is error


@pytest.mark.anyio
async def test_summaries_add_up_per_key_model_and_day(store: KeyStore):
    sink = _sink(store)
    sink.record(SUMMARY)
    sink.record(replace(SUMMARY, requested_model="LLAMA3.2:latest", tokens_out=4, ttft_s=None))
    sink.record(replace(SUMMARY, key_id="k2"))
    sink.record(replace(SUMMARY, requested_model="qwen2.5:7b", queue_wait_s=None))
    sink.record(replace(SUMMARY, key_id=None))  # not an API key's request: ignored

    assert sink.pending == {
        ("k1", "llama3.2:latest", DAY): (2, 0, 24, 20, 1, 250_000, 3_000_000),
        ("k2", "llama3.2:latest", DAY): (1, 0, 12, 16, 1, 250_000, 1_500_000),
        ("k1", "qwen2.5:7b", DAY): (1, 0, 12, 16, 1, 250_000, 0),  # never sent upstream
    }
    assert await sink.flush()
    assert sink.pending == {}
    rows = await _totals(store)
    assert rows[("k1", "llama3.2:latest", DAY)] == UsageTotals(2, 0, 24, 20, 1, 250_000, 3_000_000)
    assert len(rows) == 3


@pytest.mark.anyio
async def test_an_error_status_counts_no_tokens_and_a_rejection_only_the_request(store: KeyStore):
    sink = _sink(store)
    # stream:false that failed after the upstream sent 5 chunks: the client got a 502, no text.
    sink.record(replace(SUMMARY, outcome="upstream_error", status=502, tokens_in=0, tokens_out=5))
    # A stream cut short by its client after 3 chunks: counted, not an error.
    sink.record(replace(SUMMARY, outcome="client_disconnect", tokens_in=0, tokens_out=3))
    sink.record_rejection("k1", None, status=429, outcome="rate_limited", elapsed_s=0.001)
    sink.record_rejection("k1", "Other", status=403, outcome="forbidden", elapsed_s=0.001)
    sink.record_rejection("k1", None, status=499, outcome="client_disconnect", elapsed_s=0.001)

    assert sink.pending == {
        ("k1", "llama3.2:latest", DAY): (2, 1, 0, 3, 1, 250_000, 3_000_000),
        ("k1", UNKNOWN_MODEL, DAY): (2, 1, 0, 0, 0, 0, 0),
        ("k1", "other:latest", DAY): (1, 1, 0, 0, 0, 0, 0),
    }
    await sink.flush()
    # `-` selects the requests refused before naming a model (it is no model name to canonize).
    unnamed = await read_usage(store.engine, model=UNKNOWN_MODEL)
    assert [(row.model, row.totals.requests) for row in unnamed.rows] == [(UNKNOWN_MODEL, 2)]


@pytest.mark.anyio
async def test_failures_for_models_no_upstream_lists_make_one_other_row(store: KeyStore):
    sink = _sink(store)
    for n in range(50):  # made-up names: the upstream's 404, and the gateway's refusals
        made_up = f"made-up-{n}"
        sink.record(
            replace(
                SUMMARY,
                model="other",
                requested_model=made_up,
                outcome="client_error",
                status=404,
                tokens_in=0,
                tokens_out=0,
                ttft_s=None,
            )
        )
        sink.record_rejection(
            "k1", made_up, status=429, outcome="rate_limited", elapsed_s=0.001, label="other"
        )
    # Real models stay exact: a success whose label lags the catalog, a refusal of a listed one.
    sink.record(replace(SUMMARY, model="other", requested_model="fresh-pull:7b"))
    sink.record_rejection(
        "k1", "llama3.2", status=429, outcome="rate_limited", elapsed_s=0.001, label="llama3.2"
    )

    assert set(sink.pending) == {
        ("k1", "other", DAY),
        ("k1", "fresh-pull:7b", DAY),
        ("k1", "llama3.2:latest", DAY),
    }
    assert sink.pending[("k1", "other", DAY)][:2] == (100, 100)  # requests, errors
    await sink.flush()
    assert len(await _totals(store)) == 3


@pytest.mark.anyio
async def test_the_day_is_the_utc_date_of_arrival(store: KeyStore):
    sink = _sink(store)
    sink.record(replace(SUMMARY, duration_s=10.0))  # arrived 23:59:55 the day before
    sink.record(replace(SUMMARY, duration_s=5.0))  # arrived 00:00:00 exactly
    sink.record_rejection("k1", "llama3.2", status=429, outcome="rate_limited", elapsed_s=6.0)
    await sink.flush()

    rows = await _totals(store)
    assert rows[("k1", "llama3.2:latest", YESTERDAY)].requests == 2
    assert rows[("k1", "llama3.2:latest", DAY)].requests == 1
    assert [r.day for r in (await read_usage(store.engine, since=DAY)).rows] == [DAY]
    assert [r.day for r in (await read_usage(store.engine, until=YESTERDAY)).rows] == [YESTERDAY]


@pytest.mark.anyio
async def test_a_flush_adds_to_existing_rows_even_from_another_sink(store: KeyStore):
    first, second = _sink(store), _sink(store)  # two replicas on one database
    for _ in range(3):
        first.record(SUMMARY)
        second.record(SUMMARY)
        assert await first.flush()
        assert await second.flush()

    [totals] = (await _totals(store)).values()
    assert totals == UsageTotals(6, 0, 72, 96, 6, 1_500_000, 9_000_000)


def _failing_trigger(dialect: str) -> list[str]:
    """SQL that makes inserting a row for model `boom:latest` fail, mid-batch."""
    if dialect == "sqlite":
        return [
            "CREATE TRIGGER boom BEFORE INSERT ON gateway_usage WHEN NEW.model = 'boom:latest' "
            "BEGIN SELECT RAISE(ABORT, 'boom'); END"
        ]
    return [
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.model = 'boom:latest' THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER boom BEFORE INSERT ON gateway_usage FOR EACH ROW EXECUTE FUNCTION boom()",
    ]


@pytest.mark.anyio
async def test_a_failed_flush_commits_nothing_and_its_retry_counts_once(store: KeyStore):
    dialect = store.engine.dialect.name
    async with store.engine.begin() as conn:
        for statement in _failing_trigger(dialect):
            await conn.execute(text(statement))
    sink = _sink(store)
    sink.record(replace(SUMMARY, requested_model="a"))  # sorted before the failing row
    sink.record(replace(SUMMARY, requested_model="boom"))
    sink.record(replace(SUMMARY, requested_model="c"))

    assert not await sink.flush()
    assert await _totals(store) == {}  # the rows written before the failure were rolled back
    assert sink.flush_failures._value.get() == 1
    sink.record(replace(SUMMARY, requested_model="a"))  # arrives while the database is failing
    assert not await sink.flush()

    async with store.engine.begin() as conn:
        await conn.execute(
            text("DROP TRIGGER boom" + (" ON gateway_usage" * (dialect != "sqlite")))
        )
    assert await sink.flush()
    assert await sink.flush()  # nothing left: writes nothing more
    rows = await _totals(store)
    assert {model: totals.requests for (_, model, _), totals in rows.items()} == {
        "a:latest": 2,
        "boom:latest": 1,
        "c:latest": 1,
    }


@pytest.mark.anyio
async def test_pending_rows_are_bounded_and_drops_are_counted(tmp_path: Path):
    store = KeyStore.from_url(f"sqlite+aiosqlite:///{tmp_path / 'none.db'}")  # no table: down
    try:
        sink = _sink(store, max_rows=2)
        sink.record(replace(SUMMARY, requested_model="a"))
        sink.record(replace(SUMMARY, requested_model="b"))
        assert not await sink.flush()  # the database fails: both rows kept
        sink.record(replace(SUMMARY, requested_model="c"))  # a third row: over the bound
        sink.record(replace(SUMMARY, requested_model="a"))  # an existing row still adds up
        assert _dropped(sink) == 1
        assert sink.pending == {
            ("k1", "a:latest", DAY): (2, 0, 24, 32, 2, 500_000, 3_000_000),
            ("k1", "b:latest", DAY): (1, 0, 12, 16, 1, 250_000, 1_500_000),
        }
        await store.create_schema()  # the database is back
        assert await sink.flush()
        assert len(await _totals(store)) == 2
    finally:
        await store.close()


@pytest.mark.anyio
async def test_the_loop_flushes_early_when_half_full_and_everything_when_stopped(store: KeyStore):
    sink = _sink(store, flush_seconds=300, max_rows=4)  # no interval will pass in this test
    async with anyio.create_task_group() as group:
        group.start_soon(sink.run)
        sink.record(replace(SUMMARY, requested_model="a"))
        sink.record(replace(SUMMARY, requested_model="b"))  # half of 4: flush now
        with anyio.fail_after(30):
            while len(await _totals(store)) < 2:  # noqa: ASYNC110 - polls the database
                await anyio.sleep(0.02)
        sink.record(replace(SUMMARY, requested_model="c"))
        sink.stop()
    rows = await _totals(store)
    assert sorted(model for _, model, _ in rows) == ["a:latest", "b:latest", "c:latest"]
    sink.record(SUMMARY)  # after the final flush: nowhere to go, counted
    assert _dropped(sink) == 1
    assert sink.pending == {}


@pytest.mark.anyio
async def test_the_final_flush_runs_even_when_the_loop_is_cancelled(store: KeyStore):
    sink = _sink(store, flush_seconds=300)
    async with anyio.create_task_group() as group:
        group.start_soon(sink.run)
        await anyio.wait_all_tasks_blocked()  # the loop waits for its interval
        sink.record(SUMMARY)
        group.cancel_scope.cancel()
    assert [totals.requests for totals in (await _totals(store)).values()] == [1]


@pytest.mark.anyio
async def test_read_usage_filters_and_totals(store: KeyStore):
    alice, _ = await store.create_key("alice")
    bob, _ = await store.create_key("bob")
    sink = _sink(store)
    sink.record(replace(SUMMARY, key_id=alice.id))
    sink.record(replace(SUMMARY, key_id=alice.id, requested_model="qwen2.5:7b", duration_s=60))
    sink.record(replace(SUMMARY, key_id=bob.id, ttft_s=0.75))
    sink.record(replace(SUMMARY, key_id="gone00000000"))
    await sink.flush()

    everything = await read_usage(store.engine)
    assert {(r.day, r.key_name, r.model) for r in everything.rows} == {
        (YESTERDAY, "alice", "qwen2.5:7b"),  # arrived a minute before midnight
        (DAY, "alice", "llama3.2:latest"),
        (DAY, "bob", "llama3.2:latest"),
        (DAY, None, "llama3.2:latest"),  # a key the store no longer has
    }
    order = [(r.day, r.key_id, r.model) for r in everything.rows]
    assert order == sorted(order)
    assert everything.totals.requests == 4
    assert everything.totals.output_tokens == 64
    only_bob = await read_usage(store.engine, key_id=bob.id, model="Llama3.2")
    assert [r.key_name for r in only_bob.rows] == ["bob"]
    assert only_bob.totals.mean_ttft_s == pytest.approx(0.75)
    assert (await read_usage(store.engine, model="qwen2.5:7b", since=DAY)).rows == []
    assert everything.to_json()["totals"]["requests"] == 4


@pytest.mark.anyio
async def test_an_unreachable_database_is_a_failed_flush_not_an_exception():
    store = KeyStore.from_url(
        "postgresql+asyncpg://postgres@127.0.0.1:1/none", connect_args={"timeout": 5}
    )  # nothing listens on port 1
    try:
        sink = _sink(store)
        sink.record(SUMMARY)
        assert not await sink.flush()
        assert sink.pending == {
            ("k1", "llama3.2:latest", DAY): (1, 0, 12, 16, 1, 250_000, 1_500_000)
        }
        with pytest.raises((SQLAlchemyError, OSError)):
            await read_usage(store.engine)
    finally:
        await store.close()
