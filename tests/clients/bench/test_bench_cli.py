"""`gateway bench run|compare|report` end to end over loopback: the emulator, a real gateway.

Each run is tiny (a few requests of a few tokens); what is checked is the job's behaviour: the
run document saved and its sources, the key's handling, the errors a user meets first
(unreachable target, refused key, bad workload), and the three commands working together.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.clients.bench.cli import KEY_ENV, _save, main
from gateway.testing.stack import free_port
from tests.support.stack import Emulator, Gateway

FAST = {"ttft": 0.01, "inter_token": 0.002, "tokens": 6}


def _fast(emulator: Emulator) -> str:
    for name, value in FAST.items():
        setattr(emulator.config, name, value)
    return emulator.config.models[0]


def _run(tmp_path: Path, *args: str) -> tuple[int, dict | None]:
    out = tmp_path / "run.json"
    code = main(["run", *args, "--no-gpu", "--out", str(out)])
    return code, json.loads(out.read_text()) if out.exists() else None


def test_sweep_against_ollama_saves_the_run_with_server_counts(emulator, tmp_path, capsys):
    model = _fast(emulator)
    code, doc = _run(
        tmp_path, "--target", emulator.url, "--model", model, "--concurrency", "1,2",
        "--requests", "6", "--warmup", "1",
    )  # fmt: skip
    assert code == 0
    assert doc is not None
    assert doc["schema"] == "gateway-bench/1"
    assert doc["parameters"]["api"] == "ollama"
    assert doc["parameters"]["through_gateway"] is False
    (entry,) = doc["models"]
    assert [p["level"] for p in entry["points"]] == [1, 2]
    repeat = entry["points"][1]["repeats"][0]
    assert repeat["requests"] == 6
    assert repeat["errors"] == 0
    assert repeat["sources"]["output_tokens"] == "ollama"
    assert repeat["metrics"]["output_tokens"]["p50"] == FAST["tokens"]
    assert entry["size"]["disk_bytes"] is not None  # /api/tags
    built = doc["fingerprint"]["models"][model]
    assert built["digest"] == entry["server"]["digest"]
    assert built["digest"] is not None
    assert built["quantization"] is not None
    assert doc["fingerprint"]["runtime"]["version"] == emulator.config.version
    printed = capsys.readouterr()
    assert model in printed.out
    assert "TTFT" in printed.out


def test_openai_api_counts_come_from_usage(emulator, tmp_path):
    model = _fast(emulator)
    code, doc = _run(
        tmp_path, "--target", emulator.url, "--api", "openai", "--model", model,
        "--requests", "3", "--warmup", "0",
    )  # fmt: skip
    assert code == 0
    assert doc is not None
    repeat = doc["models"][0]["points"][0]["repeats"][0]
    assert repeat["sources"]["output_tokens"] == "openai.usage"
    assert repeat["metrics"]["output_tokens"]["p50"] == FAST["tokens"]


def test_through_the_gateway_the_key_comes_from_the_environment(
    gateway: Gateway, emulator, tmp_path, monkeypatch
):
    model = _fast(emulator)
    monkeypatch.setenv(KEY_ENV, gateway.key)
    code, doc = _run(tmp_path, "--target", gateway.url, "--model", model, "--requests", "3")
    assert code == 0
    assert doc is not None
    assert doc["parameters"]["through_gateway"] is True
    assert doc["fingerprint"]["gateway"]["through"] is True
    saved = (tmp_path / "run.json").read_text()
    assert gateway.key not in saved
    rows = [r for r in doc["models"][0]["resources"]["timeline"] if r["source"] == "gateway"]
    assert rows, "the gateway's /metrics is sampled on the timeline"


def test_a_refused_key_is_named_and_not_echoed(gateway: Gateway, emulator, tmp_path, capsys):
    model = _fast(emulator)
    key_file = tmp_path / "key"
    key_file.write_text("gw_wrong_key_that_must_not_be_printed\n")
    code, doc = _run(
        tmp_path, "--target", gateway.url, "--model", model, "--requests", "1",
        "--key-file", str(key_file),
    )  # fmt: skip
    assert code == 1
    assert doc is None
    err = capsys.readouterr().err
    assert "401" in err
    assert KEY_ENV in err
    assert "gw_wrong_key" not in err


def test_an_unreachable_target_is_a_clear_error(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, doc = _run(tmp_path, "--target", url, "--model", "m", "--requests", "1")
    assert code == 1
    assert doc is None
    assert "cannot reach" in capsys.readouterr().err


def test_an_unknown_model_is_a_clear_error(emulator, tmp_path, capsys):
    _fast(emulator)
    code, _ = _run(tmp_path, "--target", emulator.url, "--model", "nope:1b", "--requests", "1")
    assert code == 1
    assert "nope:1b" in capsys.readouterr().err


def test_a_bad_workload_line_is_named(emulator, tmp_path, capsys):
    model = _fast(emulator)
    workload = tmp_path / "prompts.jsonl"
    workload.write_text('{"prompt": "fine"}\n{"prompt": \n')
    code, _ = _run(
        tmp_path, "--target", emulator.url, "--model", model, "--requests", "1",
        "--workload", str(workload),
    )  # fmt: skip
    assert code == 2
    assert f"{workload}:2" in capsys.readouterr().err


def test_compare_and_report_read_saved_runs(emulator, tmp_path, capsys):
    model = _fast(emulator)
    code, doc = _run(
        tmp_path, "--target", emulator.url, "--model", model, "--requests", "4", "--repeat", "2",
    )  # fmt: skip
    assert code == 0
    assert doc is not None
    run = str(tmp_path / "run.json")
    capsys.readouterr()
    assert main(["compare", run, run]) == 0
    assert main(["report", run, "--format", "csv"]) == 0
    csv_text = capsys.readouterr().out
    assert model in csv_text


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_the_installed_command_runs_a_benchmark(emulator, tmp_path):
    model = _fast(emulator)
    out = tmp_path / "run.json"
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-m", "gateway", "bench", "run", "--target", emulator.url,
         "--model", model, "--requests", "2", "--no-gpu", "--out", str(out), "--format", "md"],
        capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.exists()
    assert "|" in done.stdout  # a Markdown table


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_answers_without_tokens_fail_as_empty_answers(emulator, tmp_path):
    model = _fast(emulator)
    emulator.config.tokens = 0  # like llama-cpp-python cutting a running answer short
    code, _ = _run(tmp_path, "--target", emulator.url, "--model", model, "--requests", "2")
    assert code == 1  # no request succeeded: an empty answer measures nothing
    assert "empty answer" in (tmp_path / "run.json").read_text()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_key_the_server_echoes_is_redacted_everywhere(emulator, tmp_path, monkeypatch, capsys):
    model = _fast(emulator)
    key = "gw_echoed_" + "k" * 30
    monkeypatch.setenv(KEY_ENV, key)
    emulator.config.fault = "status_before"
    emulator.config.fault_message = f"bad header: Bearer {key}"
    code, _ = _run(tmp_path, "--target", emulator.url, "--model", model, "--requests", "2")
    assert code == 1  # no request succeeded
    saved = (tmp_path / "run.json").read_text()
    printed = capsys.readouterr()
    assert key not in saved
    assert key not in printed.out + printed.err
    assert "[key redacted]" in saved


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("pad", [163, 180])
def test_an_echoed_key_cut_short_is_redacted_too(emulator, tmp_path, monkeypatch, capsys, pad):
    model = _fast(emulator)
    key = "gw_SECRETKEY0123456789abcdef"
    monkeypatch.setenv(KEY_ENV, key)
    emulator.config.fault = "status_before"
    # The 200-character cut of the error text falls inside the key.
    emulator.config.fault_message = "p" * pad + key
    code, _ = _run(tmp_path, "--target", emulator.url, "--model", model, "--requests", "2")
    assert code == 1
    saved = (tmp_path / "run.json").read_text()
    printed = capsys.readouterr()
    for shown in (saved, printed.out, printed.err):
        assert key[:8] not in shown
    assert "[key" in saved  # the mark itself may be cut


def test_a_target_with_credentials_or_a_control_character_key_is_refused(
    emulator, tmp_path, monkeypatch, capsys
):
    code, _ = _run(tmp_path, "--target", "http://user:pw@127.0.0.1:1", "--model", "m")
    assert code == 2
    assert "user or password" in capsys.readouterr().err
    monkeypatch.setenv(KEY_ENV, "gw_abc\x1b[2J")
    code, _ = _run(tmp_path, "--target", emulator.url, "--model", "m")
    assert code == 2  # a malformed key is a usage error, as a bad key file is
    assert "control character" in capsys.readouterr().err


def test_the_run_document_is_strict_json(tmp_path):
    doc = {"created": "2026-01-01T00:00:00Z", "rate": float("inf"), "spread": [float("nan"), 1.5]}
    path = _save(doc, tmp_path / "run.json")

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    saved = json.loads(path.read_text(), parse_constant=refuse)
    assert saved == {"created": "2026-01-01T00:00:00Z", "rate": None, "spread": [None, 1.5]}


def test_the_run_document_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "run.json"
    link.symlink_to(victim)
    _save({"created": "2026-01-01T00:00:00Z"}, link)
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink()
    assert json.loads(link.read_text()) == {"created": "2026-01-01T00:00:00Z"}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("option", ["--key", "--key=", "--key-f", "--ke"])
def test_a_key_on_the_command_line_is_refused_and_not_echoed(tmp_path, capsys, option):
    key = "gw_TOPSECRET123"
    args = [option + key] if option.endswith("=") else [option, key]
    with pytest.raises(SystemExit) as stopped:
        main(["run", *args, "--model", "m", "--no-save"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    if option in ("--key", "--key="):
        assert key not in err
        assert "the key is never an argument" in err
    else:  # no prefix is taken for --key-file (that one echoed the key as a path)
        assert "unrecognized arguments" in err


def test_an_out_path_that_cannot_be_written_is_refused_before_anything_is_sent(
    emulator, tmp_path, capsys
):
    model = _fast(emulator)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "run.json"  # its directory is a file: cannot be made
    code = main(
        ["run", "--target", emulator.url, "--model", model, "--requests", "2", "--out", str(out)]
    )
    assert code == 2
    assert "--out" in capsys.readouterr().err
    assert [r for r in emulator.state.records if r.method == "POST"] == []


def test_a_run_whose_document_cannot_be_saved_still_prints_its_report(
    emulator, tmp_path, capsys, monkeypatch
):
    model = _fast(emulator)

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gateway.clients.bench.plots.replace_file", disk_full)
    code = main(
        ["run", "--target", emulator.url, "--model", model, "--requests", "2", "--no-gpu",
         "--out", str(tmp_path / "run.json")]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    assert "could not save" in captured.err
    assert "No space left on device" in captured.err
    assert "TTFT" in captured.out  # what was measured is not lost


def test_a_missing_key_file_is_a_usage_error_that_says_so(tmp_path, capsys):
    missing = tmp_path / "nope.txt"
    code = main(["run", "--target", "http://127.0.0.1:1", "--api", "ollama", "--model", "m",
                 "--key-file", str(missing), "--no-save"])  # fmt: skip
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_target_without_a_scheme_is_shown_as_typed(capsys):
    code = main(["run", "--target", "127.0.0.1:18436", "--model", "m", "--no-save"])
    assert code == 2
    assert "'127.0.0.1:18436'" in capsys.readouterr().err


def test_knee_only_options_without_knee_are_refused(capsys):
    code = main(["run", "--target", "http://127.0.0.1:1", "--api", "ollama", "--model", "m",
                 "--max-concurrency", "8", "--no-save"])  # fmt: skip
    assert code == 2
    assert "--max-concurrency applies only with --knee" in capsys.readouterr().err


def test_dataset_lengths_on_the_builtin_workload_are_refused(tmp_path, capsys) -> None:
    # The suites record no answer lengths: the run would silently use --max-tokens instead.
    code = main(
        ["run", "--target", "http://127.0.0.1:9", "--api", "ollama", "--models", "m",
         "--workload", "builtin",
         "--output-tokens", "dataset", "--no-gpu", "--out", str(tmp_path / "r.json")]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "the builtin workload has no data set lengths" in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("surface", ["responses", "messages"])
def test_an_agent_surface_the_server_lacks_gets_a_hint(emulator, tmp_path, capsys, surface):
    # The emulator, like most engines, answers /v1/responses and /v1/messages 404.
    model = _fast(emulator)
    code, _ = _run(
        tmp_path, "--target", emulator.url, "--model", model, "--endpoint", surface,
        "--concurrency", "1", "--requests", "2",
    )  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "no request succeeded" in err
    assert f"HTTP 404 on /v1/{surface}: the server may not serve that path" in err
    assert "gateway serve" in err


RUN = ["run", "--target", "http://127.0.0.1:1", "--api", "ollama", "--model", "m", "--no-save"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--rate", "nan"], "levels must be positive numbers"),
        (["--rate", "inf"], "levels must be positive numbers"),
        (["--rate", "200000"], "rates must be at most 100000/s"),
        (["--knee", "--max-rate", "inf"], "must be a positive number"),
        (["--sample-interval", "0.001"], "must be at least 0.05 s"),
        (["--concurrency", "nan"], "levels must be positive numbers"),
    ],
)
def test_rates_and_intervals_that_cannot_be_kept_are_usage_errors(capsys, options, said):
    with pytest.raises(SystemExit) as stopped:
        main([*RUN, *options])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--rate", "0.05", "--duration", "2"], "sends under one request in --duration 2 s"),
        (["--concurrency", "100000000"], "connections need more open files"),
        (["--size", "m=" + "9" * 400 + "GB"], "larger than any model"),
    ],
)
def test_plans_the_client_cannot_run_exit_2_with_a_reason(capsys, options, said):
    assert main([*RUN, *options]) == 2
    err = capsys.readouterr().err
    assert said in err
    assert "Traceback" not in err
