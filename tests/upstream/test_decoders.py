"""The dialects' stream decoders, bytes in and chunks out (no I/O, so no server is needed).

An upstream's body arrives in pieces cut anywhere: mid-line, mid-UTF-8 character, several lines
at once. Whatever the cut, the decoder must give the same chunks with the upstream's own bytes
(reference section 1), stop at the final or error chunk, and refuse a truncated or malformed
stream (reference sections 4.3 and 9.2).
"""

from __future__ import annotations

import json

import pytest

from gateway.neutral import Chunk
from gateway.upstream.dialects.base import MAX_LINE_BYTES, StreamBrokenError, StreamDecoder
from gateway.upstream.dialects.framing import LineSplitter
from gateway.upstream.dialects.ollama import NdjsonDecoder
from gateway.upstream.dialects.openai import SseDecoder

ANSWER = b"".join(
    json.dumps(obj, ensure_ascii=False).encode() + b"\n"
    for obj in (
        {"model": "m", "response": "Hé", "done": False},
        {"model": "m", "response": " 世界", "done": False},
        {"model": "m", "response": "", "done": True, "eval_count": 2},
    )
)


def _decode(decoder: StreamDecoder, pieces: list[bytes]) -> list[Chunk]:
    chunks = []
    for piece in pieces:
        chunks += decoder.feed(piece)
    return chunks + decoder.end()


def test_line_splitter_keeps_newlines_and_the_unterminated_rest() -> None:
    lines = LineSplitter()
    assert lines.feed(b"a\nb") == [b"a\n"]
    assert lines.feed(b"c\n\nd\n") == [b"bc\n", b"\n", b"d\n"]
    assert lines.feed(b"tail") == []
    assert lines.rest() == b"tail"
    assert lines.rest() == b""


def test_line_splitter_refuses_an_over_long_line() -> None:
    lines = LineSplitter()
    lines.feed(b"x" * MAX_LINE_BYTES)
    with pytest.raises(StreamBrokenError, match="over-long line"):
        lines.feed(b"x")


@pytest.mark.parametrize("cut", range(1, len(ANSWER)))
def test_ndjson_any_cut_gives_the_same_chunks(cut: int) -> None:
    whole = _decode(NdjsonDecoder(), [ANSWER])
    split = _decode(NdjsonDecoder(), [ANSWER[:cut], ANSWER[cut:]])
    assert [c.raw for c in split] == [c.raw for c in whole] == ANSWER.splitlines(keepends=True)
    assert split[-1].done
    assert [c.text for c in split] == ["Hé", " 世界", ""]


def test_ndjson_byte_by_byte() -> None:
    chunks = _decode(NdjsonDecoder(), [ANSWER[i : i + 1] for i in range(len(ANSWER))])
    assert b"".join(c.raw for c in chunks) == ANSWER


def test_ndjson_stops_at_done_and_ignores_what_follows() -> None:
    decoder = NdjsonDecoder()
    chunks = decoder.feed(ANSWER + b'{"model":"m","response":"late","done":false}\n')
    assert len(chunks) == 3
    assert decoder.finished
    assert decoder.feed(b"garbage\n") == []
    assert decoder.end() == []


def test_ndjson_error_line_is_the_last_chunk() -> None:
    decoder = NdjsonDecoder()
    chunks = decoder.feed(b'{"response":"a","done":false}\n{"error":"boom"}\n{"done":true}\n')
    assert [c.error is not None for c in chunks] == [False, True]
    assert decoder.finished


def test_ndjson_unterminated_final_line_gets_its_newline() -> None:
    decoder = NdjsonDecoder()
    assert decoder.feed(b'{"response":"","done":true}') == []
    [final] = decoder.end()
    assert final.done
    assert final.raw == b'{"response":"","done":true}\n'


def test_ndjson_blank_lines_are_skipped() -> None:
    chunks = _decode(NdjsonDecoder(), [b"\n  \n", ANSWER])
    assert len(chunks) == 3


