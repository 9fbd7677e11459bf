"""The per-chunk JSON codec gives the standard library's results byte for byte (issue 27).

`gateway.upstream.dialects.json_codec` decodes upstream lines and encodes client events with
orjson where that gives `json`'s result, and with `json` elsewhere. Each test here holds the
module to the functions it replaced, written out below as they were (`_reference_decode`,
`_reference_encode`), over a corpus of tricky values and lines: hand-picked cases, and seeded
random ones (deterministic: the same corpus every run). A value orjson writes differently (a
float, NaN) or a line it reads differently (an integer beyond 64 bits) fails here if the module
lets orjson handle it.
"""

from __future__ import annotations

import json
import random
import struct
import sys
from datetime import UTC, datetime
from enum import Enum, IntEnum
from typing import Any

import orjson
import pytest

from gateway.upstream.dialects.base import StreamBrokenError
from gateway.upstream.dialects.json_codec import THREADED_JSON, decode_object, encode_json


def _reference_encode(data: Any) -> bytes:
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def _reference_decode(line: bytes, what: str) -> dict[str, Any] | None:
    try:
        text = line.decode().strip()
        if not text:
            return None
        data, end = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError) as exc:
        raise StreamBrokenError(f"upstream sent a malformed {what}") from exc
    if end != len(text):
        raise StreamBrokenError(f"upstream sent a malformed {what}")
    if not isinstance(data, dict):
        raise StreamBrokenError(f"upstream sent a non-object {what}")
    return data


def _outcome(function: Any, *args: Any) -> tuple[str, str]:
    """What `function(*args)` gives: the result's repr (types, key order, NaN), or the error."""
    try:
        return "ok", repr(function(*args))
    except Exception as exc:
        cause = type(exc.__cause__).__name__ if exc.__cause__ else ""
        return type(exc).__name__, f"{exc} (from {cause})"


#: Every ASCII character (controls, quote, backslash, slash), C1 controls, non-ASCII letters,
#: line and paragraph separators, a BOM, emoji and a ZWJ sequence, and lone surrogates.
CHARACTERS = [chr(code) for code in range(0x80)]
CHARACTERS += ["\x80", "\x9f", "\xa0", "é", "ß", "世", "界", "\u2028", "\u2029", "\ufeff", "\uffff"]
CHARACTERS += ["😀", "👩\u200d💻", "\U0010ffff", "\u0301", "\ud800", "\udfff"]
INTEGERS = [0, 1, -1, 2**31, 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63)]
INTEGERS += [-(2**63) - 1, 10**18, 10**19, 10**30, -(10**30)]
#: Floats orjson writes as `repr` does (zero, magnitudes from 1e-4), and floats it does not.
SAME_FLOATS = [0.0, -0.0, 0.1, 1.0, 100.0, 1e-4, 1e15, 1e16, 1e22, 123456789012345680.0]
SAME_FLOATS += [1.7976931348623157e308, -3.4028234663852886e38, 0.00010000000000000002, -2.5]
OTHER_FLOATS = [1e-5, 1e-7, 2.5e-8, -1.2e-5, 9.999999999999999e-05, 5e-324]
OTHER_FLOATS += [2.2250738585072014e-308, float("nan"), float("inf"), float("-inf")]
FLOATS = SAME_FLOATS + OTHER_FLOATS


class _Colour(Enum):
    RED = "red"


class _Level(IntEnum):
    HIGH = 3


class _Text(str):
    __slots__ = ()


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice(CHARACTERS) for _ in range(rng.randint(0, 12)))


def _random_value(rng: random.Random, depth: int, floats: bool) -> Any:
    kind = rng.randint(0, 9 if depth < 4 else 6)
    if kind <= 2:
        return _random_text(rng)
    if kind == 3:
        return rng.choice([*INTEGERS, rng.randint(-(10**6), 10**6)])
    if kind == 4:
        return rng.choice([None, True, False])
    if kind in (5, 6):
        return rng.choice(FLOATS) if floats else _random_text(rng)
    items = [_random_value(rng, depth + 1, floats) for _ in range(rng.randint(0, 5))]
    if kind == 7:
        return tuple(items) if rng.random() < 0.2 else items
    return {_random_text(rng): item for item in items}


