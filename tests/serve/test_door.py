"""The smaller holes of the door: forged log lines, repeated credentials, the key file's mode,
the client address in the access log, `/v1/models` served without an upstream call per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.keys.store import KeyStore
from gateway.serve.logs import EscapingFormatter, escape_text
from gateway.settings import Settings
from gateway.testing.stack import create_key, gateway_process
from gateway.wire.address import client_address
from tests.support.client import MODEL
from tests.support.stack import Emulator, Gateway

# --- escaped logs -----------------------------------------------------------------------------


def test_escape_text_leaves_one_printable_line() -> None:
    forged = 'x\n{"request_id":"fake"}\r\x1b[2J\x85\u2028end'
    escaped = escape_text(forged)
    assert escaped == 'x\\x0a{"request_id":"fake"}\\x0d\\x1b[2J\\x85\\u2028end'
    assert escaped.isprintable()
    assert escape_text("plain text, ünïcode 中文") == "plain text, ünïcode 中文"


def test_the_formatter_escapes_arguments_but_keeps_tracebacks() -> None:
    formatter = EscapingFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "gateway.relay",
            logging.WARNING,
            __file__,
            1,
            "upstream said: %s",
            ("model 'a\nINFO forged'",),
            exc_info=sys.exc_info(),
        )
    line = formatter.format(record)
    first, _, rest = line.partition("\n")
    assert first == "WARNING upstream said: model 'a\\x0aINFO forged'"
    assert rest.startswith("Traceback")  # Python's own text keeps its lines


@pytest.mark.processes
def test_an_upstream_echo_of_a_hostile_model_name_writes_one_log_line(
    tmp_path: Path, emulator: Emulator
) -> None:
    """A model name with a newline, a JSON line and an escape sequence, echoed by the upstream's
    "model not found", stays inside one line of the real server's log."""
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/keys.db",
        # The upstream's message is logged at debug level only (it may echo the prompt).
        "GATEWAY_LOG_LEVEL": "debug",
    }
    key = str(create_key(env, "app")["key"])
    hostile = 'nope\n{"request_id":"forged","status":200}\n\x1b[31mred'
    with gateway_process(tmp_path, env) as process:
        answer = httpx.post(
            f"{process.url}/v1/generate",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": hostile, "prompt": "hi", "stream": False},
            timeout=10,
        )
        assert answer.status_code == 404
        process.stop()
        log = process.log_tail(200)
    assert "forged" in log  # the upstream's message was logged ...
    assert "\x1b" not in log  # ... with no raw escape byte
    for line in log.splitlines():  # ... and no line of it starts a fake entry
        assert not line.startswith('{"request_id":"forged"')
    access = [
        json.loads(line.split(" gateway.access ", 1)[1])
        for line in log.splitlines()
        if " gateway.access " in line
    ]
    assert [entry["status"] for entry in access if entry["route"] == "/v1/generate"] == [404]
    assert all(entry["client"] == "127.0.0.1" for entry in access)


#: Characters that make a log line read other than it is, each with the escape written instead:
#: bidi embeddings, overrides and isolates, zero-width characters, the byte-order mark, other
#: format characters (soft hyphen, Arabic letter mark, a tag character), separators, C1 controls.
INVISIBLE = {
    "\u202a": "\\u202a",
    "\u202e": "\\u202e",
    "\u2066": "\\u2066",
    "\u2069": "\\u2069",
    "\u200b": "\\u200b",
    "\u200d": "\\u200d",
    "\u200f": "\\u200f",
    "\u2060": "\\u2060",
    "\ufeff": "\\ufeff",
    "\u00ad": "\\xad",
    "\u061c": "\\u061c",
    "\U000e0041": "\\U000e0041",
    "\u2028": "\\u2028",
    "\u0085": "\\x85",
    "\u00a0": "\\xa0",
}


def test_escape_text_escapes_invisible_and_format_characters() -> None:
    for char, escape in INVISIBLE.items():
        assert escape_text(f"a{char}b") == f"a{escape}b"
    hostile = "invoice\u202efdp.exe\u200b\ufeff"
    assert escape_text(hostile) == "invoice\\u202efdp.exe\\u200b\\ufeff"
    assert escape_text("\ud800") == "\\ud800"  # a lone surrogate: not even writable as UTF-8
    assert escape_text("emoji 🦙 and 中文 stay") == "emoji 🦙 and 中文 stay"


def test_the_formatter_escapes_the_text_inside_a_traceback() -> None:
    formatter = EscapingFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError("model 'a\u202eb\u200b' is \x1b[31mred")
    except ValueError:
        record = logging.LogRecord(
            "gateway", logging.ERROR, __file__, 1, "failed", (), exc_info=sys.exc_info()
        )
    line = formatter.format(record)
    assert line.splitlines()[-1] == "ValueError: model 'a\\u202eb\\u200b' is \\x1b[31mred"
    assert all(part.isprintable() for part in line.splitlines())


