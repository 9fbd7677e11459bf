"""The framing helpers the upstream dialects share: bytes in, lines and objects out.

Line splitting for NDJSON and SSE (`LineSplitter`), a whole JSON answer collected and parsed at
its end (`BodyDecoder`, in a worker thread past `INLINE_PARSE_BYTES`), Ollama's counters
(`ollama_stats`), and JSON encoding that stays off the event loop's critical path for large
bodies (`encode_body`, `encode_json_stepwise`, `JsonList`), on top of one object's decoding and
encoding (`gateway.upstream.dialects.json_codec`). No I/O: the dialects' decoders feed them what
the relay read (`gateway.upstream.dialects.base`).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from gateway.neutral import Chunk, GenerationRequest, Stats
from gateway.upstream.dialects.base import (
    MAX_LINE_BYTES,
    AnswerTooLongError,
    StreamBrokenError,
    WithoutLane,
)
from gateway.upstream.dialects.json_codec import THREADED_JSON, decode_object, encode_json
from gateway.wire.json import INLINE_PARSE_BYTES


class LineSplitter:
    r"""Splits a byte stream into lines as its pieces arrive; each line keeps its `\n`.

    A `bytearray` holds an unfinished line, so a long line's cost stays linear in its length.

    Attributes:
        pending: The unfinished line so far; the same object for the splitter's life (changed
            in place), so a decoder's fast lane can hold it and see whether it is empty.
    """

    def __init__(self) -> None:
        self.pending = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        r"""Return the lines `data` completes, each ending in `\n`.

        Raises:
            StreamBrokenError: an unfinished line grew beyond `MAX_LINE_BYTES`.
        """
        newline = data.find(b"\n")
        if newline < 0:
            self.pending += data
            if len(self.pending) > MAX_LINE_BYTES:
                raise AnswerTooLongError("upstream sent an over-long line")
            return []
        if self.pending:
            self.pending += data
            data = bytes(self.pending)
            self.pending.clear()
        elif newline == len(data) - 1:
            return [data]  # the usual piece: one whole line (a token) per read
        *lines, rest = data.split(b"\n")
        if rest:
            self.feed(rest)
        return [line + b"\n" for line in lines]

    def rest(self) -> bytes:
        """Return (and forget) the unterminated last line, at the end of the stream."""
        rest = bytes(self.pending)
        self.pending.clear()
        return rest


#: Largest count or duration trusted from an upstream: 2**53, the largest integer a float (and
#: so a JSON number in most clients) holds exactly. Ollama's counts are tokens and its durations
#: nanoseconds (2**53 ns is 104 days); anything larger is garbage and would overflow the rates.
MAX_TRUSTED = 2**53


def trusted_count(value: object) -> int | None:
    """A positive integer from the upstream's JSON, else None (bad values are not trusted)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TRUSTED:
        return None
    return value


def ollama_stats(data: dict[str, Any]) -> Stats:
    """The counts and durations of an Ollama final chunk or embed answer (section 2.3)."""
    return Stats(
        prompt_eval_count=trusted_count(data.get("prompt_eval_count")),
        eval_count=trusted_count(data.get("eval_count")),
        total_duration=trusted_count(data.get("total_duration")),
        load_duration=trusted_count(data.get("load_duration")),
        prompt_eval_duration=trusted_count(data.get("prompt_eval_duration")),
        eval_duration=trusted_count(data.get("eval_duration")),
    )


class BodyDecoder(WithoutLane):
    """A whole JSON answer (embeddings): collected up to `MAX_LINE_BYTES`, parsed at EOF.

    `parse` turns the object and the raw body into the one final chunk. The relay runs `end`
    in a worker thread for a body over `INLINE_PARSE_BYTES`, which is then parsed with
    `THREADED_JSON`.

    Raises (from `feed` and `end`):
        StreamBrokenError: the body is too long, not a JSON object, or `parse` refused it.
    """

    def __init__(self, parse: Any) -> None:
        self.finished = False
        self._parse = parse
        self._body = bytearray()

    def feed(self, data: bytes) -> list[Chunk]:
        """Collect `data`; the chunk comes at the end (see `StreamDecoder.feed`)."""
        self._body += data
        if len(self._body) > MAX_LINE_BYTES:
            raise AnswerTooLongError("upstream sent an over-long answer")
        return []

    def end(self) -> list[Chunk]:
        """Parse the collected body into its final chunk."""
        raw = bytes(self._body)
        if len(raw) > INLINE_PARSE_BYTES:
            data = decode_object(raw, "JSON answer", THREADED_JSON)
        else:
            data = decode_object(raw, "JSON answer")
        if data is None:
            raise StreamBrokenError("upstream sent an empty answer")
        try:
            chunk: Chunk = self._parse(data, raw)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise StreamBrokenError("upstream sent an answer of the wrong shape") from exc
        self.finished = True
        return [chunk]


