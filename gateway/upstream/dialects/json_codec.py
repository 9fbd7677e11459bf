"""JSON in and out of the relay, per chunk: orjson where it gives the standard library's result.

Every streamed token crosses here twice on a translated surface: the upstream's line is decoded
(`decode_object`) and the client's event encoded (`encode_json`). With the standard library's
`json` that translation cost 35-50 µs a chunk, with orjson (compiled, Rust) 15-19 µs
(docs/performance.md, issue 27). orjson is used only where its answer is the standard library's
own, so that no client sees a byte change; everywhere else the standard library runs as before:

- Decoding, orjson refuses what `json` accepts (`NaN`, `Infinity`, `1e400`, lone surrogate
  escapes, whitespace outside JSON's four such as a form feed): such a line is decoded again by
  `json`, which accepts it or raises as it always did. orjson reads an integer beyond 64 bits as
  a float where `json` keeps it exact: a line holding a run of 19 digits (every integer outside
  the 64-bit range has at least 19) goes to `json` directly. A large answer parsed in a worker
  thread keeps `THREADED_JSON` (orjson, like `json`'s C parser, holds the GIL for a whole parse).
- Encoding, orjson writes small floats in its own form (`1e-7`, `0.00001` where Python writes
  `1e-07`, `1e-05`), NaN and infinities as `null` (Python: `NaN`, `Infinity`), and encodes
  types `json` refuses (datetimes, enums, UUIDs): a value holding anything but dicts, lists,
  tuples, `str`, `int`, `bool`, None and floats of zero or magnitudes from 1e-4 up to the
  largest finite is written by `json`. orjson raises on integers beyond 64 bits, non-string
  keys, lone surrogates and nesting beyond 255 levels: `json` writes those.

tests/upstream/test_json_codec.py checks both paths give equal results over a corpus of tricky
values and lines.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from gateway.upstream.dialects.base import StreamBrokenError

_JSON = json.JSONDecoder()


def _float(text: str) -> float:
    return float(text)


def _int(text: str) -> int:
    return int(text)


#: A decoder for answers parsed in a worker thread (`BodyDecoder.end`). The C parser holds the
#: GIL for a whole parse, so a thread alone would still stall the event loop (a 30 MiB answer
#: of floats: about a second); a hook written in Python runs the interpreter's loop at every
#: number, where it hands the GIL over to the event loop's thread within a switch interval.
THREADED_JSON = json.JSONDecoder(parse_float=_float, parse_int=_int)

#: Maps every digit to `0`, so that a run of digits is found by one substring search (a regular
#: expression `[0-9]{19}` cost more than the parse it guards).
_DIGITS = bytes.maketrans(b"123456789", b"000000000")

#: The fewest digits of an integer that orjson would read as a float: -(2**63) - 1 has 19.
_LONG_RUN = b"0" * 19


def orjson_decides(line: bytes) -> bool:
    """Whether `decode_object` parses `line` with orjson first (no run of 19 digits in it).

    A decoder's lane (`gateway.upstream.dialects.base.Lane`) parses with orjson only such a
    line, so that it accepts what `decode_object` accepts and nothing more.
    """
    return _LONG_RUN not in line.translate(_DIGITS)


def decode_object(
    line: bytes, what: str, decoder: json.JSONDecoder = _JSON
) -> dict[str, Any] | None:
    """Parse one JSON object from the upstream; None for a blank line.

    orjson first, unless the line holds a run of 19 digits (module docstring); on orjson's
    refusal, `JSONDecoder.raw_decode` on the stripped text, with a check that nothing follows
    the object: what `json.loads` does, without its two regular-expression scans (a third of a
    parse of a token's line).

    Args:
        line: UTF-8 bytes, the object and surrounding whitespace.
        what: Names the unit in errors: `NDJSON line`, `SSE event`.
        decoder: `THREADED_JSON` when parsing in a worker thread (then `json` only).

    Raises:
        StreamBrokenError: not valid UTF-8 JSON, or not an object.
    """
    if decoder is _JSON and orjson_decides(line):
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError:
            pass  # `json` decides below: a blank line, `NaN`, or an error as before
        else:
            if not isinstance(parsed, dict):
                raise StreamBrokenError(f"upstream sent a non-object {what}")
            return parsed
    return stdlib_decode_object(line, what, decoder)


def stdlib_decode_object(
    line: bytes, what: str, decoder: json.JSONDecoder = _JSON
) -> dict[str, Any] | None:
    """`decode_object` with the standard library only.

    Its fallback, and what it was before orjson (`benchmarks.chunk_json` compares the two).

    Raises:
        StreamBrokenError: not valid UTF-8 JSON, or not an object.
    """
    try:
        text = line.decode().strip()
        if not text:
            return None
        data, end = decoder.raw_decode(text)
    except (ValueError, RecursionError) as exc:
        raise StreamBrokenError(f"upstream sent a malformed {what}") from exc
    if end != len(text):
        raise StreamBrokenError(f"upstream sent a malformed {what}")
    if not isinstance(data, dict):
        raise StreamBrokenError(f"upstream sent a non-object {what}")
    return data


#: The leaf types orjson writes byte for byte as `json.dumps` does (exact types: a subclass,
#: such as an `IntEnum`, goes to `json`). Floats are checked one by one (`_plain`).
_PLAIN = frozenset((str, int, bool, type(None)))

#: The finite floats orjson 3.13 writes as Python's `repr` does: zero and magnitudes from 1e-4
#: up (1e-4 is `0.0001` in both). Below, Python writes `1e-05` and `1e-07` where orjson writes
#: `0.00001` and `1e-7`. Checked over three million doubles (random bits, decimals, every
#: power of ten) and in tests/upstream/test_json_codec.py.
_LEAST_FLOAT = 1e-4
_MOST_FLOAT = sys.float_info.max


def _plain(value: object) -> bool:
    """True if orjson writes `value` as `json` does (module docstring; NaN: not).

    Only dicts, lists, tuples, `_PLAIN` leaves and floats of `repr`'s form (`_LEAST_FLOAT`).
    """
    items: Iterable[object]
    if type(value) is dict:
        items = value.values()
    elif type(value) is list or type(value) is tuple:
        items = value
    elif type(value) is float:
        return value == 0.0 or _LEAST_FLOAT <= abs(value) <= _MOST_FLOAT  # NaN: False
    else:
        return type(value) in _PLAIN
    for item in items:  # noqa: SIM110 - `all()` over a generator took twice as long here
        if type(item) not in _PLAIN and not _plain(item):
            return False
    return True


def encode_json(data: Any) -> bytes:
    r"""Serialize compactly as UTF-8, escaping to ASCII only if the text cannot be encoded.

    The bytes of `json.dumps(data, separators=(",", ":"), ensure_ascii=False)`, written by
    orjson when that is sure to give them (module docstring). JSON parsers accept lone surrogate
    escapes (`"\\ud800"`) that UTF-8 cannot encode; such a value is re-escaped instead of
    failing the request.

    Raises:
        TypeError: `data` holds a value JSON cannot express (as `json.dumps`).
        ValueError: `data` holds itself (as `json.dumps`).
    """
    try:
        if _plain(data):
            return orjson.dumps(data)
    except (orjson.JSONEncodeError, RecursionError):
        pass  # a big integer, a non-string key, a lone surrogate, deep nesting: `json` below
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


#: The text `text_splice` renders: quotes, a non-ASCII letter, a control and a line separator,
#: so that an event its encoder can only write ASCII-escaped (or otherwise differently around
#: another text) is found out.
_PROBE = 'probe "é\n\u2028'


def text_splice(render: Callable[[str], bytes]) -> tuple[bytes, bytes] | None:
    """The bytes `render(text)` writes before and after `encode_json(text)`, for any text.

    Why: a codec's event for a token's text is the same bytes each time but for the text (a
    decoder's lane splices it: `gateway.upstream.dialects.base.TextEvent`). `render` must put
    the text in one JSON string value, after every other field that could hold the probe's
    bytes. None when the event does not hold `encode_json(text)` as such (the encoder escaped
    the whole event to ASCII: a field it cannot write as UTF-8); then no splice is made.
    """
    event = render(_PROBE)
    before, found, after = event.rpartition(encode_json(_PROBE))
    return (before, after) if found else None