@pytest.mark.processes
@pytest.mark.parametrize("path", ["/api/generate", "/v1/chat/completions"])
def test_invisible_characters_in_a_model_name_are_escaped_in_the_real_log(
    tmp_path: Path, emulator: Emulator, path: str
) -> None:
    """The upstream's "model not found" echoes the model name into a warning line: every
    invisible character in it is written as its escape, on both surfaces."""
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/keys.db",
        # The upstream's message is logged at debug level only (it may echo the prompt).
        "GATEWAY_LOG_LEVEL": "debug",
    }
    key = str(create_key(env, "app")["key"])
    model = "marker-" + "-".join(INVISIBLE) + "-end"
    body: dict[str, object] = {"model": model, "stream": False}
    body |= (
        {"prompt": "hi"}
        if path.startswith("/api")
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    with gateway_process(tmp_path, env) as process:
        answer = httpx.post(
            f"{process.url}{path}",
            headers={"Authorization": f"Bearer {key}"},
            json=body,
            timeout=10,
        )
        assert answer.status_code == 404, answer.text
        process.stop()
        log = process.log_tail(200)
    echoed = [line for line in log.splitlines() if "marker-" in line and "not found" in line]
    assert echoed, log  # the upstream's message was logged ...
    assert "marker-" + "-".join(INVISIBLE.values()) + "-end" in echoed[0]  # ... escaped
    for char in INVISIBLE:
        assert char not in log, f"U+{ord(char):04X} reached the log raw"
    assert all(line.isprintable() for line in log.splitlines())


# --- the client address --------------------------------------------------------------------


def _scope(peer: str, forwarded: str | None = None) -> dict[str, object]:
    headers = [] if forwarded is None else [(b"x-forwarded-for", forwarded.encode())]
    return {"client": (peer, 1234), "headers": headers}


def test_client_address_believes_only_trusted_proxies() -> None:
    trusted = Settings(trusted_proxies=["10.0.0.0/8", "::1"]).trusted_proxy_networks
    # No trusted proxy: X-Forwarded-For is the client's own claim and is ignored.
    assert client_address(_scope("203.0.113.9", "1.2.3.4"), []) == "203.0.113.9"
    assert client_address(_scope("203.0.113.9", "1.2.3.4"), trusted) == "203.0.113.9"
    # Through a trusted proxy: the nearest untrusted hop, not what the client forged leftmost.
    assert client_address(_scope("10.1.1.1", "6.6.6.6, 198.51.100.7"), trusted) == "198.51.100.7"
    assert client_address(_scope("10.1.1.1", "198.51.100.7, 10.2.2.2"), trusted) == "198.51.100.7"
    assert client_address(_scope("::1", "198.51.100.7"), trusted) == "198.51.100.7"
    # Garbage stops the walk at the last good hop.
    assert client_address(_scope("10.1.1.1", "198.51.100.7, <script>"), trusted) == "10.1.1.1"
    assert client_address(_scope("10.1.1.1"), trusted) == "10.1.1.1"
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        Settings(trusted_proxies=["10.0.0.0/8", "proxy.internal"])


# --- one credential per request -----------------------------------------------------------------


def _post(gateway: Gateway, headers: list[tuple[str, str]]) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/generate",
        headers=headers,
        json={"model": MODEL, "prompt": "hi", "stream": False},
        timeout=10,
    )


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_repeated_or_conflicting_credentials_are_refused(
    make_gateway: Callable[..., Gateway],
) -> None:
    gateway = make_gateway()
    _, other = gateway.create_key("other")
    bearer = ("Authorization", f"Bearer {gateway.key}")
    for headers in (
        [bearer, ("Authorization", f"Bearer {other}")],  # first wins elsewhere, last in Go
        [bearer, bearer],
        [("X-API-Key", gateway.key), ("X-API-Key", other)],
        [bearer, ("X-API-Key", other)],
    ):
        answer = _post(gateway, headers)
        assert answer.status_code == 400, headers
        assert "one API key" in answer.json()["error"]
    # The same key in both headers is one credential, and each alone works.
    assert _post(gateway, [bearer, ("X-API-Key", gateway.key)]).status_code == 200
    assert _post(gateway, [("X-API-Key", other)]).status_code == 200


# --- the key database's mode -------------------------------------------------------------------


async def _create_store_with_a_key(url: str) -> None:
    store = KeyStore.from_url(url)
    await store.create_schema()
    await store.create_key("app")
    await store.close()


def test_a_new_sqlite_key_database_is_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the common default: files readable by everyone
    try:
        asyncio.run(_create_store_with_a_key(f"sqlite+aiosqlite:///{tmp_path}/keys.db"))
    finally:
        os.umask(old)
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


# --- /v1/models from the catalogue --------------------------------------------------------------


def test_v1_models_does_not_call_the_upstream_per_request(
    emulator: Emulator, make_gateway: Callable[..., Gateway]
) -> None:
    gateway = make_gateway(upstream_poll_interval=3600.0)
    with httpx.Client(base_url=gateway.url, headers=gateway.headers(), timeout=10) as client:
        first = client.get("/v1/models")
        assert first.status_code == 200
        assert MODEL in [m["id"] for m in first.json()["data"]]
        before = _tags_calls(emulator)
        for _ in range(20):
            assert client.get("/v1/models").json() == first.json()
        assert _tags_calls(emulator) == before


def _tags_calls(emulator: Emulator) -> int:
    return sum(1 for record in emulator.state.records if record.path == "/api/tags")
