"""`NdjsonDecoder.lane`: the one-call relay of a token's line gives what the long way gives.

Two ways: to an Ollama client (the line relayed as it came) and to a client of a translated
surface (the line's text written as the codec's `text_event` writes it: OpenAI's chat and
completions, the Responses API, Anthropic's Messages).

The long way is what `RelayResponse` does with a read on the push path: `feed` decodes it,
the meter observes each chunk (`RequestMeter.observe`: a token ticks the clock), `NdjsonCodec`
encodes the batch, and the writer gets the bytes. For every read the lane takes (it returns
True) the client must get the same bytes and the clock the same ticks; for every read it
refuses it must change nothing, so that `feed` then decodes it exactly as before, errors and
all (`gateway.upstream.dialects.base.Lane`).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.api.anthropic.codec import MessagesCodec
from gateway.api.ollama.codec import NdjsonCodec
from gateway.api.openai.codec import CompletionCodec
from gateway.api.responses.codec import ResponsesCodec
from gateway.neutral import Chunk, GenerationRequest, TokenClock
from gateway.upstream.dialects.base import StreamBrokenError
from gateway.upstream.dialects.ollama import NdjsonDecoder


def line(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


CHAT = {"model": "m", "created_at": "2026-12-07T18:00:00Z", "done": False}

TAKEN = [
    line({**CHAT, "message": {"role": "assistant", "content": "word "}}),
    line({**CHAT, "message": {"role": "assistant", "content": "é 世界 \u2028"}}),
    line({**CHAT, "message": {"role": "assistant", "content": "", "thinking": "hmm"}}),
    line({**CHAT, "message": {"role": "assistant", "content": ""}}),  # no token: no tick
    line({**CHAT, "message": {"role": "assistant", "content": 7}}),  # not text: no tick
    line({"model": "m", "response": "tok", "done": False}),  # /api/generate
    line({"model": "m", "response": "", "thinking": "t", "done": False}),
    line({"model": "m", "response": "x"}),  # no `done` at all: not final
    line({"model": "m", "response": "x", "done": "true"}),  # a string is not `done: true`
    line({"model": "m", "message": "not an object", "response": "r", "done": False}),
    line({**CHAT, "message": {"content": "x", "tool_calls": []}}),  # empty: no call
    line({**CHAT, "message": {"content": "x"}, "logprobs": [{"token": "x", "logprob": -0.1}]}),
    b'  {"model":"m","response":"spaced","done":false}  \r\n',
]
"""Reads the lane relays itself: one whole in-between object line."""

REFUSED = [
    line({**CHAT, "done": True, "done_reason": "stop", "eval_count": 3}),  # final
    line({"error": "model exploded"}),  # an error line
    line({**CHAT, "message": {"content": "", "tool_calls": [{"function": {"name": "f"}}]}}),
    line({"model": "m", "response": "", "tool_calls": [{"function": {"name": "f"}}]}),
    b"\n",  # blank: `feed` skips it
    b"   \n",
    line({**CHAT, "message": {"content": "a"}}) + line({**CHAT, "message": {"content": "b"}}),
    line({**CHAT, "message": {"content": "a"}})[:-1],  # no newline yet
    b'{"model":"m","response":NaN,"done":false}\n',  # orjson refuses; `json` decides
    b'{"model":"m","response":"x","done":false} trailing\n',  # not one object
    b"[1, 2]\n",  # not an object
    b'"text"\n',
    b"\xff\xfe\n",  # not UTF-8
    b'{"model":"m","response":"x"\n',  # cut JSON
    # A run of 19 digits: `feed` parses with `json` (exact big integers), whose nesting limit
    # is below orjson's: the lane must not take what `feed` would refuse (found by an attack).
    line({"model": "m", "response": "big", "context": [12345678901234567890], "done": False}),
    b'{"response":"q","done":false,"n":1234567890123456789,"x":'
    + b"[" * 1000
    + b"]" * 1000
    + b"}\n",
]
"""Reads the lane must leave to `feed` (which may decode, skip or refuse them)."""


class Sink:
    """The lane's `tick` and `write`, recorded."""

    def __init__(self) -> None:
        self.ticks = 0
        self.written: list[bytes] = []

    def tick(self, now: float) -> None:
        assert now > 0
        self.ticks += 1

    def write(self, body: bytes) -> None:
        self.written.append(body)


def long_way(piece: bytes, operation: str = "chat") -> tuple[bytes, int, list[Chunk]]:
    """What the push path's decode, observe and encode make of `piece`: bytes, ticks, chunks."""
    decoder = NdjsonDecoder()
    chunks = decoder.feed(piece)
    clock = TokenClock()
    for chunk in chunks:  # as RequestMeter.observe
        if chunk.text or chunk.thinking or chunk.tool_calls:
            clock.tick(1.0)
    request = GenerationRequest(surface="ollama", operation=operation, body={}, model="m")
    return NdjsonCodec(request).encode(chunks) if chunks else b"", clock.count, chunks


