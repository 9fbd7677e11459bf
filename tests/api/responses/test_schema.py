"""The Responses body as a chat body (`gateway.api.responses.schema`): what reaches the upstream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.api.responses.schema import (
    MAX_NAMESPACE_CHARS,
    ResponsesRequest,
    ToolName,
    parse_responses,
)
from gateway.errors import BadRequestError, UnprocessableError
from gateway.settings import Settings

SETTINGS = Settings(upstream_url="http://upstream", database_url="sqlite+aiosqlite:///:memory:")


def _parse(**body: Any) -> ResponsesRequest:
    return parse_responses(json.dumps({"model": "m", **body}).encode(), SETTINGS)


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    request = _parse(input="hi", instructions="be brief", stream=True, max_output_tokens=9)
    assert (request.surface, request.operation, request.stream) == ("openai", "chat", True)
    assert request.body == {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 9,
    }
    assert request.max_output_tokens == 9  # the TPM reservation's bound
    assert request.prompt_bytes > 0
    assert request.plan.echo["instructions"] == "be brief"


def test_items_become_chat_messages() -> None:
    request = _parse(
        input=[
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "sys"}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "https://x/y.png"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}],
            },
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "two"}],
            },
            {"type": "web_search_call", "id": "ws_1"},  # an item type with no chat form: left out
            {"type": "custom_tool_call", "call_id": "c3", "name": "patch", "input": "P"},
            {"type": "custom_tool_call_output", "call_id": "c3", "output": "done"},
        ],
        tools=[{"type": "function", "name": "f"}, {"type": "custom", "name": "patch"}],
    )
    messages = request.body["messages"]
    assert messages[0] == {"role": "system", "content": "sys"}
    assert messages[1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "https://x/y.png"},
    }
    # The calls join the assistant text before them, with the reasoning that preceded them.
    assert messages[2] == {
        "role": "assistant",
        "content": "a",
        "reasoning_content": "hmm",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        ],
    }
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "one"}
    assert messages[4] == {"role": "tool", "tool_call_id": "c2", "content": "two"}
    assert messages[5]["tool_calls"][0]["function"] == {
        "name": "patch",
        "arguments": json.dumps({"input": "P"}),
    }
    assert messages[6] == {"role": "tool", "tool_call_id": "c3", "content": "done"}
    assert len(messages) == 7


def test_tools_are_flattened_and_hosted_ones_left_out() -> None:
    request = _parse(
        input="go",
        tools=[
            {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": False},
            {
                "type": "namespace",
                "name": "ns",
                "description": "d",
                "tools": [{"type": "function", "name": "g", "description": "G"}],
            },
            {
                "type": "custom",
                "name": "patch",
                "description": "Edit.",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"},
            },
            {"type": "web_search"},
            {"type": "file_search", "vector_store_ids": []},
            {"type": "mcp", "server_label": "s"},
        ],
        tool_choice={"type": "function", "name": "g", "namespace": "ns"},
        parallel_tool_calls=False,
    )
    tools = request.body["tools"]
    assert [t["function"]["name"] for t in tools] == ["f", "ns__g", "patch"]
    assert tools[0]["function"]["strict"] is False
    assert tools[1]["function"]["description"] == "G"
    assert tools[2]["function"]["parameters"]["required"] == ["input"]
    assert "start: x" in tools[2]["function"]["description"]
    assert request.body["tool_choice"] == {"type": "function", "function": {"name": "ns__g"}}
    assert request.body["parallel_tool_calls"] is False
    assert request.plan.tools == {
        "f": ToolName("f"),
        "ns__g": ToolName("g", namespace="ns"),
        "patch": ToolName("patch", custom=True),
    }


def test_a_namespaced_call_in_the_input_goes_back_under_its_flat_name() -> None:
    request = _parse(
        input=[
            {
                "type": "function_call",
                "call_id": "c",
                "name": "g",
                "namespace": "ns",
                "arguments": "",
            },
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ],
        tools=[
            {
                "type": "namespace",
                "name": "ns",
                "description": "",
                "tools": [{"type": "function", "name": "g"}],
            }
        ],
    )
    assert request.body["messages"][0]["tool_calls"][0]["function"]["name"] == "ns__g"


def test_output_options_are_mapped() -> None:
    schema = {"type": "object"}
    request = _parse(
        input="hi",
        temperature=0.2,
        top_p=0.9,
        text={"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}},
        reasoning={"effort": "minimal", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        metadata={"a": "b"},
        prompt_cache_key="k",
        client_metadata={"x": 1},
        store=False,
        user="u",
        service_tier="auto",
        truncation="auto",
        safety_identifier="s",
        stream_options={"include_obfuscation": False},
    )
    assert request.body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "top_p": 0.9,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": True},
        },
        "reasoning_effort": "low",
    }
    assert _parse(input="hi", text={"format": {"type": "json_object"}}).body["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in _parse(input="hi", text={"format": {"type": "text"}}).body


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ({}, UnprocessableError, "input"),
        ({"input": []}, UnprocessableError, "input"),
        ({"input": 3}, UnprocessableError, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, UnprocessableError, r"input\[0\].role"),
        ({"input": [{"role": "user", "content": 3}]}, UnprocessableError, r"input\[0\].content"),
        ({"input": [{"type": "function_call", "name": "f"}]}, UnprocessableError, "call_id"),
        ({"input": "x", "max_output_tokens": 0}, UnprocessableError, "max_output_tokens"),
        ({"input": "x", "temperature": "hot"}, UnprocessableError, "temperature"),
        ({"input": "x", "tools": {}}, UnprocessableError, "tools"),
        ({"input": "x", "tools": [{"type": "function"}]}, UnprocessableError, r"tools\[0\].name"),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": 1},
            UnprocessableError,
            "tool_choice",
        ),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, UnprocessableError, "text.format"),
        ({"input": "x", "reasoning": "high"}, UnprocessableError, "reasoning"),
        ({"input": "x", "instructions": ["a"]}, UnprocessableError, "instructions"),
        ({"input": "x", "previous_response_id": "resp_1"}, BadRequestError, "previous_response_id"),
        ({"input": "x", "background": True}, BadRequestError, "background"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            BadRequestError,
            "input_file",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            BadRequestError,
            "file_id",
        ),
    ],
)
def test_bad_shapes_are_refused_naming_the_parameter(
    body: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        _parse(**body)


def test_reasoning_before_each_of_many_calls_is_joined_once_in_order() -> None:
    """8,000 reasoning + call pairs: one assistant turn, its reasoning in order.

    The pieces used to be added to the turn's string one by one: quadratic, 5.7 s of CPU for
    a 15 MiB body of 8,000 pairs (0.2 s joined once); the time is not asserted here.
    """
    count = 8_000  # about 90,000 JSON values: under GATEWAY_MAX_JSON_VALUES
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "first "}]},
        {"role": "assistant", "content": "ok"},
    ]
    for index in range(count):
        items.append(
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": f"r{index} "}]}
        )
        items.append(
            {"type": "function_call", "call_id": f"c{index}", "name": "f", "arguments": "{}"}
        )
    items.append({"type": "function_call_output", "call_id": "c0", "output": "done"})
    messages = _parse(input=items).body["messages"]
    turn = messages[1]
    assert turn["role"] == "assistant"
    assert len(turn["tool_calls"]) == count
    assert turn["reasoning_content"] == "first " + "".join(f"r{i} " for i in range(count))
    assert messages[2] == {"role": "tool", "tool_call_id": "c0", "content": "done"}


def test_a_long_namespace_name_is_refused_not_copied_into_every_member() -> None:
    """Each member's flat name repeats the namespace: 1 MB name x 300 members was 287 MB.

    A 1 MB body became a 286 MB upstream body (and 33 GB at the body limits): the namespace
    name is bounded (`MAX_NAMESPACE_CHARS`), far above any real one (OpenAI's function names
    are at most 64 characters; Codex's `multi_agent_v1`).
    """
    members = [{"type": "function", "name": f"f{i}"} for i in range(300)]
    with pytest.raises(UnprocessableError, match=r"tools\[0\]\.name"):
        _parse(input="hi", tools=[{"type": "namespace", "name": "n" * 1_000_000, "tools": members}])
    longest = "n" * MAX_NAMESPACE_CHARS
    request = _parse(input="hi", tools=[{"type": "namespace", "name": longest, "tools": members}])
    assert request.body["tools"][0]["function"]["name"] == f"{longest}__f0"
