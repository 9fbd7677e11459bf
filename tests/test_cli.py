"""The `gateway` command's serve entry: one worker per process is the only way to run it."""

from __future__ import annotations

import pytest

from gateway.cli import main


def test_serve_offers_no_workers_option(capsys: pytest.CaptureFixture[str]):
    """Metrics and in-process limits live in the process: scale with processes, not workers."""
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--workers", "2"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --workers" in capsys.readouterr().err


def test_serve_rejects_a_bad_port(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["serve", "--port", "70000"])
    assert "invalid port" in capsys.readouterr().err


def test_invalid_configuration_is_reported_not_raised(monkeypatch, capsys):
    monkeypatch.setenv("GATEWAY_FIRST_BYTE_TIMEOUT", "-1")
    assert main(["keys", "list"]) == 2
    assert "invalid configuration" in capsys.readouterr().err
