"""KeyStore against both backends: a SQLite file, and the PostgreSQL server on this machine.

Each PostgreSQL test gets its own schema (via `search_path`), dropped with its table afterwards, so
tests are isolated, rerunnable, and safe next to another run using the same database.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import event

from gateway.db.tables import ApiKeyRow
from gateway.keys import apikey
from gateway.keys import store as store_module
from gateway.keys.store import UNSET, InvalidKeyError, KeyNotFoundError, KeyRecord, KeyStore
from gateway.keys.validation import MAX_LIMIT

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.anyio
async def test_created_key_authenticates(store: KeyStore) -> None:
    record, key = await store.create_key("alice", expires_at=T0)

    authenticated = await store.authenticate(key, now=T0 - timedelta(seconds=1))

    assert authenticated == record
    assert key.startswith(f"gw_{record.id}_")
    assert record.name == "alice"
    assert record.models is None
    assert record.expires_at == T0
    assert record.revoked_at is None
    assert record.last_used_at is None
    assert record.created_at.tzinfo is UTC


@pytest.mark.anyio
async def test_read_back_times_are_utc_aware(store: KeyStore) -> None:
    plus_two = datetime(2030, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    record, _ = await store.create_key("zoned", expires_at=plus_two)

    stored = await store.get_key(record.id)

    assert stored == record
    assert stored.expires_at == T0
    assert stored.expires_at is not None
    assert stored.expires_at.utcoffset() == timedelta(0)
    assert stored.created_at.utcoffset() == timedelta(0)


@pytest.mark.anyio
@pytest.mark.parametrize("presented", ["", "garbage", "gw_XYZ_secret", "Bearer gw_0123456789ab_s"])
async def test_authenticate_rejects_malformed_key(store: KeyStore, presented: str) -> None:
    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(presented)

    assert caught.value.reason == "malformed"
    assert caught.value.message == "invalid API key"


@pytest.mark.anyio
async def test_authenticate_rejects_unknown_id_after_a_dummy_compare(
    store: KeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[str] = []

    def spy(secret: str, stored_hash: str) -> bool:
        compared.append(stored_hash)
        return apikey.secret_matches(secret, stored_hash)

    monkeypatch.setattr(store_module, "secret_matches", spy)
    _, _, key = apikey.generate_key()

    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(key)

    assert caught.value.reason == "unknown"
    assert str(caught.value) == "invalid API key"
    # As many compares as for a known key (its current and its pre-rotation secret).
    assert compared == [store_module._DUMMY_HASH, store_module._DUMMY_HASH]


class AuthenticationWork:
    """What one `authenticate` did: rows the ORM loaded, records built, digests compared."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loaded = 0
        self.records = 0
        self.compares = 0
        to_record, secret_matches = store_module.to_record, store_module.secret_matches

        def counting_record(row: Any) -> KeyRecord:
            self.records += 1
            return to_record(row)

        def counting_compare(secret: str, stored_hash: str) -> bool:
            self.compares += 1
            return secret_matches(secret, stored_hash)

        monkeypatch.setattr(store_module, "to_record", counting_record)
        monkeypatch.setattr(store_module, "secret_matches", counting_compare)

    def on_load(self, _target: Any, _context: Any) -> None:
        self.loaded += 1

    def counts(self) -> tuple[int, int, int]:
        return self.loaded, self.records, self.compares


