"""A body within the size limit cannot keep the event loop parsing for seconds (issue 11).

Over real sockets: `gateway serve` in its own process, in front of an emulator in another; a
probe thread times `GET /healthz` on another connection while one big body is handled. Both run
outside the test process on purpose: in it, they shared its GIL with every test before (a
collection of that heap, or the emulator parsing the same body, paused /healthz for 1.2 s once
under CI, which is not the gateway's loop). The bound is relative and generous (a busy machine
must not fail it); the code before `GATEWAY_MAX_JSON_VALUES` held the loop (and the GIL) for
several seconds on these bodies; today 10-45 ms here (about 0.1 s if parsed on the loop).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.errors import BadRequestError
from gateway.settings import Settings
from gateway.wire.json import JsonLimitError, count_values, parse_json
from tests.support.client import MODEL
from tests.support.emulator import emulator_process
from tests.support.stack import Gateway

#: Just under the 16 MiB default body limit.
SIZE = 16 * 1024 * 1024 - 4096


def _zeros() -> bytes:
    """Millions of tiny values: `options.a` is 8 million zeros."""
    head = json.dumps({"model": MODEL, "prompt": "x", "options": {"a": []}})[:-3].encode()
    return head + b"0," * ((SIZE - len(head)) // 2 - 10) + b"0]}}"


def _empty_arrays() -> bytes:
    head = b'{"model":"' + MODEL.encode() + b'","prompt":"x","x":['
    return head + b"[]," * ((SIZE - len(head)) // 3 - 10) + b"[]]}"


def _allowed_worst() -> bytes:
    """Under the value limit but costly: 40,000 objects and 16 MiB of text full of commas."""
    objects = b'{"a":0},' * 40_000
    text = b"x, y, " * ((SIZE - len(objects) - 200) // 6)
    head = b'{"model":"' + MODEL.encode() + b'","prompt":"x","o":['
    return head + objects + b'{}],"system":"' + text + b'"}'


@pytest.fixture
def served_gateway(serve, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`gateway serve` in front of an emulator process: (its URL, a key)."""
    with emulator_process(tmp_path / "emulator.log") as upstream:
        url, key, _ = serve(upstream.url, "ollama")
        yield url, key


def _healthz_lag_during(
    gateway: tuple[str, str], raw: bytes
) -> tuple[float, float, httpx.Response]:
    """Post `raw`; meanwhile time `/healthz` in a loop. Returns (baseline, worst, response)."""
    url, key = gateway
    with httpx.Client(base_url=url, timeout=30) as probe:
        baseline = max(_timed(probe) for _ in range(5))
        lags: list[float] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                lags.append(_timed(probe))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
            response = httpx.post(f"{url}/v1/generate", content=raw, headers=headers, timeout=60)
        finally:
            done.set()
            watcher.join()
    return baseline, max(lags), response


def _timed(client: httpx.Client) -> float:
    start = time.perf_counter()
    assert client.get("/healthz").status_code == 200
    return time.perf_counter() - start


@pytest.mark.processes
@pytest.mark.parametrize("make_body", [_zeros, _empty_arrays])
def test_a_body_of_millions_of_values_is_refused_without_stalling_the_loop(
    served_gateway, make_body
):
    raw = make_body()
    assert len(raw) <= Settings(_env_file=None).max_body_bytes
    baseline, worst, response = _healthz_lag_during(served_gateway, raw)
    # Before the value limit: 8-11 s of parsing on this kind of machine, /healthz waited for it.
    assert worst < baseline + 0.5, (baseline, worst)
    assert response.status_code == 400
    assert "more than 100000 JSON values" in response.json()["error"]


@pytest.mark.processes
@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_the_worst_allowed_body_is_parsed_without_stalling_the_loop(served_gateway):
    raw = _allowed_worst()
    assert len(raw) <= Settings(_env_file=None).max_body_bytes
    baseline, worst, response = _healthz_lag_during(served_gateway, raw)
    assert response.status_code == 200
    assert worst < baseline + 0.5, (baseline, worst)


def test_the_value_limit_is_a_setting(make_gateway):
    gw = make_gateway(max_json_values=1000)
    body = {"model": MODEL, "prompt": "x", "context": list(range(2000))}
    response = httpx.post(f"{gw.url}/v1/generate", json=body, headers=gw.headers(), timeout=10)
    assert (response.status_code, response.json()["error"]) == (
        400,
        "request body holds more than 1000 JSON values",
    )
    body["context"] = list(range(500))
    response = httpx.post(f"{gw.url}/v1/generate", json=body, headers=gw.headers(), timeout=10)
    assert response.status_code == 200


