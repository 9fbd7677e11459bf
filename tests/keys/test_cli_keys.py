"""`gateway keys ...` run in-process through `gateway.cli.main`, and once as `python -m gateway`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.keys.store import InvalidKeyError, KeyRecord, KeyStore


def _authenticate(url: str, key: str) -> KeyRecord:
    async def run() -> KeyRecord:
        store = KeyStore.from_url(url)
        try:
            return await store.authenticate(key)
        finally:
            await store.close()

    return asyncio.run(run())


def _create_expired(url: str) -> KeyRecord:
    async def run() -> KeyRecord:
        store = KeyStore.from_url(url)
        try:
            await store.create_schema()
            record, _ = await store.create_key("old", expires_at=datetime.now(UTC) - timedelta(1))
            return record
        finally:
            await store.close()

    return asyncio.run(run())


def _create_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    assert main(["keys", "create", "--name", "ci", "--json", *extra]) == 0
    created: dict[str, object] = json.loads(capsys.readouterr().out)
    return created


def test_create_json_prints_one_object_whose_key_authenticates(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = datetime.now(UTC)

    created = _create_json(capsys, "--models", "llama3.2:1b, qwen3,", "--expires-in", "30d")

    assert {"id", "key", "name", "models", "expires_at"} <= created.keys()
    assert created["name"] == "ci"
    assert created["models"] == ["llama3.2:1b", "qwen3"]
    expires_at = datetime.fromisoformat(str(created["expires_at"]))
    assert before + timedelta(days=30) <= expires_at <= datetime.now(UTC) + timedelta(days=30)
    record = _authenticate(database_url, str(created["key"]))
    assert record.id == created["id"]
    assert record.models == ("llama3.2:1b", "qwen3")


def test_create_prints_the_key_once_with_a_warning(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "create", "--name", "alice"]) == 0

    out = capsys.readouterr().out
    keys = [line for line in out.splitlines() if line.startswith("gw_")]
    assert len(keys) == 1
    assert out.count(keys[0]) == 1
    assert "will not be shown again" in out
    assert _authenticate(database_url, keys[0]).name == "alice"


def test_list_shows_every_key_and_status_but_no_secret(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    active = _create_json(capsys, "--models", "m1,m2")
    revoked = _create_json(capsys)
    assert main(["keys", "revoke", str(revoked["id"])]) == 0
    expired = _create_expired(database_url)
    capsys.readouterr()

    assert main(["keys", "list"]) == 0
    table = capsys.readouterr().out
    assert main(["keys", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)

    header, *rows = table.splitlines()
    assert header.split()[:3] == ["ID", "NAME", "MODELS"]
    assert "LAST USED" in header
    status = {row.split()[0]: row.split()[-1] for row in rows}
    assert status == {active["id"]: "active", revoked["id"]: "revoked", expired.id: "expired"}
    assert "m1,m2" in table
    assert [entry["status"] for entry in listed] == ["active", "revoked", "expired"]
    for output in (table, json.dumps(listed)):
        for created in (active, revoked):
            secret = str(created["key"]).removeprefix(f"gw_{created['id']}_")
            assert secret not in output
        assert "gw_" not in output
    assert all("key" not in entry for entry in listed)


def test_list_without_keys_says_so(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "list"]) == 0

    assert "No API keys" in capsys.readouterr().out


def test_revoke_stops_the_key(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    created = _create_json(capsys)

    assert main(["keys", "revoke", str(created["id"])]) == 0

    assert f"Revoked key {created['id']}" in capsys.readouterr().out
    with pytest.raises(InvalidKeyError, match="revoked"):
        _authenticate(database_url, str(created["key"]))


def test_rotate_prints_a_new_key_and_the_old_one_stops(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = _create_json(capsys)

    assert main(["keys", "rotate", str(created["id"]), "--json"]) == 0

    rotated = json.loads(capsys.readouterr().out)
    assert rotated["id"] == created["id"]
    assert rotated["key"] != created["key"]
    assert _authenticate(database_url, rotated["key"]).id == created["id"]
    with pytest.raises(InvalidKeyError):
        _authenticate(database_url, str(created["key"]))


def test_rotate_text_output_has_the_warning(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = _create_json(capsys)

    assert main(["keys", "rotate", str(created["id"])]) == 0

    out = capsys.readouterr().out
    assert "will not be shown again" in out
    new_key = next(line for line in out.splitlines() if line.startswith("gw_"))
    assert _authenticate(database_url, new_key).id == created["id"]


def test_rotate_revoked_key_fails(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    created = _create_json(capsys)
    assert main(["keys", "revoke", str(created["id"])]) == 0
    capsys.readouterr()

    assert main(["keys", "rotate", str(created["id"])]) == 1

    captured = capsys.readouterr()
    assert "revoked" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("command", ["revoke", "rotate"])
def test_unknown_id_exits_1(
    database_url: str, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert main(["keys", command, "0123456789ab"]) == 1

    captured = capsys.readouterr()
    assert "no API key with id '0123456789ab'" in captured.err
    assert captured.out == ""


def _limits(entry: dict[str, object]) -> tuple[object, object, object]:
    return entry["rpm"], entry["tpm"], entry["max_concurrent"]


def test_create_with_limits_stores_them(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = _create_json(capsys, "--rpm", "60", "--tpm", "0", "--max-concurrent", "2")

    assert _limits(created) == (60, 0, 2)
    record = _authenticate(database_url, str(created["key"]))
    assert (record.rpm, record.tpm, record.max_concurrent) == (60, 0, 2)


def test_create_without_limits_leaves_the_defaults(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _limits(_create_json(capsys)) == (None, None, None)

    assert main(["keys", "create", "--name", "alice", "--tpm", "0"]) == 0

    out = capsys.readouterr().out
    assert "Limits: rpm default, tpm unlimited, max concurrent default" in out


def test_update_changes_only_the_given_limits(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = _create_json(capsys, "--rpm", "60", "--tpm", "1000", "--max-concurrent", "2")
    key_id = str(created["id"])

    assert main(["keys", "update", key_id, "--rpm", "0"]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"Updated key {key_id} (ci); models: all; expires: never; "
        "limits: rpm unlimited, tpm 1000, max concurrent 2; "
        "manage models: no\n"
    )

    assert (
        main(["keys", "update", key_id, "--tpm", "default", "--max-concurrent", "5", "--json"]) == 0
    )
    updated = json.loads(capsys.readouterr().out)
    assert _limits(updated) == (0, None, 5)
    assert updated["id"] == key_id
    assert "key" not in updated

    assert main(["keys", "update", key_id, "--rpm", "default", "--max-concurrent", "default"]) == 0
    capsys.readouterr()
    record = _authenticate(database_url, str(created["key"]))
    assert (record.rpm, record.tpm, record.max_concurrent) == (None, None, None)


def test_update_without_a_limit_is_a_usage_error(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = _create_json(capsys, "--rpm", "60")

    with pytest.raises(SystemExit) as exited:
        main(["keys", "update", str(created["id"]), "--json"])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "gateway keys update" in err
    assert "at least one of --name, --models/--all-models, --expires-in/--no-expiry" in err
    assert _authenticate(database_url, str(created["key"])).rpm == 60


def test_update_unknown_id_exits_1(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "update", "0123456789ab", "--rpm", "1"]) == 1

    captured = capsys.readouterr()
    assert "no API key with id '0123456789ab'" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("command", ["create", "update"])
@pytest.mark.parametrize("flag", ["--rpm", "--tpm", "--max-concurrent"])
@pytest.mark.parametrize("value", ["-1", "1.5", "ten", "", " 5", "١٢", "2147483648"])
def test_bad_limits_are_usage_errors(
    database_url: str, capsys: pytest.CaptureFixture[str], command: str, flag: str, value: str
) -> None:
    target = ["--name", "x"] if command == "create" else ["0123456789ab"]

    with pytest.raises(SystemExit) as exited:
        main(["keys", command, *target, f"{flag}={value}"])

    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "value"), [("create", "default"), ("update", "Default"), ("update", "defaults")]
)
def test_default_is_an_update_value_and_spelled_exactly(
    database_url: str, capsys: pytest.CaptureFixture[str], command: str, value: str
) -> None:
    target = ["--name", "x"] if command == "create" else ["0123456789ab"]

    with pytest.raises(SystemExit) as exited:
        main(["keys", command, *target, "--rpm", value])

    assert exited.value.code == 2
    assert "--rpm" in capsys.readouterr().err


def test_largest_limit_is_accepted(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _limits(_create_json(capsys, "--rpm", "2147483647")) == (2147483647, None, None)


def test_list_shows_the_limits(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    limited = _create_json(capsys, "--rpm", "60", "--tpm", "0", "--max-concurrent", "3")
    default = _create_json(capsys)

    assert main(["keys", "list"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert main(["keys", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)

    assert header.split()[:6] == ["ID", "NAME", "MODELS", "RPM", "TPM", "CONCURRENT"]
    cells = {row.split()[0]: row.split()[3:6] for row in rows}
    assert cells == {
        limited["id"]: ["60", "unlimited", "3"],
        default["id"]: ["default", "default", "default"],
    }
    assert [_limits(entry) for entry in listed] == [(60, 0, 3), (None, None, None)]


def test_create_with_manage_models_grants_it(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ordinary = _create_json(capsys)
    manager = _create_json(capsys, "--manage-models")

    assert ordinary["manage_models"] is False
    assert manager["manage_models"] is True
    assert not _authenticate(database_url, str(ordinary["key"])).manage_models
    assert _authenticate(database_url, str(manager["key"])).manage_models
    assert main(["keys", "create", "--name", "ops", "--manage-models"]) == 0
    assert "manage models: yes" in capsys.readouterr().out


def test_update_grants_and_clears_manage_models(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = _create_json(capsys, "--rpm", "60")
    key_id = str(created["id"])

    assert main(["keys", "update", key_id, "--manage-models"]) == 0
    assert capsys.readouterr().out == (
        f"Updated key {key_id} (ci); models: all; expires: never; "
        "limits: rpm 60, tpm default, max concurrent default; "
        "manage models: yes\n"
    )
    granted = _authenticate(database_url, str(created["key"]))
    assert (granted.manage_models, granted.rpm) == (True, 60)

    assert main(["keys", "update", key_id, "--rpm", "5", "--no-manage-models", "--json"]) == 0
    cleared = json.loads(capsys.readouterr().out)
    assert (cleared["manage_models"], cleared["rpm"]) == (False, 5)
    record = _authenticate(database_url, str(created["key"]))
    assert (record.manage_models, record.rpm) == (False, 5)


def test_list_shows_manage_models(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    manager = _create_json(capsys, "--manage-models")
    ordinary = _create_json(capsys)

    assert main(["keys", "list"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert main(["keys", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)

    assert header.split()[5:8] == ["CONCURRENT", "MANAGE", "MODELS"]
    assert {row.split()[0]: row.split()[6] for row in rows} == {
        manager["id"]: "yes",
        ordinary["id"]: "no",
    }
    assert [entry["manage_models"] for entry in listed] == [True, False]


@pytest.mark.parametrize("duration", ["30", "1y", "0d", "-5m", "1.5h", "30 d", "d", "99999999999w"])
def test_bad_expires_in_is_a_usage_error(
    database_url: str, capsys: pytest.CaptureFixture[str], duration: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["keys", "create", "--name", "x", "--expires-in", duration])

    assert exited.value.code == 2
    assert "--expires-in" in capsys.readouterr().err


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("duration", ["90s", "15m", "12h", "30d", "2w"])
def test_documented_durations_are_accepted(
    database_url: str, capsys: pytest.CaptureFixture[str], duration: str
) -> None:
    assert _create_json(capsys, "--expires-in", duration)["expires_at"] is not None


@pytest.mark.parametrize("argv", [["--models", " , "], ["--name", ""]])
def test_bad_create_arguments_are_usage_errors(database_url: str, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["keys", "create", "--name", "x", *argv])

    assert exited.value.code == 2


@pytest.mark.processes
def test_python_dash_m_gateway_runs_the_cli(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    env = {**os.environ, "GATEWAY_DATABASE_URL": url}

    completed = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "create", "--name", "x", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    created = json.loads(completed.stdout)
    assert _authenticate(url, created["key"]).name == "x"
