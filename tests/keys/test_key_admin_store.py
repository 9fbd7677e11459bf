"""The key store's admin operations on both backends: update, rotate with grace, list, audit.

The same operations back `gateway keys ...` and `/admin/v1` (one implementation, two front
ends), so the rules are tested here once; tests/api/admin/test_admin_api.py tests the HTTP front
end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from gateway.keys.audit import Actor
from gateway.keys.store import InvalidKeyError, KeyNotFoundError, KeyStore
from tests.keys.test_keystore import T0
from tests.support.servers import Database

ALICE = Actor("alice@example.com", "192.0.2.7")


@pytest.mark.anyio
async def test_rotation_with_grace_keeps_the_old_secret_until_it_ends(store: KeyStore) -> None:
    record, old_key = await store.create_key("app")

    rotated, new_key = await store.rotate(record.id, grace=timedelta(hours=1), now=T0)

    assert rotated.rotation_grace_until == T0 + timedelta(hours=1)
    assert (await store.authenticate(new_key, now=T0)).id == record.id
    during = await store.authenticate(old_key, now=T0 + timedelta(minutes=59))
    # The old credential's own expiry is the end of the grace: caches must honour it.
    assert during.expires_at == T0 + timedelta(hours=1)
    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(old_key, now=T0 + timedelta(hours=1))
    assert caught.value.reason == "unknown"
    assert (await store.authenticate(new_key, now=T0 + timedelta(days=1))).expires_at is None


@pytest.mark.anyio
async def test_rotation_without_grace_refuses_the_old_secret_at_once(store: KeyStore) -> None:
    record, old_key = await store.create_key("app")

    rotated, new_key = await store.rotate(record.id)

    assert rotated.rotation_grace_until is None
    with pytest.raises(InvalidKeyError):
        await store.authenticate(old_key)
    assert (await store.authenticate(new_key)).id == record.id


@pytest.mark.anyio
async def test_a_second_rotation_ends_the_first_old_secret(store: KeyStore) -> None:
    record, first = await store.create_key("app")
    _, second = await store.rotate(record.id, grace=timedelta(hours=1), now=T0)

    _, third = await store.rotate(record.id, grace=timedelta(hours=1), now=T0)

    with pytest.raises(InvalidKeyError):
        await store.authenticate(first, now=T0)
    assert (await store.authenticate(second, now=T0)).id == record.id
    assert (await store.authenticate(third, now=T0)).id == record.id


@pytest.mark.anyio
async def test_the_old_secret_never_outlives_the_key(store: KeyStore) -> None:
    record, old_key = await store.create_key("app", expires_at=T0 + timedelta(minutes=10))
    await store.rotate(record.id, grace=timedelta(hours=1), now=T0)

    during = await store.authenticate(old_key, now=T0)

    assert during.expires_at == T0 + timedelta(minutes=10)
    with pytest.raises(InvalidKeyError) as caught:
        await store.authenticate(old_key, now=T0 + timedelta(minutes=10))
    assert caught.value.reason == "expired"


@pytest.mark.anyio
async def test_revoking_ends_the_grace_period_too(store: KeyStore) -> None:
    record, old_key = await store.create_key("app")
    await store.rotate(record.id, grace=timedelta(hours=1))

    revoked = await store.revoke(record.id)

    assert revoked.rotation_grace_until is None
    with pytest.raises(InvalidKeyError):
        await store.authenticate(old_key)


@pytest.mark.anyio
@pytest.mark.parametrize("grace", [timedelta(seconds=-1), timedelta(days=30, seconds=1)])
async def test_rotate_refuses_a_grace_out_of_range(store: KeyStore, grace: timedelta) -> None:
    record, key = await store.create_key("app")

    with pytest.raises(ValueError, match="grace"):
        await store.rotate(record.id, grace=grace)

    assert (await store.authenticate(key)).id == record.id
    assert [entry.action for entry in await store.list_audit(key_id=record.id)] == ["create"]


@pytest.mark.anyio
async def test_update_changes_only_the_fields_given(store: KeyStore) -> None:
    record, _ = await store.create_key("app", models=["a"], rpm=5, tpm=100)
    later = T0 + timedelta(days=1)

    updated = await store.update(record.id, name="renamed", models=None, expires_at=later)

    assert (updated.name, updated.models, updated.expires_at) == ("renamed", None, later)
    assert (updated.rpm, updated.tpm) == (5, 100)
    assert await store.get_key(record.id) == updated
    cleared = await store.update(record.id, expires_at=None, rpm=None)
    assert (cleared.expires_at, cleared.rpm, cleared.name) == (None, None, "renamed")


@pytest.mark.anyio
@pytest.mark.parametrize(
    "changes",
    [
        {"name": ""},
        {"models": []},
        {"models": "llama3"},
        {"expires_at": datetime(2030, 1, 1)},  # naive
        {"rpm": -1},
        {"manage_models": 1},
    ],
)
async def test_an_invalid_update_changes_nothing_and_audits_nothing(
    store: KeyStore, changes: dict[str, object]
) -> None:
    record, _ = await store.create_key("app", rpm=5)

    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        await store.update(record.id, tpm=9, **{"name": "other", **changes})  # type: ignore[arg-type]

    assert await store.get_key(record.id) == record
    assert [entry.action for entry in await store.list_audit(key_id=record.id)] == ["create"]


@pytest.mark.anyio
async def test_admin_actions_on_an_unknown_key_raise_not_found(store: KeyStore) -> None:
    for action in (store.revoke("0" * 12), store.rotate("0" * 12), store.update("0" * 12)):
        with pytest.raises(KeyNotFoundError):
            await action
    assert await store.list_audit() == []


@pytest.mark.anyio
async def test_every_change_is_audited_with_before_and_after_but_no_secret(
    store: KeyStore, database: Database
) -> None:
    record, key = await store.create_key("app", rpm=5, actor=ALICE)
    await store.update(record.id, rpm=7, name="app2", actor=ALICE)
    await store.rotate(record.id, grace=timedelta(minutes=5), actor=Actor("cli:root"))
    await store.revoke(record.id, actor=ALICE)

    entries = await store.list_audit(key_id=record.id)

    assert [entry.action for entry in entries] == ["create", "update", "rotate", "revoke"]
    assert [entry.actor for entry in entries] == [ALICE.subject] * 2 + ["cli:root", ALICE.subject]
    assert entries[0].source == "192.0.2.7"
    assert entries[2].source is None
    assert entries[0].changes is not None
    assert entries[0].changes["rpm"] == {"before": None, "after": 5}
    assert entries[1].changes == {
        "name": {"before": "app", "after": "app2"},
        "rpm": {"before": 5, "after": 7},
    }
    assert entries[2].changes is not None
    assert set(entries[2].changes) == {"rotation_grace_until", "secret"}
    assert entries[2].changes["secret"] == {"before": "not recorded", "after": "not recorded"}
    assert entries[3].changes is not None
    assert entries[3].changes["revoked_at"]["before"] is None
    # Nothing of the secret or its hash is anywhere in the trail.
    dumped = json.dumps([entry.as_json() for entry in entries])
    secret = key.split("_", 2)[2]  # gw_<id>_<secret>: the secret may hold "_" itself
    stored_hash = await database.scalar(
        text("SELECT secret_hash FROM gateway_api_keys WHERE id = :id").bindparams(id=record.id)
    )
    assert secret not in dumped
    assert stored_hash not in dumped


@pytest.mark.anyio
async def test_concurrent_updates_of_one_key_chain_their_audit_entries(store: KeyStore) -> None:
    record, _ = await store.create_key("app", rpm=0)

    await asyncio.gather(*(store.update(record.id, rpm=n) for n in range(1, 9)))

    updates = [
        entry for entry in await store.list_audit(key_id=record.id) if entry.action == "update"
    ]
    assert len(updates) == 8
    # Each entry's "before" is the previous one's "after": no two read the same row.
    values = [entry.changes["rpm"] for entry in updates if entry.changes]
    for previous, current in itertools.pairwise(values):
        assert current["before"] == previous["after"]
    assert (await store.get_key(record.id)).rpm == values[-1]["after"]


@pytest.mark.anyio
async def test_audit_filters_and_pages(store: KeyStore) -> None:
    first, _ = await store.create_key("one", actor=ALICE)
    second, _ = await store.create_key("two", actor=Actor("bob"))
    await store.revoke(first.id, actor=Actor("bob"))

    by_bob = await store.list_audit(actor="bob")
    revokes = await store.list_audit(actions=["revoke"])
    page = await store.list_audit(limit=2)
    rest = await store.list_audit(after_id=page[-1].id)
    future = await store.list_audit(since=datetime.now(UTC) + timedelta(minutes=1))

    assert [(entry.action, entry.key_id) for entry in by_bob] == [
        ("create", second.id),
        ("revoke", first.id),
    ]
    assert [entry.key_id for entry in revokes] == [first.id]
    assert [entry.id for entry in page + rest] == sorted(entry.id for entry in page + rest)
    assert len(page + rest) == 3
    assert future == []


@pytest.mark.anyio
async def test_list_filters_by_status_name_and_model(store: KeyStore) -> None:
    active, _ = await store.create_key("Team-A app", models=["llama3"])
    revoked, _ = await store.create_key("team-b")
    expired, _ = await store.create_key("old_100%", expires_at=datetime.now(UTC) - timedelta(1))
    anything, _ = await store.create_key("all models")
    await store.revoke(revoked.id)

    def ids(records: list) -> list[str]:  # type: ignore[type-arg]
        return [record.id for record in records]

    assert ids(await store.list_keys(status="active")) == [active.id, anything.id]
    assert ids(await store.list_keys(status="revoked")) == [revoked.id]
    assert ids(await store.list_keys(status="expired")) == [expired.id]
    assert ids(await store.list_keys(name="team")) == [active.id, revoked.id]
    # LIKE wildcards in the filter are matched literally.
    assert ids(await store.list_keys(name="_100%")) == [expired.id]
    assert ids(await store.list_keys(name="%")) == [expired.id]
    assert ids(await store.list_keys(model="llama3:latest", status="active")) == [
        active.id,
        anything.id,
    ]
    assert ids(await store.list_keys(model="mistral", status="active")) == [anything.id]


@pytest.mark.anyio
async def test_list_pages_through_every_key_once(store: KeyStore) -> None:
    created = [(await store.create_key(f"k{n}"))[0].id for n in range(7)]

    seen: list[str] = []
    after = None
    while True:
        page = await store.list_keys(after=after, limit=3)
        seen += [record.id for record in page]
        if len(page) < 3:
            break
        after = (page[-1].created_at, page[-1].id)

    assert seen == created