@pytest.mark.parametrize("piece", TAKEN, ids=range(len(TAKEN)))
def test_a_token_line_is_relayed_by_the_lane_exactly_as_the_long_way(piece: bytes) -> None:
    body, ticks, chunks = long_way(piece)
    assert len(chunks) == 1
    assert not chunks[0].done
    assert chunks[0].error is None
    decoder, sink = NdjsonDecoder(), Sink()
    assert decoder.lane(sink.tick, sink.write)(piece) is True
    assert sink.written == [body] == [piece]
    assert sink.ticks == ticks
    assert not decoder.finished


@pytest.mark.parametrize("piece", REFUSED, ids=range(len(REFUSED)))
def test_any_other_read_is_left_to_feed_untouched(piece: bytes) -> None:
    decoder, sink = NdjsonDecoder(), Sink()
    assert decoder.lane(sink.tick, sink.write)(piece) is False
    assert (sink.written, sink.ticks) == ([], 0)
    # `feed` then does what it does for a decoder that never saw the lane.
    fresh = NdjsonDecoder()
    try:
        expected: object = [c.raw for c in fresh.feed(piece)]
    except StreamBrokenError as exc:
        expected = str(exc)
    try:
        got: object = [c.raw for c in decoder.feed(piece)]
    except StreamBrokenError as exc:
        got = str(exc)
    assert got == expected
    assert decoder.finished == fresh.finished


def test_a_line_begun_in_an_earlier_read_is_left_to_feed() -> None:
    whole = line({**CHAT, "message": {"content": "joined"}})
    decoder, sink = NdjsonDecoder(), Sink()
    relay = decoder.lane(sink.tick, sink.write)
    assert relay(whole[:10]) is False
    assert decoder.feed(whole[:10]) == []
    rest = whole[10:]
    assert relay(rest) is False  # whole on its own, but the start is in `feed`'s buffer
    assert [c.raw for c in decoder.feed(rest)] == [whole]
    assert relay(TAKEN[0]) is True  # the buffer is empty again
    assert sink.written == [TAKEN[0]]


def test_after_the_final_line_the_lane_takes_nothing() -> None:
    decoder, sink = NdjsonDecoder(), Sink()
    relay = decoder.lane(sink.tick, sink.write)
    assert decoder.feed(REFUSED[0])[0].done
    assert relay(TAKEN[0]) is False
    assert decoder.feed(TAKEN[0]) == []  # ignored after the end, as before
    assert sink.written == []


def test_a_generate_line_gives_the_same_bytes_through_its_codec() -> None:
    piece = line({"model": "m", "response": "tok", "done": False})
    body, ticks, _ = long_way(piece, operation="generate")
    sink = Sink()
    assert NdjsonDecoder().lane(sink.tick, sink.write)(piece) is True
    assert (sink.written, sink.ticks) == ([body], ticks) == ([piece], 1)


TEXTS = [
    "word ",
    "é 世界",
    'quote " and \\ back',
    "line\nbreak\ttab\x01",
    "\u2028\u2029",
    "🙂",
    "<\x7f>",
]


def completion_codec(operation: str = "chat", model: str = "m") -> CompletionCodec:
    request = GenerationRequest(surface="openai", operation=operation, body={}, model=model)
    return CompletionCodec(request)


@pytest.mark.parametrize("operation", ["chat", "generate"])
def test_a_text_line_is_translated_by_the_lane_exactly_as_the_codec_encodes_it(
    operation: str,
) -> None:
    lane_codec, long_codec = completion_codec(operation), completion_codec(operation)
    lane_codec._id = long_codec._id  # the same stream's id and time on both sides
    lane_codec._created = long_codec._created
    first = Chunk(text="first")  # the role goes out with the first delta, the long way
    assert lane_codec.encode([first]) == long_codec.encode([first])
    assert lane_codec.text_event is not None
    decoder, sink = NdjsonDecoder(), Sink()
    relay = decoder.lane(sink.tick, sink.write, lane_codec.text_event)
    for text in TEXTS:
        piece = line({**CHAT, "message": {"role": "assistant", "content": text}})
        assert relay(piece) is True
        assert sink.written[-1] == long_codec.encode(NdjsonDecoder().feed(piece))
    assert sink.ticks == len(TEXTS)
    final = Chunk(done=True, done_reason="stop")
    assert lane_codec.encode([final]) == long_codec.encode([final])  # the same count kept
    assert lane_codec._generated == long_codec._generated == len(TEXTS) + 1


