"""Messages bodies translated into chat bodies (`gateway.api.anthropic.schema`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.api.anthropic.schema import parse_messages, to_chat_body
from gateway.errors import BadRequestError
from gateway.settings import Settings

BASE: dict[str, Any] = {
    "model": "m",
    "max_tokens": 10,
    "messages": [{"role": "user", "content": "hi"}],
}


def chat(**fields: Any) -> dict[str, Any]:
    return to_chat_body({**BASE, **fields})


def test_the_minimal_body_is_a_chat_body_with_its_bound() -> None:
    assert chat() == {
        "model": "m",
        "stream": False,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
    }


def test_the_neutral_request_is_an_openai_chat_bounded_by_max_tokens() -> None:
    raw = json.dumps({**BASE, "stream": True}).encode()
    request = parse_messages(raw, Settings())
    assert (request.surface, request.operation, request.model) == ("openai", "chat", "m")
    assert (request.stream, request.max_output_tokens, request.body_bytes) == (True, 10, len(raw))


def test_system_as_a_string_as_blocks_and_inside_messages() -> None:
    blocks = [
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "b"},
    ]
    turns = [*BASE["messages"], {"role": "system", "content": [{"type": "text", "text": "late"}]}]
    messages = chat(system=blocks, messages=turns)["messages"]
    assert messages == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "late"},
    ]
    assert chat(system="s")["messages"][0] == {"role": "system", "content": "s"}


def test_tool_use_and_tool_results_become_tool_calls_and_tool_messages() -> None:
    turns = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "boom"}],
                },
                {"type": "text", "text": "and now?"},
            ],
        },
    ]
    messages = chat(messages=turns)["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "hmm",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "w", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
        {"role": "user", "content": "and now?"},
    ]


def test_empty_thinking_from_earlier_turns_is_left_out() -> None:
    blocks = [{"type": "thinking", "thinking": "", "signature": "s"}, {"type": "text", "text": "a"}]
    turns = [*BASE["messages"], {"role": "assistant", "content": blocks}]
    assert chat(messages=turns)["messages"][1] == {"role": "assistant", "content": "a"}


def test_images_by_base64_and_by_url_are_image_url_parts() -> None:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "what?"},
    ]
    [message] = chat(messages=[{"role": "user", "content": content}])["messages"]
    assert message["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "text", "text": "what?"},
    ]


def test_client_tools_are_functions_and_server_tools_are_left_out() -> None:
    schema = {"type": "object", "properties": {}}
    tools = [
        {
            "name": "a",
            "description": "d",
            "input_schema": schema,
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "custom", "name": "b", "input_schema": schema, "defer_loading": True},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "bash_20250124", "name": "bash"},
    ]
    body = chat(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert body["tools"] == [
        {"type": "function", "function": {"name": "a", "description": "d", "parameters": schema}},
        {"type": "function", "function": {"name": "b", "parameters": schema}},
    ]
    assert (body["tool_choice"], body["parallel_tool_calls"]) == ("required", False)
    named = chat(tools=tools, tool_choice={"type": "tool", "name": "a"})["tool_choice"]
    assert named == {"type": "function", "function": {"name": "a"}}
    assert chat(tools=tools, tool_choice={"type": "auto"})["tool_choice"] == "auto"
    assert chat(tools=tools, tool_choice={"type": "none"})["tool_choice"] == "none"
    # Only server tools: no tools, and no tool_choice naming none.
    assert "tool_choice" not in chat(tools=tools[2:], tool_choice={"type": "any"})


@pytest.mark.parametrize(
    ("thinking", "output_config", "effort"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, None, "low"),
        ({"type": "enabled", "budget_tokens": 10000}, None, "medium"),
        ({"type": "enabled", "budget_tokens": 32000}, None, "high"),
        ({"type": "adaptive"}, None, None),  # the model's default
        ({"type": "adaptive", "display": "omitted"}, {"effort": "high"}, None),
        ({"type": "disabled"}, None, "none"),
        (None, None, None),
    ],
)
def test_thinking_is_a_reasoning_effort(thinking: Any, output_config: Any, effort: Any) -> None:
    body = chat(thinking=thinking, output_config=output_config)
    assert body.get("reasoning_effort") == effort


def test_sampling_and_stops_are_carried_and_what_has_no_meaning_is_dropped() -> None:
    body = chat(
        temperature=None,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END"],
        metadata={"user_id": "u"},
        context_management={"edits": []},
        container="c",
        mcp_servers=[],
        service_tier="auto",
    )
    assert {k: body.get(k) for k in ("temperature", "top_p", "top_k", "stop")} == {
        "temperature": None,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END"],
    }
    assert set(body) == {"model", "stream", "max_tokens", "messages", "top_p", "top_k", "stop"}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages.0"),
        ({"messages": [{"role": ["user"], "content": "x"}]}, "messages.0"),  # was a 500
        ({"messages": [{"role": {"a": 1}, "content": "x"}]}, "messages.0"),
        (
            {"messages": [{"role": "user", "content": [{"text": "no type"}]}]},
            "messages.0.content.0",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "source"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"temperature": "hot"}, "temperature"),
        ({"tools": {"name": "a"}}, "tools"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"thinking": {"type": "enabled"}}, "budget_tokens"),
    ],
)
def test_shape_errors_are_400_naming_the_field(fields: dict[str, Any], named: str) -> None:
    body = {k: v for k, v in {**BASE, **fields}.items() if v is not None}
    with pytest.raises(BadRequestError, match=named):
        parse_messages(json.dumps(body).encode(), Settings())


def test_a_body_that_is_not_an_object_or_has_no_model_is_400() -> None:
    for raw in (b"[]", b'{"max_tokens": 1}', b"{nope"):
        with pytest.raises(BadRequestError):
            parse_messages(raw, Settings())


def test_count_tokens_bodies_need_no_max_tokens() -> None:
    body = {"model": "m", "messages": BASE["messages"]}
    assert "max_tokens" not in to_chat_body(body, counting=True)
