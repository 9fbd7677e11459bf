"""`gateway admin token` run in-process through `gateway.cli.main`."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from gateway.auth.jwt import AdminTokenVerifier
from gateway.cli import main
from gateway.settings import Settings

SECRET = secrets.token_urlsafe(48)


@pytest.fixture
def secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GATEWAY_ADMIN_JWT_SECRET", SECRET)
    monkeypatch.chdir(tmp_path)  # Settings also reads ./.env; keep a developer's out
    return SECRET


def _claims(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    return claims


async def _verify(token: str) -> Any:
    verifier = AdminTokenVerifier.from_settings(Settings(_env_file=None, admin_jwt_secret=SECRET))
    assert verifier is not None
    return await verifier.verify(token)


@pytest.mark.anyio
async def test_token_prints_only_a_token_the_gateway_accepts(
    secret: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    assert main(["admin", "token", "--scope", "admin"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert out == token + "\n"
    assert token.count(".") == 2
    identity = await _verify(token)
    assert identity.subject == "token:alice"
    assert identity.scopes == {"admin", "read"}
    claims = _claims(token)
    assert claims["exp"] - claims["iat"] == 15 * 60  # the default ttl
    assert "token:alice" in err
    assert "scope admin" in err
    assert secret not in out + err


@pytest.mark.anyio
async def test_token_takes_a_subject_a_read_scope_and_a_ttl(
    secret: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["admin", "token", "--scope", "read", "--ttl", "24h", "--subject", "ci"]) == 0
    token = capsys.readouterr().out.strip()
    identity = await _verify(token)
    assert (identity.subject, identity.scopes) == ("ci", {"read"})
    claims = _claims(token)
    assert claims["exp"] - claims["iat"] == 24 * 3600


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scope", "admin", "--ttl", "25h"], "over 24h"),
        (["--scope", "admin", "--ttl", "2d"], "over 24h"),
        (["--scope", "admin", "--ttl", "15"], "invalid duration"),
        (["--scope", "root"], "invalid choice"),
        (["--ttl", "15m"], "--scope"),
        (["--scope", "read", "--subject", "a\nb"], "printable"),
        (["--scope", "read", "--subject", " "], "printable"),
    ],
)
def test_token_refuses_bad_arguments_as_a_usage_error(
    secret: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["admin", "token", *args])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err


def test_token_is_refused_without_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_ADMIN_JWT_SECRET", raising=False)
    assert main(["admin", "token", "--scope", "admin"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "GATEWAY_ADMIN_JWT_SECRET is not set" in err
    assert "secrets.token_urlsafe(48)" in err


def test_a_weak_secret_stops_the_command_without_showing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    weak = "changeme-changeme-changeme-changeme"
    monkeypatch.setenv("GATEWAY_ADMIN_JWT_SECRET", weak)
    assert main(["admin", "token", "--scope", "admin"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "GATEWAY_ADMIN_JWT_SECRET is too weak" in err
    assert weak not in err
