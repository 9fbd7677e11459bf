"""Neutral chunks as Responses events and objects (`gateway.api.responses.codec`)."""

from __future__ import annotations

import json
from typing import Any

from gateway.api.responses.codec import ResponsesCodec
from gateway.api.responses.schema import Plan, ResponsesRequest, ToolName
from gateway.neutral import Chunk, Stats, ToolCall

STATS = Stats(prompt_eval_count=7, eval_count=4)
TOOLS = {"ns__g": ToolName("g", namespace="ns"), "patch": ToolName("patch", custom=True)}


def _codec(stream: bool = True) -> ResponsesCodec:
    request = ResponsesRequest(
        surface="openai",
        operation="chat",
        body={},
        model="m",
        stream=stream,
        plan=Plan(tools=TOOLS, echo={"instructions": "i", "tools": []}),
    )
    return ResponsesCodec(request)


def _events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for frame in raw.decode().strip("\n").split("\n\n"):
        event, data = frame.split("\n")
        parsed = json.loads(data.removeprefix("data: "))
        assert event == f"event: {parsed['type']}"
        events.append(parsed)
    return events


def test_each_read_is_written_at_once_and_numbered_in_sequence() -> None:
    codec = _codec()
    first = _events(codec.encode([Chunk(thinking="t")]))
    assert [e["type"] for e in first] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
    ]
    second = _events(codec.encode([Chunk(text="a")]))  # the delta now, not at the end
    assert [e["type"] for e in second] == [
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert second[-1]["delta"] == "a"
    rest = _events(
        codec.encode(
            [
                Chunk(text="b"),
                Chunk(tool_calls=[ToolCall("ns__g", '{"x":1}', "c1")]),
                Chunk(tool_calls=[ToolCall("patch", '{"input":"P"}', "c2", index=1)]),
                Chunk(done=True, done_reason="stop", stats=STATS),
            ]
        )
    )
    events = first + second + rest
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]
    assert final["type"] == "response.completed"
    response = final["response"]
    assert (response["object"], response["status"], response["instructions"]) == (
        "response",
        "completed",
        "i",
    )
    assert response["output"] == [
        {
            "id": response["output"][0]["id"],
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "t"}],
        },
        {
            "id": response["output"][1]["id"],
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ab", "annotations": [], "logprobs": []}],
        },
        {
            "id": response["output"][2]["id"],
            "type": "function_call",
            "status": "completed",
            "call_id": "c1",
            "name": "g",
            "arguments": '{"x":1}',
            "namespace": "ns",
        },
        {
            "id": response["output"][3]["id"],
            "type": "custom_tool_call",
            "call_id": "c2",
            "name": "patch",
            "input": "P",
        },
    ]
    assert response["usage"] == {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 1},
        "total_tokens": 11,
    }
    indexes = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert indexes == [0, 1, 2, 3]
    kinds = [e["type"] for e in rest]
    assert "response.function_call_arguments.done" in kinds
    assert "response.custom_tool_call_input.done" in kinds


def test_a_length_stop_is_response_incomplete() -> None:
    codec = _codec()
    events = _events(codec.encode([Chunk(text="a"), Chunk(done=True, done_reason="length")]))
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["response"]["output"][0]["status"] == "incomplete"
    assert final["response"]["usage"]["output_tokens"] == 1  # counted when the upstream did not


def test_a_failure_is_an_error_event_then_response_failed() -> None:
    codec = _codec()
    events = _events(codec.encode([Chunk(text="a")]) + codec.encode([Chunk.failure("boom")]))
    error, failed = events[-2:]
    assert error == {
        "type": "error",
        "code": "server_error",
        "message": "boom",
        "param": None,
        "sequence_number": error["sequence_number"],
    }
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert failed["response"]["output"][0]["status"] == "incomplete"


def test_the_non_streamed_response() -> None:
    codec = _codec(stream=False)
    for chunk in (
        Chunk(thinking="t"),
        Chunk(text="a"),
        Chunk(tool_calls=[ToolCall("unknown", "{}")]),
        Chunk(done=True, stats=STATS),
    ):
        codec.add(chunk)
    response = json.loads(codec.result())
    assert response["status"] == "completed"
    assert [item["type"] for item in response["output"]] == [
        "reasoning",
        "message",
        "function_call",
    ]
    call = response["output"][2]
    assert call["name"] == "unknown"  # a name the client did not give passes as it came
    assert call["call_id"].startswith("call_")
    assert response["usage"]["total_tokens"] == 11
    assert response["id"].startswith("resp_")
    calls_only = _codec(stream=False)
    calls_only.add(Chunk(tool_calls=[ToolCall("patch", "not json")]))
    calls_only.add(Chunk(done=True))
    [item] = json.loads(calls_only.result())["output"]
    assert (item["type"], item["input"]) == ("custom_tool_call", "not json")
