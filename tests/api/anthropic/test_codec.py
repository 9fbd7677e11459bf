"""Neutral chunks as Anthropic SSE events and message objects (`gateway.api.anthropic.codec`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.api.anthropic.codec import MessagesCodec
from gateway.neutral import Chunk, GenerationRequest, Stats, ToolCall

REQUEST = GenerationRequest(surface="openai", operation="chat", body={"model": "m"}, model="m")
DONE = Chunk(done=True, done_reason="stop", stats=Stats(prompt_eval_count=7, eval_count=5))


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event; each must be `event:` then `data:`."""
    assert raw.endswith(b"\n\n")
    parsed = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        assert name.startswith("event: ")
        assert data.startswith("data: ")
        body = json.loads(data.removeprefix("data: "))
        assert body["type"] == name.removeprefix("event: ")
        parsed.append((name.removeprefix("event: "), body))
    return parsed


def test_each_read_is_written_at_once_in_anthropics_order() -> None:
    codec = MessagesCodec(REQUEST)
    first = events(codec.encode([Chunk(thinking="hm")]))
    assert [name for name, _ in first] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
    ]
    message = first[0][1]["message"]
    assert message["id"].startswith("msg_")
    assert (message["model"], message["content"], message["stop_reason"]) == ("m", [], None)
    assert message["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert first[2][1]["content_block"] == {"type": "thinking", "thinking": ""}
    assert first[3][1]["delta"] == {"type": "thinking_delta", "thinking": "hm"}

    second = events(codec.encode([Chunk(text="a"), Chunk(text="b")]))
    assert [(name, body.get("index")) for name, body in second] == [
        ("content_block_delta", 0),  # the thinking block's signature
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
    ]
    assert second[3][1]["delta"] == {"type": "text_delta", "text": "a"}

    last = events(codec.encode([DONE]))
    assert [name for name, _ in last] == ["content_block_stop", "message_delta", "message_stop"]
    assert last[1][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert last[1][1]["usage"] == {"input_tokens": 7, "output_tokens": 5}


def test_a_tool_call_is_a_tool_use_block_with_its_json_and_stop_reason() -> None:
    codec = MessagesCodec(REQUEST)
    call = ToolCall("get_weather", '{"city": "Paris"}', "call_1")
    sent = events(codec.encode([Chunk(text="let me see"), Chunk(tool_calls=[call]), DONE]))
    names = [name for name, _ in sent]
    assert names[2:] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    block = sent[5][1]["content_block"]
    assert block == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    assert sent[6][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert sent[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_length_stop_is_max_tokens_and_a_failure_an_error_event() -> None:
    codec = MessagesCodec(REQUEST)
    sent = events(codec.encode([Chunk(text="a"), Chunk(done=True, done_reason="length")]))
    assert sent[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert sent[-2][1]["usage"] == {"input_tokens": 0, "output_tokens": 1}  # none reported

    failed = MessagesCodec(REQUEST)
    [(name, body)] = events(failed.encode([Chunk.failure("upstream went away")]))
    assert (name, body) == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "upstream went away"}},
    )


def test_the_non_streamed_answer_is_one_message() -> None:
    codec = MessagesCodec(REQUEST)
    for chunk in (
        Chunk(thinking="h"),
        Chunk(thinking="m"),
        Chunk(text="a"),
        Chunk(text="b"),
        Chunk(tool_calls=[ToolCall("w", '{"x": 1}')]),
        Chunk(tool_calls=[ToolCall("w", "not json", "c2", 1)]),
        DONE,
    ):
        codec.add(chunk)
    message = json.loads(codec.result())
    assert message["type"] == "message"
    assert message["id"].startswith("msg_")
    first_call, second_call = message["content"][2:]
    assert message["content"][:2] == [
        {"type": "thinking", "thinking": "hm", "signature": ""},
        {"type": "text", "text": "ab"},
    ]
    assert first_call["id"].startswith("toolu_")
    assert (first_call["name"], first_call["input"]) == ("w", {"x": 1})
    assert (second_call["id"], second_call["input"]) == ("c2", {"_raw": "not json"})
    assert (message["stop_reason"], message["stop_sequence"]) == ("tool_use", None)
    assert message["usage"] == {"input_tokens": 7, "output_tokens": 5}


def test_a_long_answer_not_streamed_is_joined_in_order_once() -> None:
    """100,000 chunks: thinking, text, a call, text again, each piece in its block in order.

    Each piece used to be added to its block's string: quadratic, 5 s of CPU for 100,000
    chunks (0.07 s joined once); the time is not asserted here.
    """
    codec = MessagesCodec(REQUEST)
    count = 50_000
    for index in range(count):
        codec.add(Chunk(thinking=f"t{index} "))
    for index in range(count):
        codec.add(Chunk(text=f"w{index} "))
    codec.add(Chunk(tool_calls=[ToolCall(id="toolu_1", name="f", arguments='{"a": 1}')]))
    codec.add(Chunk(text="after"))
    codec.add(DONE)
    content = json.loads(codec.result())["content"]
    assert content == [
        {"type": "thinking", "thinking": "".join(f"t{i} " for i in range(count)), "signature": ""},
        {"type": "text", "text": "".join(f"w{i} " for i in range(count))},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
        {"type": "text", "text": "after"},
    ]


@pytest.mark.parametrize(
    ("arguments", "sent"),
    [
        ('{"cmd": "ls"}', {"cmd": "ls"}),
        ("", {}),
        ('{"cmd": "ls"', {"_raw": '{"cmd": "ls"'}),  # cut short by the model
        ('["ls"]', {"_raw": '["ls"]'}),
        ("ls -la", {"_raw": "ls -la"}),  # the SDK's accumulator raised on this one
    ],
)
def test_a_streamed_tool_call_input_is_always_a_json_object(arguments: str, sent: Any) -> None:
    """The SDKs parse `partial_json` and raise on invalid JSON (anthropic 2.17's accumulator:
    "Unable to parse tool parameter JSON"): a call an OpenAI-compatible upstream streamed
    with broken arguments is sent as the non-streamed answer has it, `{"_raw": text}`."""
    codec = MessagesCodec(REQUEST)
    call = ToolCall(id="toolu_1", name="run", arguments=arguments)
    deltas = [
        body["delta"]
        for name, body in events(codec.encode([Chunk(tool_calls=[call]), DONE]))
        if name == "content_block_delta"
    ]
    assert json.loads("".join(d["partial_json"] for d in deltas)) == sent