def _random_values(seed: int, count: int, *, floats: bool) -> list[Any]:
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    return [_random_value(rng, 0, floats) for _ in range(count)]


SSE_EVENT = {
    "id": "chatcmpl-0e1f2a3b4c5d6e7f8091a2b3",
    "object": "chat.completion.chunk",
    "created": 1765000000,
    "model": "llama3.2:1b",
    "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": " 世界\n😀"}, "finish_reason": None}
    ],
}
LOGPROBS = [{"token": "a", "logprob": -0.25, "bytes": [97], "top_logprobs": []}]
PLAIN = [
    SSE_EVENT,
    {**SSE_EVENT, "choices": [{"index": 0, "logprobs": {"content": LOGPROBS}}]},
    *SAME_FLOATS,
    {"model": "m", "message": {"role": "assistant", "content": ' "quoted" \\ \t'}, "done": False},
    {"error": "model 'x' not found"},
    {"": {"": [[], {}, ()]}, "a": [1, "1", True, None]},
    *[[text] for text in CHARACTERS if not ("\ud800" <= text[0] <= "\udfff")],
    *[number for number in INTEGERS if -(2**63) <= number < 2**64],
    "".join(chr(code) for code in range(0x300)),
    [[[[[[[["deep"]]]]]]]],
    [{"a": 1}] * 3,  # one object three times
]
ODD = [
    *OTHER_FLOATS,
    *[number for number in INTEGERS if not -(2**63) <= number < 2**64],
    [{**LOGPROBS[0], "logprob": -1.2e-05}],
    "\ud800",
    {"text": "a\udfffb"},
    {1: "int key", None: "null key", False: "bool key", 2.5: "float key"},
    {"when": datetime(2026, 12, 7, tzinfo=UTC)},
    [_Colour.RED],
    [_Level.HIGH, _Text("sub")],
    {_Text("key"): "value"},
    json.loads("[" * 254 + "]" * 254),
    json.loads("[" * 256 + "]" * 256),
    json.loads('{"a":' * 300 + "1" + "}" * 300),
]


@pytest.mark.parametrize("value", PLAIN, ids=lambda value: repr(value)[:40])
def test_orjson_writes_the_plain_values_as_json_does(value: Any) -> None:
    assert orjson.dumps(value) == _reference_encode(value)
    assert encode_json(value) == _reference_encode(value)


@pytest.mark.parametrize("value", ODD, ids=lambda value: repr(value)[:40])
def test_values_orjson_writes_otherwise_are_written_as_json_does(value: Any) -> None:
    assert _outcome(encode_json, value) == _outcome(_reference_encode, value)


@pytest.mark.parametrize("floats", [False, True])
def test_random_values_are_written_as_json_does(floats: bool) -> None:
    for value in _random_values(27, 3000, floats=floats):
        assert _outcome(encode_json, value) == _outcome(_reference_encode, value), repr(value)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_orjson_writes_floats_of_zero_or_from_1e_4_up_as_repr_does() -> None:
    rng = random.Random(27)  # noqa: S311 - test data, not secrets
    bits = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(50_000)]
    near = [rng.gauss(0, 0.001) for _ in range(50_000)]  # logprobs and vector values near zero
    for number in bits + near + [1e-4 * (1 + k / 1000) for k in range(-100, 100)]:
        if number == 0 or 1e-4 <= abs(number) <= sys.float_info.max:
            assert orjson.dumps(number) == _reference_encode(number), repr(number)
        assert encode_json([number]) == _reference_encode([number]), repr(number)


def test_a_value_holding_itself_fails_as_in_json() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        encode_json(loop)