def _values(value: object) -> int:
    if isinstance(value, dict):
        return 1 + sum(_values(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_values(v) for v in value)
    return 1


@pytest.mark.parametrize("limit", [1, 3, 20, 10**9])
def test_the_value_count_never_undercounts(limit):
    rng = random.Random(limit)  # noqa: S311 - reproducible test data, not secrets
    pieces = ["", ",", "[", "{", '\\"', "\\\\", "\\u0022", "x"]

    def make(depth: int) -> object:
        roll = rng.random()
        if depth > 4 or roll < 0.3:
            return (
                "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))
                .encode()
                .decode("unicode_escape")
            )
        if roll < 0.65:
            return [make(depth + 1) for _ in range(rng.randint(0, 4))]
        return {f"k{i},[{{": make(depth + 1) for i in range(rng.randint(0, 4))}

    for _ in range(300):
        doc = make(0)
        raw = json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode()
        assert count_values(raw, limit) >= min(_values(doc), limit + 1), raw


def test_commas_inside_strings_are_not_values():
    raw = b'{"model":"m","prompt":"' + b',[{\\"\\\\' * 10_000 + b'"}'
    assert count_values(raw, 100) <= 3


def test_integers_with_thousands_of_digits_are_refused_before_they_cost_seconds() -> None:
    """`int()` of a decimal string is quadratic in its digits: a few thousand 4,299-digit
    integers (under Python's own 4,300-digit limit) held the event loop for a second."""
    from gateway.wire.json import MAX_INT_DIGITS
    from tests.support.client import parse_ollama as parse_body

    digits = "9" * 4299
    raw = ('{"model":"m","prompt":"x","a":[' + ",".join([digits] * 50) + "]}").encode()
    with pytest.raises(BadRequestError, match=f"more than {MAX_INT_DIGITS} digits"):
        parse_body(raw, "generate", max_depth=64, max_values=100_000)
    seed = 2**64 - 1  # the largest integer a field needs (a uint64 seed) still passes
    ok = parse_body(
        f'{{"model":"m","options":{{"seed":{seed}}}}}'.encode(),
        "generate",
        max_depth=64,
        max_values=100_000,
    )
    assert ok["options"]["seed"] == seed


# --- JSON from outside a request body ------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[" * 5000 + b"]" * 5000, "is nested deeper than 8 levels"),  # RecursionError before
        (b'{"a":' * 3000 + b"1" + b"}" * 3000, "is nested deeper than 8 levels"),
        (b"[" * 9 + b"]" * 9, "is nested deeper than 8 levels"),  # parses, but too deep
        (b"[" + b"0," * 2000 + b"0]", "holds more than 1000 JSON values"),
        (b'{"a": NaN}', "is not valid JSON"),
        (b'{"a": 1' + b"0" * 40 + b"}", "is not valid JSON"),
        (b'{"a": "\xff"}', "is not valid UTF-8"),
    ],
)
def test_outside_json_is_refused_with_one_value_error(raw: bytes, message: str) -> None:
    values = 1000 if b"0," in raw else 100_000  # let the depth cases reach the parser
    with pytest.raises(JsonLimitError, match=message):
        parse_json(raw, max_depth=8, max_values=values)
    assert issubclass(JsonLimitError, ValueError)  # what every caller catches


def test_outside_json_within_bounds_is_parsed() -> None:
    raw = b'{"a": [1, 2.5, "x", null, true, {"b": []}]}'
    assert parse_json(raw, max_depth=4, max_values=10) == json.loads(raw)
    assert parse_json(raw.decode(), max_depth=4, max_values=10) == json.loads(raw)


@pytest.mark.parametrize(
    "body",
    [
        b'{"input_file_id": "file-x", "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"input_file_id": "file-x", "metadata": ' + b'{"a":' * 2000 + b"1" + b"}" * 2000 + b"}",
        b"[" * 30000 + b"]" * 30000,
    ],
)
def test_a_deeply_nested_batch_body_is_a_400_not_a_500(gateway: Gateway, body: bytes) -> None:
    response = httpx.post(
        f"{gateway.url}/v1/batches",
        content=body,
        headers={**gateway.headers(), "Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message in {
        "the body is nested deeper than 8 levels",
        "the body holds more than 10000 JSON values",  # each `[` may begin a value
    }
