"""KeyAuthenticator: the cache of verified keys in front of a real SQLite key store.

Also `Principal.from_record`, the principal a request gets from the record authenticated here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import event

from gateway.auth.authenticator import KeyAuthenticator
from gateway.auth.principal import Principal
from gateway.db.tables import ApiKeyRow
from gateway.keys import apikey
from gateway.keys.store import InvalidKeyError, KeyRecord, KeyStore
from tests.support.stack import Gateway

pytestmark = pytest.mark.anyio


class CountingStore(KeyStore):
    """A real store that counts (and can slow down) its lookups and writes."""

    lookups = 0
    touches = 0
    delay = 0.0

    async def authenticate(self, presented: str, *, now: datetime | None = None) -> KeyRecord:
        self.lookups += 1
        await anyio.sleep(self.delay)
        return await super().authenticate(presented, now=now)

    async def touch(self, key_id: str, **kwargs: Any) -> None:
        self.touches += 1
        await super().touch(key_id, **kwargs)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CountingStore]:
    store = CountingStore.from_url(f"sqlite+aiosqlite:///{tmp_path}/keys.db")
    await store.create_schema()
    try:
        yield store
    finally:
        await store.close()


def _authenticator(store: KeyStore, ttl: float, **kwargs: Any) -> KeyAuthenticator:
    kwargs.setdefault("last_used_interval", 60.0)
    return KeyAuthenticator(store, ttl=ttl, **kwargs)


async def test_a_verified_key_is_looked_up_once_within_the_ttl(store: CountingStore):
    record, key = await store.create_key("app")
    auth = _authenticator(store, ttl=60)
    for _ in range(5):
        assert (await auth.authenticate(key)).id == record.id
    assert store.lookups == 1
    assert store.touches == 1  # last_used_at written once, then the cached copy knows it


async def test_ttl_zero_reads_the_store_every_time(store: CountingStore):
    _, key = await store.create_key("app")
    auth = _authenticator(store, ttl=0)
    for _ in range(3):
        await auth.authenticate(key)
    assert store.lookups == 3
    assert len(auth) == 0


async def test_revocation_and_rotation_apply_once_the_entry_ages_out(store: CountingStore):
    clock = FakeClock()
    record, key = await store.create_key("app")
    other, other_key = await store.create_key("other")
    auth = _authenticator(store, ttl=1.0, clock=clock)
    await auth.authenticate(key)
    await auth.authenticate(other_key)
    await store.revoke(record.id)
    _, rotated = await store.rotate(other.id)

    clock.now += 0.9  # within the bound: the cached verification still serves
    await auth.authenticate(key)
    await auth.authenticate(other_key)

    clock.now += 0.2  # past it: the store is read again
    with pytest.raises(InvalidKeyError) as revoked:
        await auth.authenticate(key)
    assert revoked.value.reason == "revoked"
    with pytest.raises(InvalidKeyError) as unknown:
        await auth.authenticate(other_key)
    assert unknown.value.reason == "unknown"
    assert (await auth.authenticate(rotated)).id == other.id


async def test_expiry_is_exact_even_for_a_cached_key(store: CountingStore):
    _, key = await store.create_key("app", expires_at=datetime.now(UTC) + timedelta(seconds=0.3))
    auth = _authenticator(store, ttl=60)
    await auth.authenticate(key)
    await anyio.sleep(0.35)
    with pytest.raises(InvalidKeyError) as expired:
        await auth.authenticate(key)
    assert expired.value.reason == "expired"
    assert store.lookups == 1  # refused from the cached expires_at, and dropped
    assert len(auth) == 0


async def test_failures_are_never_cached(store: CountingStore):
    record, key = await store.create_key("app")
    wrong = f"gw_{record.id}_{'x' * 43}"
    auth = _authenticator(store, ttl=60)
    for _ in range(2):
        with pytest.raises(InvalidKeyError):
            await auth.authenticate(wrong)
    assert store.lookups == 2
    assert len(auth) == 0
    await auth.authenticate(key)  # the right secret still works after the failures
    assert len(auth) == 1


async def test_concurrent_misses_share_one_lookup(store: CountingStore):
    _, key = await store.create_key("app")
    store.delay = 0.05
    auth = _authenticator(store, ttl=60)
    ids: list[str] = []

    async def one() -> None:
        ids.append((await auth.authenticate(key)).id)

    async with anyio.create_task_group() as group:
        for _ in range(20):
            group.start_soon(one)
    assert len(ids) == 20
    assert store.lookups == 1


async def test_a_cancelled_lookup_lets_the_waiters_look_again(store: CountingStore):
    _, key = await store.create_key("app")
    store.delay = 0.2
    auth = _authenticator(store, ttl=60)
    results: list[str] = []

    async def leader() -> None:
        with anyio.move_on_after(0.05):
            await auth.authenticate(key)

    async def follower() -> None:
        await anyio.sleep(0.01)
        results.append((await auth.authenticate(key)).id)

    async with anyio.create_task_group() as group:
        group.start_soon(leader)
        group.start_soon(follower)
    assert len(results) == 1
    assert store.lookups == 2


async def test_the_cache_is_bounded(store: CountingStore):
    auth = _authenticator(store, ttl=60, max_entries=2)
    keys = [(await store.create_key(f"app-{n}"))[1] for n in range(3)]
    for key in keys:
        await auth.authenticate(key)
    assert len(auth) == 2
    await auth.authenticate(keys[0])  # the oldest was dropped: looked up again
    assert store.lookups == 4


async def test_a_permission_change_applies_once_the_entry_ages_out(store: CountingStore) -> None:
    clock = FakeClock()
    record, key = await store.create_key("ops")
    auth = _authenticator(store, ttl=1.0, clock=clock)
    assert not (await auth.authenticate(key)).manage_models

    await store.update_limits(record.id, manage_models=True)
    clock.now += 0.9  # within the bound: the cached record still serves
    assert not (await auth.authenticate(key)).manage_models
    clock.now += 0.2
    assert (await auth.authenticate(key)).manage_models

    await store.update_limits(record.id, manage_models=False)
    clock.now += 1.1
    assert not (await auth.authenticate(key)).manage_models


async def test_the_principal_carries_the_model_management_permission(store: CountingStore) -> None:
    _, ordinary_key = await store.create_key("app")
    manager, manager_key = await store.create_key(
        "ops", models=["m"], rpm=1, tpm=2, max_concurrent=3, manage_models=True
    )
    auth = _authenticator(store, ttl=60)

    ordinary = Principal.from_record(await auth.authenticate(ordinary_key))
    principal = Principal.from_record(await auth.authenticate(manager_key))

    assert ordinary.manage_models is False
    assert principal == Principal(
        manager.id, "ops", ("m",), rpm=1, tpm=2, max_concurrent=3, manage_models=True
    )


def test_a_principal_built_by_hand_does_not_manage_models() -> None:
    assert Principal("k1", "app", None).manage_models is False


@pytest.mark.parametrize(
    ("path", "header"),
    [("/api/generate", "Authorization"), ("/v1/chat/completions", "X-API-Key")],
)
def test_over_the_wire_an_unknown_id_does_the_work_of_a_wrong_secret(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch, path: str, header: str
) -> None:
    # Whether a key id exists showed in response timing (50-90 µs): an unknown id skipped
    # reading, decoding and loading a row. Through the real gateway (key cache on, its
    # default), both refusals now load one row and hash the secret twice, and read alike.
    gateway = make_gateway()
    loads: list[object] = []
    hashes: list[str] = []
    hash_secret = apikey.hash_secret

    def counting_hash(secret: str) -> str:
        hashes.append(secret)
        return hash_secret(secret)

    def on_load(target: object, _context: object) -> None:
        loads.append(target)

    monkeypatch.setattr(apikey, "hash_secret", counting_hash)
    _, other_secret, _ = apikey.generate_key()
    unknown_id = "0123456789ab" if gateway.key_id != "0123456789ab" else "ba9876543210"
    body = {"model": "llama3.2", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    work: dict[str, tuple[int, int]] = {}
    answers: dict[str, tuple[int, str]] = {}
    event.listen(ApiKeyRow, "load", on_load)
    try:
        for case, key_id in (("unknown id", unknown_id), ("wrong secret", gateway.key_id)):
            loads.clear()
            hashes.clear()
            credential = f"gw_{key_id}_{other_secret}"
            value = f"Bearer {credential}" if header == "Authorization" else credential
            response = httpx.post(
                f"{gateway.url}{path}", json=body, headers={header: value}, timeout=10
            )
            work[case] = (len(loads), len(hashes))
            answers[case] = (response.status_code, response.text)
    finally:
        event.remove(ApiKeyRow, "load", on_load)

    assert answers["unknown id"] == answers["wrong secret"]
    assert answers["unknown id"][0] == 401
    assert work["unknown id"] == work["wrong secret"] == (1, 2)