LINE = b'{"model":"m","created_at":"2026-12-07T07:00:00.123456789Z","response":"Hi","done":false}'
LINES = [
    LINE + b"\n",
    LINE + b"\r\n",
    b" \t" + LINE + b" \n",
    b"\x0c" + LINE + b"\x0b\n",  # whitespace to str.strip, not to JSON
    b"\xc2\xa0" + LINE,
    b"\xef\xbb\xbf" + LINE,
    b"",
    b"\n",
    b" \r\n",
    b'{"a":1,"a":2,"b":3,"a":4}',
    b'{"a":NaN,"b":Infinity,"c":-Infinity}',
    b'{"a":1e400,"b":-1e400,"c":1e-400,"d":-0,"e":-0.0,"f":1E5,"g":0e0}',
    b'{"a":9223372036854775807,"b":-9223372036854775808,"c":18446744073709551615}',
    b'{"a":18446744073709551616}',
    b'{"a":-9223372036854775809}',
    b'{"a":123456789012345678901234567890}',
    b'{"a":0.1234567890123456789,"b":"1234567890123456789"}',
    b'{"a":"\\ud800","b":"\\udc00\\ud800"}',
    b'{"a":"\\ud83d\\ude00","b":"\\u00e9\\u0000\\u2028","c":"\\/\\b\\f\\n\\r\\t"}',
    b'{"a":"\xff"}',
    b'{"a":"\xed\xa0\x80"}',
    b'{"a":"\xc0\xaf"}',
    b'{"a":"\x01"}',
    b'{"a":"\x7f\xc2\x80"}',
    b'{"a":01}',
    b'{"a":1.}',
    b'{"a":.5}',
    b'{"a":+1}',
    b"{'a':1}",
    b'{"a":1,}',
    b'{"a":1}//',
    b'{"a":1}{"b":2}',
    b'{"a":1}\x00',
    b'{"a":"\\x41"}',
    b'{"a":tru}',
    b"[1]",
    b'"text"',
    b"1",
    b"null",
    b"[" * 600 + b"]" * 600,
    b'{"a":' + b"[" * 1100 + b"]" * 1100 + b"}",
    b"data: " + LINE,
    b"[DONE]",
]


def _random_lines(seed: int, count: int) -> list[bytes]:
    """Encoded random objects (NaN and big integers among their values), some mutated."""
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    lines = []
    for _ in range(count):
        value = {_random_text(rng): _random_value(rng, 1, True) for _ in range(rng.randint(0, 4))}
        line = bytearray(_reference_encode(value))
        for _ in range(rng.choice([0, 0, 1, 2])):  # a byte changed, dropped or added
            at = rng.randrange(len(line) + 1)
            byte = rng.choice(b'{}[]",:0123456789.eE-+ \\untrfalse\x00\xff\xc3\xa9')
            operation = rng.randint(0, 2)
            if operation == 0 and at < len(line):
                line[at] = byte
            elif operation == 1 and at < len(line):
                del line[at]
            else:
                line.insert(at, byte)
        lines.append(bytes(line))
    return lines


@pytest.mark.parametrize("line", LINES, ids=lambda line: repr(line)[:40])
def test_lines_are_decoded_as_json_decodes_them(line: bytes) -> None:
    assert _outcome(decode_object, line, "NDJSON line") == _outcome(
        _reference_decode, line, "NDJSON line"
    )


def test_random_lines_are_decoded_as_json_decodes_them() -> None:
    for line in _random_lines(27, 3000):
        expected = _outcome(_reference_decode, line, "SSE event")
        assert _outcome(decode_object, line, "SSE event") == expected, line


def test_the_threaded_decoder_is_the_standard_librarys(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker thread's parse keeps `json` with Python's number hooks, which hand the GIL over."""

    def refuse(data: object) -> object:
        raise AssertionError("orjson holds the GIL for a whole parse")

    monkeypatch.setattr(orjson, "loads", refuse)
    line = b'{"a":[1,2.5,NaN,123456789012345678901234567890]}'
    assert repr(decode_object(line, "JSON answer", THREADED_JSON)) == repr(
        _reference_decode(line, "JSON answer")
    )
