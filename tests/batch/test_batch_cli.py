"""`gateway batch ...` in-process against a real gateway (in front of the emulator)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.clients.batch_cli import wait_for
from tests.support.client import MODEL_ALIAS as MODEL
from tests.support.stack import Gateway

FAST = {"batch_poll_seconds": 0.1, "batch_retry_base_seconds": 0.05, "batch_lease_seconds": 3}


@pytest.fixture
def gw(make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch) -> Gateway:
    gateway = make_gateway(**FAST)
    monkeypatch.setenv("GATEWAY_API_KEY", gateway.key)
    return gateway


def _input(tmp_path: Path, ids: list[str]) -> Path:
    path = tmp_path / "in.jsonl"
    lines = [
        json.dumps(
            {
                "custom_id": cid,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            }
        )
        for cid in ids
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _submit(gw: Gateway, path: Path, *extra: str) -> int:
    endpoint = ["--endpoint", "/v1/chat/completions"]
    return main(["batch", "submit", str(path), "--url", gw.url, *endpoint, *extra])


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_submit_wait_completes_and_download_writes_every_custom_id(
    gw: Gateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [f"req-{i}" for i in range(6)]
    code = _submit(gw, _input(tmp_path, ids), "--wait", "--poll", "0.1", "--metadata", "job=x")
    out, err = capsys.readouterr()
    assert code == 0, err
    batch_id = out.strip()
    assert batch_id.startswith("batch_")
    assert "completed: 6 done, 0 failed, 6 total" in err
    assert gw.key not in out + err

    assert main(["batch", "download", batch_id, "--url", gw.url, "--out", str(tmp_path)]) == 0
    output = tmp_path / f"{batch_id}_output.jsonl"
    found = [json.loads(x)["custom_id"] for x in output.read_text().splitlines()]
    assert sorted(found) == sorted(ids)
    assert not (tmp_path / f"{batch_id}_error.jsonl").exists()  # nothing failed

    capsys.readouterr()
    assert main(["batch", "show", batch_id, "--url", gw.url]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "completed"
    assert shown["metadata"] == {"job": "x"}
    assert shown["request_counts"] == {"total": 6, "completed": 6, "failed": 0}

    assert main(["batch", "show", batch_id, "--log", "--url", gw.url]) == 0
    events = [e["event"] for e in json.loads(capsys.readouterr().out)["data"]]
    assert events[0] == "created"
    assert events[-1] == "completed"

    assert main(["batch", "list", "--url", gw.url, "--limit", "5"]) == 0
    listed = capsys.readouterr().out
    assert batch_id in listed
    assert "completed" in listed


def test_cancel_and_a_failed_validation(
    gw: Gateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _submit(gw, _input(tmp_path, [f"c-{i}" for i in range(50)])) == 0
    batch_id = capsys.readouterr().out.strip()
    assert main(["batch", "cancel", batch_id, "--url", gw.url]) == 0
    out = capsys.readouterr().out
    assert out.startswith(batch_id)
    assert out.split()[1] in ("cancelling", "cancelled", "completed")

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert _submit(gw, bad, "--wait", "--poll", "0.1") == 1
    err = capsys.readouterr().err
    assert "line 1: invalid_json_line" in err


def test_a_bad_key_exits_2_with_the_servers_message(
    gw: Gateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("gw-not-a-real-key\n")
    key_file.chmod(0o600)  # a key others can read is read with a warning
    code = main(["batch", "list", "--url", gw.url, "--key-file", str(key_file)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("gateway batch: GET /v1/batches: HTTP 401: ")
    assert len(err.strip().splitlines()) == 1
    assert "gw-not-a-real-key" not in err


def test_no_key_and_an_unknown_batch_exit_2(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["batch", "show", "batch_nope", "--url", gw.url]) == 2
    assert "No such Batch object: batch_nope" in capsys.readouterr().err
    monkeypatch.delenv("GATEWAY_API_KEY")
    assert main(["batch", "list", "--url", gw.url]) == 2
    assert "GATEWAY_API_KEY" in capsys.readouterr().err


class _FakeApi:
    def __init__(self, states: list[dict[str, object]]) -> None:
        self.states = states

    def json(self, method: str, path: str, **kwargs: object) -> dict[str, object]:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _state(status: str, done: int) -> dict[str, object]:
    return {"status": status, "request_counts": {"total": 4, "completed": done, "failed": 0}}


def test_progress_is_redrawn_on_a_tty_and_one_line_each_few_seconds_otherwise() -> None:
    states = [_state("in_progress", 0), _state("in_progress", 2), _state("completed", 4)]
    tty = _Tty()
    ended = wait_for(_FakeApi(list(states)), "b", poll=0, stderr=tty)  # type: ignore[arg-type]
    assert ended["status"] == "completed"
    assert tty.getvalue().count("\r") == 3
    assert "ETA" in tty.getvalue()
    plain = io.StringIO()
    wait_for(_FakeApi(list(states)), "b", poll=0, stderr=plain, every=3600)  # type: ignore[arg-type]
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2  # the first look, then the end
    assert "\r" not in plain.getvalue()
    assert lines[-1].startswith("completed: 4 done, 0 failed, 4 total, ")


def test_the_cli_loads_no_gateway_settings(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GATEWAY_PORT", "not-a-port")  # would make Settings() fail
    assert main(["batch", "list", "--url", gw.url]) == 0
