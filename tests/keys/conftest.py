"""Fixtures of the key tests: a key store the `gateway keys` commands find."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def database_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A SQLite key store in `tmp_path`, set as `GATEWAY_DATABASE_URL`, the test run there."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    monkeypatch.setenv("GATEWAY_DATABASE_URL", url)
    # Settings also reads ./.env; keep a developer's .env out of the tests.
    monkeypatch.chdir(tmp_path)
    return url
