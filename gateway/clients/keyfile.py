"""The API key of the client-side commands (`gateway bench`, `gateway batch`).

A key is never an argument (it would show in `ps` and the shell history): it comes from the
first line of a `--key-file`, or from an environment variable. Nothing here does network I/O.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: The largest key file read, in bytes: a key is about 60 characters, so a bigger file is
#: the wrong file (and is not read whole).
KEY_FILE_MAX = 4096
#: How the gateway's keys start (`gateway.keys.apikey`).
KEY_PREFIX = "gw_"
#: What stands where a key (or the start of one) was.
REDACTED = "[key redacted]"
#: The shortest start of a key redacted where a cut ended text (`redact_key`): shorter ones
#: show too little of the key to matter and would turn up in ordinary text.
KEY_PREFIX_MIN = 8
#: The mark a cut leaves (`gateway.clients.bench.stats.escape_error`).
_CUT = "\u2026"


class KeyInputError(ValueError):
    """The key file or variable cannot give a key; the message names which and why."""


def redact_key(text: str, key: str | None) -> str:
    """`text` with every copy of `key` replaced by `REDACTED`, and any start of it a cut left.

    Server text (an error body quoting the `Authorization` header) is cut short before it is
    shown, and a cut through the key leaves its first characters: a start of the key of at
    least `KEY_PREFIX_MIN` characters that ends `text` or stands before a cut mark (`…`) is
    redacted too. Returns `text` unchanged when `key` is empty or None.
    """
    if not key:
        return text
    text = text.replace(key, REDACTED)
    if len(key) <= KEY_PREFIX_MIN:
        return text
    ends = [i for i, c in enumerate(text) if c == _CUT] + [len(text)]
    pieces: list[str] = []
    done = 0
    for end in ends:
        longest = min(len(key) - 1, end - done)
        for size in range(longest, KEY_PREFIX_MIN - 1, -1):
            if text.endswith(key[:size], done, end):
                pieces += [text[done : end - size], REDACTED]
                done = end
                break
    return "".join(pieces) + text[done:]


def read_client_key(key_file: Path | None, env: str) -> str:
    """The key from `key_file` (its first line, stripped), else from `$env`; "" if unset.

    Args:
        key_file: `--key-file`, or None to read the variable.
        env: The variable's name, e.g. `GATEWAY_API_KEY`.

    Raises:
        KeyInputError: the file is no regular file, cannot be read, is over `KEY_FILE_MAX`
            bytes, is not UTF-8 or is empty; or the key holds a control character (it would
            break the `Authorization` header line). A path that looks like a key (`gw_...`)
            is never shown in the message.

    A key file readable by group or others is read, with a one-line warning on stderr.
    """
    if key_file is not None:
        # A key passed where the path goes (`--key gw_...` once matched `--key-file`) must not
        # be echoed back in the error.
        looks_like_key = key_file.name.startswith(KEY_PREFIX)
        shown = (
            "--key-file (a path that looks like a key)"
            if looks_like_key
            else f"--key-file {key_file}"
        )
        try:
            if not key_file.is_file():
                if looks_like_key:
                    raise KeyInputError(
                        "the key file given looks like a key itself: pass a file's path"
                    )
                what = "is not a regular file" if key_file.exists() else "does not exist"
                raise KeyInputError(f"{shown} {what}")
            with key_file.open("rb") as handle:
                mode = os.fstat(handle.fileno()).st_mode
                raw = handle.read(KEY_FILE_MAX + 1)
        except OSError as exc:
            raise KeyInputError(f"cannot read {shown}: {exc.strerror}") from None
        if mode & 0o077:
            # Not an error: the key may be meant for a group; but say so, once.
            sys.stderr.write(f"warning: {shown} is readable by others than its owner (chmod 600)\n")
        if len(raw) > KEY_FILE_MAX:
            raise KeyInputError(f"{shown} is over {KEY_FILE_MAX} bytes: no key file?")
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise KeyInputError(f"{shown} is not UTF-8 text") from None
        if not text:
            raise KeyInputError(f"{shown} is empty")
        key = text.splitlines()[0].strip()
    else:
        key = os.environ.get(env, "").strip()
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
        raise KeyInputError("the key holds a control character; check the key file or variable")
    return key
