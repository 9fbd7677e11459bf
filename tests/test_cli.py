"""The `gateway` command's serve entry: one worker per process is the only way to run it."""

from __future__ import annotations

import pytest

from gateway.cli import main


def test_serve_rejects_a_bad_worker_count(capsys: pytest.CaptureFixture[str]):
    """`--workers` takes 1 or more, or auto (tests/serve/test_workers.py runs the workers)."""
    for bad in ("0", "two", "-1"):
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--workers", bad])
        assert exit_info.value.code == 2
        assert "invalid worker count" in capsys.readouterr().err


def test_serve_rejects_a_bad_port(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["serve", "--port", "70000"])
    assert "invalid port" in capsys.readouterr().err


def test_invalid_configuration_is_reported_not_raised(monkeypatch, capsys):
    monkeypatch.setenv("GATEWAY_FIRST_BYTE_TIMEOUT", "-1")
    assert main(["keys", "list"]) == 2
    assert "invalid configuration" in capsys.readouterr().err
