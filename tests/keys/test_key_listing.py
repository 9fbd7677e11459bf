"""Listing keys on both backends: the model filter's SQL part, and pages over 10,000 keys.

docs/admin.md ("Scale") has the times; `benchmarks/admin_keys.py` measures them. These tests
check what the pages hold, never how fast they come.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, insert, select

from gateway.keys.schema import ApiKeyRow, may_use
from gateway.keys.store import KeyStore

ALLOW_LISTS = [
    None,
    ["Llama3.2"],
    ["llama3.2:latest", "qwen2.5:7b"],
    ["LLAMA3.2:LATEST"],
    ["qwen2.5"],
    ["my_model"],
    ["my%model"],
    ['a"b'],
    ["library/phi3:mini"],
    ["\u212aimi"],  # the Kelvin sign: Python lower-cases it to `k`, SQL does not
    ["éclair"],
    [" llama3 "],
    ["llama3.1 ", "gemma3"],
    ["llama3.2", " gemma3:1b"],
    ["Llama3:Latest"],
]
ASKED = [
    "llama3.2",
    "LLAMA3.2",
    "llama3.2:latest",
    "qwen2.5",
    "qwen2.5:7b",
    "my_model",
    "myXmodel",
    "my%model",
    'a"b',
    "library/phi3:mini",
    "phi3:mini",
    "kimi",
    "ÉCLAIR",
    "mistral",
    "llama3",
    "gemma3",
    "gemma3:1b",
    "llama3.1",
    "llama",
]
KEYS = 10_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.anyio
async def test_the_model_filter_lists_exactly_the_keys_that_may_use_the_model(
    store: KeyStore,
) -> None:
    for n, models in enumerate(ALLOW_LISTS):
        await store.create_key(f"key-{n}", models=models)
    everything = await store.list_keys()

    for model in ASKED:
        expected = [record.id for record in everything if record.allows_model(model)]
        listed = [record.id for record in await store.list_keys(model=model)]
        assert listed == expected, model


@pytest.mark.anyio
async def test_the_model_filter_leaves_most_other_keys_in_the_database(store: KeyStore) -> None:
    for n, models in enumerate(ALLOW_LISTS):
        await store.create_key(f"key-{n}", models=models)
    condition = may_use("mistral")
    assert condition is not None

    async with store.engine.connect() as conn:
        read = await conn.scalar(select(func.count()).select_from(ApiKeyRow).where(condition))

    # No allow-list; a name escaped in JSON (`"`, non-ASCII: 3); one padded with spaces (3).
    assert read == 7


def test_names_the_sql_filter_cannot_compare_are_left_to_python() -> None:
    assert may_use("éclair") is None
    assert may_use('a"b') is None
    assert may_use("a\\b") is None
    assert may_use("llama3.2") is not None


async def _seed(store: KeyStore) -> list[str]:
    """`KEYS` keys, one second apart, one in 50 revoked; their ids, oldest first."""
    rows = [
        {
            "id": f"{n:06d}{secrets.token_hex(3)}",
            "name": f"team-{n:05d}",
            "secret_hash": "0" * 64,
            "models": ["llama3.2"] if n % 2 else None,
            "created_at": T0 + timedelta(seconds=n),
            "revoked_at": T0 if n % 50 == 0 else None,
        }
        for n in range(KEYS)
    ]
    async with store.engine.begin() as conn:
        await conn.execute(insert(ApiKeyRow), rows)
    return [row["id"] for row in rows]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.anyio
async def test_pages_over_ten_thousand_keys_hold_the_right_keys(store: KeyStore) -> None:
    ids = await _seed(store)

    first = await store.list_keys(limit=100)
    revoked = await store.list_keys(status="revoked", limit=100)
    named = await store.list_keys(name="TEAM-0999", limit=100)
    mistral = await store.list_keys(model="mistral", limit=100)

    assert [record.id for record in first] == ids[:100]
    assert [record.id for record in revoked] == ids[::50][:100]
    assert [record.name for record in named] == [f"team-0999{n}" for n in range(10)]
    assert [record.id for record in mistral] == ids[::2][:100]  # no allow-list: every model
    walked: list[str] = []
    after = None
    while page := await store.list_keys(after=after, limit=1000):
        walked += [record.id for record in page]
        after = (page[-1].created_at, page[-1].id)
    assert walked == ids