@pytest.mark.anyio
async def test_an_unknown_id_costs_what_a_known_id_with_a_wrong_secret_does(
    store: KeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whether a key id exists showed in response timing (50-90 µs): for an unknown id the
    # database returned nothing, so no row was decoded or loaded and no record was built. Now
    # the same work runs either way: one row loaded (the key's, or a stand-in), one record
    # built, two digests compared.
    record, key = await store.create_key("alice", models=["llama3.2"])
    await store.touch(record.id)
    _, other_secret, _ = apikey.generate_key()
    unknown_id = "0123456789ab" if record.id != "0123456789ab" else "ba9876543210"
    work: dict[str, tuple[int, int, int]] = {}
    for case, presented in (
        ("unknown id", f"gw_{unknown_id}_{other_secret}"),
        ("wrong secret", f"gw_{record.id}_{other_secret}"),
        ("right secret", key),
    ):
        spy = AuthenticationWork(monkeypatch)
        event.listen(ApiKeyRow, "load", spy.on_load)
        try:
            with contextlib.suppress(InvalidKeyError):
                await store.authenticate(presented)
        finally:
            event.remove(ApiKeyRow, "load", spy.on_load)
        work[case] = spy.counts()

    assert work["unknown id"] == work["wrong secret"] == work["right secret"] == (1, 1, 2)


@pytest.mark.anyio
async def test_the_stand_in_of_an_unknown_id_opens_nothing(store: KeyStore) -> None:
    # The stand-in row's hashes are a known secret's: its match must still be refused.
    for presented in (
        "gw_0123456789ab_gateway-dummy-secret",
        "gw_ffffffffffff_gateway-dummy-secret",
    ):
        with pytest.raises(InvalidKeyError) as caught:
            await store.authenticate(presented)
        assert caught.value.reason == "unknown"
    assert await store.list_keys() == []  # and it is no key


@pytest.mark.anyio
async def test_authenticate_rejects_wrong_secret_like_unknown_id(store: KeyStore) -> None:
    record, _ = await store.create_key("alice")
    _, other_secret, _ = apikey.generate_key()

    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(f"gw_{record.id}_{other_secret}")

    assert caught.value.reason == "unknown"


@pytest.mark.anyio
async def test_revoked_key_is_rejected_and_revoke_is_idempotent(store: KeyStore) -> None:
    record, key = await store.create_key("alice")

    first = await store.revoke(record.id)
    second = await store.revoke(record.id)

    assert first.revoked_at is not None
    assert second.revoked_at == first.revoked_at
    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(key)
    assert caught.value.reason == "revoked"
    assert caught.value.message == "API key has been revoked"


@pytest.mark.anyio
async def test_key_expires_at_expires_at(store: KeyStore) -> None:
    _, key = await store.create_key("temp", expires_at=T0)

    await store.authenticate(key, now=T0 - timedelta(microseconds=1))
    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(key, now=T0)

    assert caught.value.reason == "expired"
    assert caught.value.message == "API key has expired"


@pytest.mark.anyio
async def test_revoked_wins_over_expired(store: KeyStore) -> None:
    record, key = await store.create_key("temp", expires_at=T0)
    await store.revoke(record.id)

    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(key, now=T0 + timedelta(days=1))

    assert caught.value.reason == "revoked"


@pytest.mark.anyio
async def test_rotate_replaces_the_secret_at_once(store: KeyStore) -> None:
    record, old_key = await store.create_key("alice", models=["llama3.2:1b"])

    rotated, new_key = await store.rotate(record.id)

    assert rotated == record
    assert new_key != old_key
    assert new_key.startswith(f"gw_{record.id}_")
    assert await store.authenticate(new_key) == record
    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(old_key)
    assert caught.value.reason == "unknown"


@pytest.mark.anyio
async def test_rotate_revoked_key_is_refused(store: KeyStore) -> None:
    record, key = await store.create_key("alice")
    await store.revoke(record.id)

    with pytest.raises(InvalidKeyError) as caught:
        await store.rotate(record.id)

    assert caught.value.reason == "revoked"
    with pytest.raises(InvalidKeyError):
        await store.authenticate(key)


@pytest.mark.anyio
async def test_admin_operations_on_unknown_id_raise_key_not_found(store: KeyStore) -> None:
    with pytest.raises(KeyNotFoundError):
        await store.get_key("0123456789ab")
    with pytest.raises(KeyNotFoundError):
        await store.revoke("0123456789ab")
    with pytest.raises(KeyNotFoundError):
        await store.update_limits("0123456789ab", rpm=10)
    with pytest.raises(KeyNotFoundError):
        await store.update_limits("0123456789ab")
    with pytest.raises(KeyNotFoundError) as caught:
        await store.rotate("0123456789ab")
    assert caught.value.key_id == "0123456789ab"


@pytest.mark.anyio
async def test_model_allow_list_is_stored_and_enforced(store: KeyStore) -> None:
    _, key = await store.create_key("scoped", models=["llama3.2:1b", "qwen3", "qwen3"])

    authenticated = await store.authenticate(key)

    assert authenticated.models == ("llama3.2:1b", "qwen3")
    assert authenticated.allows_model("llama3.2:1b")
    assert authenticated.allows_model("qwen3:latest")
    assert not authenticated.allows_model("llama3.2:3b")
    assert not authenticated.allows_model("llama3.2")


def _record(models: tuple[str, ...] | None) -> KeyRecord:
    return KeyRecord("0123456789ab", "n", models, T0, None, None, None)


def test_allows_model_without_allow_list_allows_everything() -> None:
    assert _record(None).allows_model("anything:7b")


def test_allows_model_treats_latest_as_the_bare_name_and_ignores_case() -> None:
    # The same rule as the principal that requests are checked with (gateway.model_names).
    assert _record(("llama3:latest",)).allows_model("llama3")
    assert _record(("llama3",)).allows_model("llama3:latest")
    assert not _record(("llama3",)).allows_model("llama3:8b")
    assert _record(("Llama3",)).allows_model("llama3")
    assert not _record(()).allows_model("llama3")


@pytest.mark.anyio
async def test_touch_writes_last_used_at_at_most_once_per_interval(store: KeyStore) -> None:
    record, _ = await store.create_key("alice")

    await store.touch(record.id, now=T0, min_interval=60)
    assert (await store.get_key(record.id)).last_used_at == T0

    await store.touch(record.id, now=T0 + timedelta(seconds=59), min_interval=60)
    assert (await store.get_key(record.id)).last_used_at == T0

    await store.touch(record.id, now=T0 + timedelta(seconds=60), min_interval=60)
    assert (await store.get_key(record.id)).last_used_at == T0 + timedelta(seconds=60)

    await store.touch(record.id, now=T0, min_interval=0)
    assert (await store.get_key(record.id)).last_used_at == T0 + timedelta(seconds=60)

    await store.touch("0123456789ab", now=T0)


@pytest.mark.anyio
async def test_list_keys_returns_all_keys_oldest_first(store: KeyStore) -> None:
    assert await store.list_keys() == []
    first, _ = await store.create_key("first")
    second, _ = await store.create_key("second", models=["m"])
    await store.revoke(first.id)

    listed = await store.list_keys()

    assert [record.id for record in listed] == [first.id, second.id]
    assert listed[0].revoked_at is not None
    assert listed[1] == second


@pytest.mark.anyio
async def test_create_key_rejects_bad_input(store: KeyStore) -> None:
    with pytest.raises(ValueError, match="name"):
        await store.create_key("  ")
    with pytest.raises(ValueError, match="name"):
        await store.create_key("x" * 201)
    with pytest.raises(ValueError, match="models"):
        await store.create_key("x", models=[])
    with pytest.raises(ValueError, match="naive"):
        await store.create_key("x", expires_at=datetime(2030, 1, 1))
    assert await store.list_keys() == []


@pytest.mark.anyio
async def test_naive_now_is_rejected(store: KeyStore) -> None:
    record, key = await store.create_key("alice")
    naive = datetime(2030, 1, 1)

    with pytest.raises(ValueError, match="naive"):
        await store.authenticate(key, now=naive)
    with pytest.raises(ValueError, match="naive"):
        await store.touch(record.id, now=naive)


@pytest.mark.anyio
async def test_limits_default_to_none(store: KeyStore) -> None:
    record, key = await store.create_key("alice")

    assert (record.rpm, record.tpm, record.max_concurrent) == (None, None, None)
    assert await store.authenticate(key) == record


@pytest.mark.anyio
async def test_create_key_stores_limits(store: KeyStore) -> None:
    record, key = await store.create_key("limited", rpm=60, tpm=0, max_concurrent=MAX_LIMIT)

    assert (record.rpm, record.tpm, record.max_concurrent) == (60, 0, MAX_LIMIT)
    assert await store.get_key(record.id) == record
    assert await store.authenticate(key) == record
    assert await store.list_keys() == [record]


@pytest.mark.anyio
async def test_update_limits_changes_only_the_given_fields(store: KeyStore) -> None:
    record, key = await store.create_key(
        "limited", models=["m"], expires_at=T0, rpm=60, tpm=1000, max_concurrent=2
    )

    updated = await store.update_limits(record.id, rpm=0)
    assert (updated.rpm, updated.tpm, updated.max_concurrent) == (0, 1000, 2)

    updated = await store.update_limits(record.id, tpm=None, max_concurrent=5)
    assert (updated.rpm, updated.tpm, updated.max_concurrent) == (0, None, 5)

    updated = await store.update_limits(record.id, rpm=UNSET, max_concurrent=None)
    assert (updated.rpm, updated.tpm, updated.max_concurrent) == (0, None, None)

    assert await store.update_limits(record.id) == updated
    assert await store.get_key(record.id) == updated
    assert updated == KeyRecord(
        record.id, "limited", ("m",), record.created_at, T0, None, None, 0, None, None
    )
    assert await store.authenticate(key, now=T0 - timedelta(seconds=1)) == updated


@pytest.mark.anyio
async def test_update_limits_works_on_a_revoked_key(store: KeyStore) -> None:
    record, _ = await store.create_key("alice")
    revoked = await store.revoke(record.id)

    updated = await store.update_limits(record.id, rpm=5)

    assert updated.rpm == 5
    assert updated.revoked_at == revoked.revoked_at


@pytest.mark.anyio
@pytest.mark.parametrize("value", [-1, MAX_LIMIT + 1, True, 1.5])
@pytest.mark.parametrize("limit", ["rpm", "tpm", "max_concurrent"])
async def test_invalid_limits_are_rejected_and_nothing_changes(
    store: KeyStore, limit: str, value: Any
) -> None:
    with pytest.raises(ValueError, match=limit):
        await store.create_key("x", **{limit: value})
    record, _ = await store.create_key("kept", rpm=7, tpm=8, max_concurrent=9)

    with pytest.raises(ValueError, match=limit):
        await store.update_limits(record.id, **{limit: value})
    with pytest.raises(ValueError, match=limit):  # valid changes next to it are not applied
        await store.update_limits(
            record.id, **{"rpm": 1, "tpm": 1, "max_concurrent": 1, limit: value}
        )

    assert await store.list_keys() == [record]


@pytest.mark.anyio
async def test_keys_do_not_manage_models_unless_created_so(store: KeyStore) -> None:
    ordinary, ordinary_key = await store.create_key("app")
    manager, manager_key = await store.create_key("ops", manage_models=True)

    assert ordinary.manage_models is False
    assert manager.manage_models is True
    assert await store.authenticate(ordinary_key) == ordinary
    assert await store.authenticate(manager_key) == manager
    assert await store.get_key(manager.id) == manager
    assert await store.list_keys() == [ordinary, manager]


@pytest.mark.anyio
async def test_update_limits_grants_and_clears_manage_models(store: KeyStore) -> None:
    record, key = await store.create_key("app", models=["m"], rpm=60)

    granted = await store.update_limits(record.id, manage_models=True)
    assert granted.manage_models is True
    assert (granted.models, granted.rpm) == (("m",), 60)
    assert await store.authenticate(key) == granted

    assert await store.update_limits(record.id, rpm=5) == replace(granted, rpm=5)
    assert await store.update_limits(record.id, manage_models=UNSET) == replace(granted, rpm=5)

    cleared = await store.update_limits(record.id, manage_models=False, rpm=None)
    assert (cleared.manage_models, cleared.rpm) == (False, None)
    assert await store.get_key(record.id) == cleared


@pytest.mark.anyio
@pytest.mark.parametrize("value", [None, 1, "yes"])
async def test_a_manage_models_that_is_not_a_bool_is_rejected(store: KeyStore, value: Any) -> None:
    with pytest.raises(ValueError, match="manage_models"):
        await store.create_key("x", manage_models=value)
    record, _ = await store.create_key("kept", rpm=7)

    with pytest.raises(ValueError, match="manage_models"):  # the valid rpm is not applied either
        await store.update_limits(record.id, rpm=1, manage_models=value)

    assert await store.list_keys() == [record]
