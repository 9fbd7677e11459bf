"""The client commands' key: a file's first line or a variable, never a malformed header."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import build_parser
from gateway.clients.keyfile import KEY_FILE_MAX, KeyInputError, read_client_key, redact_key


def test_the_first_line_of_the_file_or_the_variable(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "key"
    path.write_text("  gw_abc_def  \nsecond line\n")
    assert read_client_key(path, "UNUSED_VARIABLE") == "gw_abc_def"
    monkeypatch.setenv("SOME_KEY_VARIABLE", " gw_from_env ")
    assert read_client_key(None, "SOME_KEY_VARIABLE") == "gw_from_env"
    monkeypatch.delenv("SOME_KEY_VARIABLE")
    assert read_client_key(None, "SOME_KEY_VARIABLE") == ""


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\xff\xfe", "not UTF-8"),
        (b"x" * (KEY_FILE_MAX + 1), "no key file?"),
        (b"gw_a\x1b[2Jb", "control character"),
    ],
)
def test_a_wrong_file_is_refused_with_a_reason(tmp_path: Path, content: bytes, message: str):
    path = tmp_path / "key"
    path.write_bytes(content)
    with pytest.raises(KeyInputError, match=message):
        read_client_key(path, "UNUSED_VARIABLE")


def test_a_directory_is_not_a_key_file(tmp_path: Path) -> None:
    with pytest.raises(KeyInputError, match="not a regular file"):
        read_client_key(tmp_path, "UNUSED_VARIABLE")


KEY = "gw_SECRETKEY0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"echo {KEY} twice {KEY}", "echo [key redacted] twice [key redacted]"),
        (f"cut here: {KEY[:20]}", "cut here: [key redacted]"),  # a cut ended the text
        (f"a: {KEY[:9]}…, b: {KEY[:15]}…", "a: [key redacted]…, b: [key redacted]…"),
        (f"short: {KEY[:7]}", f"short: {KEY[:7]}"),  # too little of the key to matter
        (f"not at a cut: {KEY[:20]} more", f"not at a cut: {KEY[:20]} more"),
        ("nothing here…", "nothing here…"),
    ],
)
def test_redact_key_replaces_the_key_and_any_start_a_cut_left(text: str, expected: str) -> None:
    assert redact_key(text, KEY) == expected
    assert redact_key(text, None) == redact_key(text, "") == text


def test_a_path_that_looks_like_a_key_is_not_echoed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyInputError, match="looks like a key itself") as caught:
        read_client_key(Path("gw_TOPSECRET123"), "UNUSED_VARIABLE")
    assert "TOPSECRET" not in str(caught.value)


def test_a_key_file_others_can_read_is_read_with_a_warning(tmp_path: Path, capsys) -> None:
    path = tmp_path / "key"
    path.write_text("gw_abc\n")
    path.chmod(0o600)
    assert read_client_key(path, "UNUSED_VARIABLE") == "gw_abc"
    assert capsys.readouterr().err == ""
    path.chmod(0o644)
    assert read_client_key(path, "UNUSED_VARIABLE") == "gw_abc"
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "readable by others" in err


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("command", [["batch", "list"], ["bench", "run", "--model", "m"]])
def test_no_client_command_takes_a_prefix_of_key_file(command: list[str], capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--key-fi", "gw_TOPSECRET123"])
    assert "unrecognized arguments" in capsys.readouterr().err