def test_ndjson_eof_before_done_is_truncation() -> None:
    decoder = NdjsonDecoder()
    decoder.feed(ANSWER.splitlines(keepends=True)[0])
    with pytest.raises(StreamBrokenError, match="before it finished"):
        decoder.end()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"response": "a", "done": false} trailing\n', "malformed NDJSON line"),
        (b"{not json}\n", "malformed NDJSON line"),
        (b'"a string"\n', "non-object NDJSON line"),
        (b"[1, 2]\n", "non-object NDJSON line"),
        (b'{"response": "\xff"}\n', "malformed NDJSON line"),
        (b"[" * 100_000 + b"\n", "malformed NDJSON line"),
    ],
)
def test_ndjson_malformed_lines(line: bytes, message: str) -> None:
    with pytest.raises(StreamBrokenError, match=message):
        NdjsonDecoder().feed(line)


SSE = (
    b": keep-alive comment\n\n"
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\r\n\r\n'
    b"event: message\n"
    b'data: {"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


def _sse() -> SseDecoder:
    return SseDecoder(started=0.0, sent=0.0)


@pytest.mark.parametrize("cut", range(1, len(SSE), 7))
def test_sse_any_cut_gives_the_same_chunks(cut: int) -> None:
    chunks = _decode(_sse(), [SSE[:cut], SSE[cut:]])
    texts = [c.text for c in chunks]
    assert texts == ["Hi", " there", ""]
    final = chunks[-1]
    assert final.done
    assert final.stats is not None
    assert (final.stats.prompt_eval_count, final.stats.eval_count) == (5, 2)


def test_sse_eof_before_done_is_truncation() -> None:
    decoder = _sse()
    decoder.feed(SSE[: SSE.index(b"data: [DONE]")])
    with pytest.raises(StreamBrokenError, match=r"before data: \[DONE\]"):
        decoder.end()


def test_sse_error_event_ends_the_stream() -> None:
    decoder = _sse()
    chunks = decoder.feed(b'data: {"error":{"message":"overloaded"}}\n\ndata: [DONE]\n\n')
    assert [c.error for c in chunks] == ["overloaded"]
    assert decoder.finished


@pytest.mark.parametrize("payload", [b"data: {oops}\n\n", b"data:\n\n", b"data: [1]\n\n"])
def test_sse_malformed_events(payload: bytes) -> None:
    with pytest.raises(StreamBrokenError, match="SSE event"):
        _sse().feed(payload)


def test_good_chunks_before_a_malformed_line_travel_with_the_error() -> None:
    good = ANSWER.splitlines(keepends=True)[:2]
    with pytest.raises(StreamBrokenError, match="malformed NDJSON line") as raised:
        NdjsonDecoder().feed(b"".join(good) + b"{broken\n")
    assert [c.raw for c in raised.value.chunks] == good


def test_good_sse_events_before_a_malformed_one_travel_with_the_error() -> None:
    payload = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\ndata: {oops}\n\n'
    with pytest.raises(StreamBrokenError, match="malformed SSE event") as raised:
        _sse().feed(payload)
    assert [c.text for c in raised.value.chunks] == ["Hi"]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_sse_a_tool_call_of_many_deltas_is_joined_in_order() -> None:
    """100,000 argument deltas (a long patch an agent writes): one call, its pieces in order.

    Each piece used to be added to a string: quadratic, 0.8 s of the event loop for these
    (0.1 s joined once); the time is not asserted here.
    """
    count = 100_000
    first = {"index": 0, "id": "call_1", "function": {"name": "apply_", "arguments": ""}}
    events = [{"choices": [{"delta": {"tool_calls": [first]}}]}]
    events.append(
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "patch"}}]}}]}
    )
    events += [
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": f"{i},"}}]}}]}
        for i in range(count)
    ]
    events.append({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    chunks = _decode(_sse(), [stream + b"data: [DONE]\n\n"])
    calls = [call for chunk in chunks for call in chunk.tool_calls or ()]
    assert [(c.name, c.id) for c in calls] == [("apply_patch", "call_1")]
    assert calls[0].arguments == "".join(f"{i}," for i in range(count))
