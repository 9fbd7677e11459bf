"""`gateway keys update|rotate` with the issue-13 flags, and `gateway audit`, run in-process."""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.cli import main
from tests.keys.test_cli_keys import _authenticate, _create_json


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_update_changes_name_models_and_expiry(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    key_id = str(_create_json(capsys, "--models", "a")["id"])

    renamed = _json(capsys, "keys", "update", key_id, "--name", "b", "--all-models", "--json")
    expiring = _json(capsys, "keys", "update", key_id, "--expires-in", "1h", "--json")
    forever = _json(capsys, "keys", "update", key_id, "--no-expiry", "--models", "x,y", "--json")

    assert (renamed["name"], renamed["models"], renamed["expires_at"]) == ("b", None, None)
    expires_at = datetime.fromisoformat(str(expiring["expires_at"]))
    assert timedelta(minutes=59) < expires_at - datetime.now(UTC) <= timedelta(hours=1)
    assert (forever["expires_at"], forever["models"]) == (None, ["x", "y"])


def test_rotate_with_grace_keeps_the_old_key_working(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    created = _create_json(capsys)

    assert main(["keys", "rotate", str(created["id"]), "--grace", "1h"]) == 0

    out = capsys.readouterr().out
    assert "old secret works until" in out
    assert _authenticate(database_url, str(created["key"])).id == created["id"]


@pytest.mark.parametrize("grace", ["31d", "-1h", "soon"])
def test_rotate_refuses_a_bad_grace(
    database_url: str, capsys: pytest.CaptureFixture[str], grace: str
) -> None:
    created = _create_json(capsys)

    with pytest.raises(SystemExit) as exited:
        main(["keys", "rotate", str(created["id"]), "--grace", grace])

    assert exited.value.code == 2
    assert _authenticate(database_url, str(created["key"])).id == created["id"]


def test_audit_lists_cli_actions_by_the_os_user(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    key_id = str(_create_json(capsys)["id"])
    assert main(["keys", "update", key_id, "--rpm", "5"]) == 0
    assert main(["keys", "revoke", key_id]) == 0
    capsys.readouterr()

    entries = _json(capsys, "audit", "--key", key_id, "--json")
    updates = _json(capsys, "audit", "--action", "update", "--json")
    assert main(["audit", "--key", key_id]) == 0
    text = capsys.readouterr().out

    assert [entry["action"] for entry in entries] == ["create", "update", "revoke"]
    assert {entry["actor"] for entry in entries} == {f"cli:{getpass.getuser()}"}
    assert entries[1]["changes"] == {"rpm": {"before": None, "after": 5}}
    assert [entry["key_id"] for entry in updates] == [key_id]
    assert f"update {key_id}  rpm: null -> 5" in text


def test_audit_with_no_match_says_so(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--since", "2999-01-01"]) == 0

    assert capsys.readouterr().out == "No audit entries match.\n"