def test_the_translating_lane_leaves_all_but_text_alone_to_the_long_way() -> None:
    codec = completion_codec()
    assert codec.text_event is not None
    decoder, sink = NdjsonDecoder(), Sink()
    relay = decoder.lane(sink.tick, sink.write, codec.text_event)
    token = line({**CHAT, "message": {"content": "x"}})
    assert relay(token) is False  # the first delta carries the role: the codec says no
    codec.encode([Chunk(text="first")])
    others = [
        line({**CHAT, "message": {"content": "", "thinking": "hmm"}}),
        line({**CHAT, "message": {"content": "x", "thinking": "hmm"}}),
        line({**CHAT, "message": {"content": ""}}),
        line({**CHAT, "message": {"content": "x"}, "logprobs": [{"token": "x", "logprob": -1}]}),
        *REFUSED,
    ]
    for piece in others:
        assert relay(piece) is False
    assert (sink.written, sink.ticks) == ([], 0)
    assert codec._generated == 1
    assert relay(token) is True


def test_no_text_event_is_spliced_where_the_encoder_would_escape_the_whole_event() -> None:
    codec = completion_codec(model="lone \ud800 surrogate")  # written ASCII-escaped, all of it
    codec.encode([Chunk(text="first")])
    assert codec.text_event is not None
    assert codec.text_event("é") is None
    assert codec.text_event("x") is None
    assert codec._generated == 1


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ids and times in two codecs of one test (the long way's and the lane's)."""
    import gateway.api.anthropic.codec as anthropic_codec
    import gateway.api.responses.codec as responses_codec

    for module in (anthropic_codec, responses_codec):
        monkeypatch.setattr(module.secrets, "token_hex", lambda n=16: "ab" * n)
    monkeypatch.setattr(responses_codec.time, "time", lambda: 1_800_000_000.0)


def agent_codec(kind: str) -> Any:
    surface = "responses" if kind == "responses" else "anthropic"
    request = GenerationRequest(surface=surface, operation="chat", body={}, model="m")
    return ResponsesCodec(request) if kind == "responses" else MessagesCodec(request)


@pytest.mark.parametrize("kind", ["responses", "messages"])
@pytest.mark.usefixtures("fixed_ids")
def test_an_agent_surface_gets_the_same_events_through_the_lane(kind: str) -> None:
    lane_codec, long_codec = agent_codec(kind), agent_codec(kind)
    assert lane_codec.text_event is not None
    assert lane_codec.text_event("early") is None  # nothing open yet: the long way opens it
    first = [Chunk(text="first")]
    assert lane_codec.encode(first) == long_codec.encode(first)
    decoder, sink = NdjsonDecoder(), Sink()
    relay = decoder.lane(sink.tick, sink.write, lane_codec.text_event)
    for text in TEXTS:
        piece = line({**CHAT, "message": {"role": "assistant", "content": text}})
        assert relay(piece) is True
        assert sink.written[-1] == long_codec.encode(NdjsonDecoder().feed(piece))
    # A thinking chunk goes the long way (it opens another block or item); text after it is
    # spliced around the new one.
    thought = [Chunk(thinking="hmm")]
    assert relay(line({**CHAT, "message": {"content": "", "thinking": "hmm"}})) is False
    assert lane_codec.encode(thought) == long_codec.encode(thought)
    assert lane_codec.text_event("x") is None  # the open block is not text
    again = [Chunk(text="again")]
    assert lane_codec.encode(again) == long_codec.encode(again)
    piece = line({**CHAT, "message": {"content": "more"}})
    assert relay(piece) is True
    assert sink.written[-1] == long_codec.encode(NdjsonDecoder().feed(piece))
    final = [Chunk(done=True, done_reason="stop")]
    assert lane_codec.encode(final) == long_codec.encode(final)  # the texts and counts agree
    if kind == "responses":
        assert lane_codec.final == long_codec.final


@pytest.mark.parametrize("kind", ["responses", "messages"])
@pytest.mark.usefixtures("fixed_ids")
def test_an_agent_surface_splices_its_delta_whatever_the_model_is_called(kind: str) -> None:
    # The delta events hold no model name (unlike OpenAI's chunks): one the encoder can only
    # write ASCII-escaped does not stop the splice, whose bytes stay the long way's.
    surface = "responses" if kind == "responses" else "anthropic"
    codecs = [
        (ResponsesCodec if kind == "responses" else MessagesCodec)(
            GenerationRequest(surface=surface, operation="chat", body={}, model="lone \ud800")
        )
        for _ in range(2)
    ]
    lane_codec, long_codec = codecs
    first = [Chunk(text="first")]
    assert lane_codec.encode(first) == long_codec.encode(first)
    assert lane_codec.text_event is not None
    assert lane_codec.text_event("é") == long_codec.encode([Chunk(text="é")])