#: Bytes of JSON about which one call of the encoder writes (`encode_json_stepwise`).
_STEP_BYTES = 256 * 1024

#: Members of an object one call of the encoder writes at most (`encode_json_stepwise`).
_STEP_MEMBERS = 1024


def encode_body(data: Any, request: GenerationRequest) -> bytes:
    """Write the upstream request body for `request`: stepwise for a large client body.

    The relay builds the upstream request in a worker thread when the client's body was over
    `INLINE_PARSE_BYTES` (`gateway.relay.exchange`); there it is written in steps
    (`encode_json_stepwise`) so that the event loop's thread gets the GIL between them.
    """
    if request.body_bytes > INLINE_PARSE_BYTES:
        return encode_json_stepwise(data)
    return encode_json(data)


def encode_json_stepwise(data: Any) -> bytes:
    """`encode_json` for a large answer, written in steps so that it may run in a thread.

    The encoder (orjson, or `json`'s C one) holds the GIL for a whole call: a 30 MiB answer of
    vectors written at once held the event loop for a second, even from a worker thread. Here
    an object holding containers is written member by member, and a list in slices of about
    `_STEP_BYTES` (sized by its first element); the interpreter runs between the steps and
    hands the GIL over to the event loop's thread. The bytes are `encode_json`'s.
    """
    if isinstance(data, dict):
        if len(data) > _STEP_MEMBERS:  # a client's object of many members (tens of thousands)
            items = list(data.items())
            parts = [
                encode_json_stepwise(dict(items[start : start + _STEP_MEMBERS]))[1:-1]
                for start in range(0, len(items), _STEP_MEMBERS)
            ]
            return b"{" + b",".join(parts) + b"}"
        if not any(isinstance(value, list | dict) for value in data.values()):
            return encode_json(data)
        parts = [encode_json(str(key)) + b":" + encode_json_stepwise(v) for key, v in data.items()]
        return b"{" + b",".join(parts) + b"}"
    if isinstance(data, list) and data:
        parts = [encode_json_stepwise(data[0])]  # a large first element is written in steps
        step = max(1, _STEP_BYTES // len(parts[0]))
        for start in range(1, len(data), step):
            parts.append(encode_json(data[start : start + step])[1:-1])
        return b"[" + b",".join(parts) + b"]"
    return encode_json(data)


class JsonList:
    """A list collected a chunk at a time (a long answer's `logprobs`), kept as JSON text.

    Kept as Python objects, a long non-streamed answer's logprobs are hundreds of thousands of
    dicts, and each full pass of the cyclic garbage collector over them held the GIL (and so the
    event loop) for up to a second; bytes are not tracked. The answer is encoded with
    `placeholder` where the list goes, and `splice` puts the list's text there.

    Attributes:
        placeholder: A string no answer holds (random per list): the list's stand-in.
    """

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.placeholder = "\x00" + secrets.token_hex(16)

    def __bool__(self) -> bool:
        return bool(self._parts)

    def extend(self, items: list[Any]) -> None:
        """Append `items` (JSON values)."""
        text = encode_json(items)[1:-1]
        if text:
            self._parts.append(text)

    def splice(self, encoded: bytes) -> bytes:
        """`encoded` (JSON holding `placeholder` once) with the list in its place."""
        if not self._parts:
            return encoded
        return encoded.replace(
            encode_json(self.placeholder), b"[" + b",".join(self._parts) + b"]", 1
        )


def rfc3339_now() -> str:
    """Return the current UTC time as RFC 3339 with a `Z` suffix, as Ollama's `created_at`."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")
