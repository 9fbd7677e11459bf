"""What the emulator's answers say over sockets: tool calls, JSON formats, logprobs; the CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest
import uvicorn

from gateway.testing.emulator import app as emulator
from tests.emulator.test_emulator import CHAT, GENERATE, ndjson, sse

pytestmark = pytest.mark.anyio


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "second"}}]
ARGUMENTS = {"city": "emulated", "days": 1, "unit": "celsius"}


def chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(event) for event in sse(text) if event != "[DONE]"]


# --- tool calls -------------------------------------------------------------------------------


async def test_native_chat_streams_the_tool_call_in_a_chunk_before_the_final_one(client, state):
    state.config.tool_call = True
    lines = ndjson((await client.post("/api/chat", json={**CHAT, "tools": TOOLS})).text)
    assert len(lines) == 2  # the call (after the held-back tokens), then the final chunk
    call, final = lines
    assert call["done"] is False
    assert call["message"]["content"] == ""
    [tool_call] = call["message"]["tool_calls"]
    assert tool_call["function"] == {"index": 0, "name": "get_weather", "arguments": ARGUMENTS}
    assert tool_call["id"].startswith("call_")
    assert len(tool_call["id"]) == 13
    assert tool_call["id"][5:].isalnum()
    assert tool_call["id"][5:].lower() == tool_call["id"][5:]
    assert (final["done"], final["done_reason"]) == (True, "stop")
    assert final["message"] == {"role": "assistant", "content": ""}
    assert final["eval_count"] == 6
    assert state.records[0].body["tools"] == TOOLS


async def test_native_chat_without_streaming_aggregates_the_tool_call(client, state):
    state.config.tool_call = True
    state.config.tool_arguments = {"city": "Tokyo <&>"}
    body = {**CHAT, "tools": TOOLS, "stream": False}
    response = await client.post("/api/chat", json=body)
    message = response.json()["message"]
    assert message["content"] == ""
    assert message["tool_calls"][0]["function"]["arguments"] == {"city": "Tokyo <&>"}
    assert "Tokyo \\u003c\\u0026\\u003e" in response.text
    assert response.json()["done_reason"] == "stop"


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
async def test_the_named_tool_is_called_and_its_result_answered_with_text(client, state, path):
    """An agent's loop on both faces: a call to the tool it names, then text once the
    conversation ends with that tool's result."""
    state.config.tool_call = True
    state.config.tool_name = "second"
    body = {**CHAT, "tools": TOOLS, "stream": False}
    first = (await client.post(path, json=body)).json()
    message = first["message"] if path == "/api/chat" else first["choices"][0]["message"]
    assert [call["function"]["name"] for call in message["tool_calls"]] == ["second"]
    result = {"role": "tool", "content": "done", "tool_call_id": "call_1"}
    body["messages"] = [*CHAT["messages"], message, result]
    second = (await client.post(path, json=body)).json()
    message = second["message"] if path == "/api/chat" else second["choices"][0]["message"]
    assert not message.get("tool_calls")
    assert message["content"].startswith("tok0 ")


async def test_tools_get_text_unless_the_knob_is_on(client, state):
    lines = ndjson((await client.post("/api/chat", json={**CHAT, "tools": TOOLS})).text)
    assert lines[0]["message"] == {"role": "assistant", "content": "tok0 "}
    state.config.tool_call = True
    lines = ndjson((await client.post("/api/chat", json=CHAT)).text)  # no tools offered
    assert not any("tool_calls" in line["message"] for line in lines)


async def test_openai_stream_sends_the_tool_call_in_fragments(client, state):
    state.config.tool_call = True
    body = {**CHAT, "tools": TOOLS, "stream": True}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.text.endswith("data: [DONE]\n\n")
    events = chunks(response.text)
    deltas = [event["choices"][0]["delta"] for event in events]
    head = deltas[0]
    assert head["role"] == "assistant"
    [call] = head["tool_calls"]
    assert call == {
        "index": 0,
        "id": call["id"],
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    fragments = [delta["tool_calls"][0] for delta in deltas[1:] if "tool_calls" in delta]
    assert len(fragments) >= 2
    assert all(fragment["index"] == 0 and "id" not in fragment for fragment in fragments)
    arguments = "".join(fragment["function"]["arguments"] for fragment in fragments)
    assert json.loads(arguments) == ARGUMENTS
    assert all(json.loads(arguments) != fragment["function"]["arguments"] for fragment in fragments)
    assert events[-1]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]


async def test_openai_without_streaming_returns_message_tool_calls(client, state):
    state.config.tool_call = True
    answer = (await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS})).json()
    [choice] = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert (call["type"], call["index"], call["function"]["name"]) == ("function", 0, "get_weather")
    assert json.loads(call["function"]["arguments"]) == ARGUMENTS
    assert answer["usage"]["completion_tokens"] == 6


async def test_a_tool_call_cut_by_max_tokens_is_a_length_stop(client, state):
    state.config.tool_call = True
    body = {**CHAT, "tools": TOOLS, "max_tokens": 2}
    [choice] = (await client.post("/v1/chat/completions", json=body)).json()["choices"]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]


# --- JSON formats -----------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "base"), [("/api/generate", GENERATE), ("/api/chat", CHAT)])
async def test_native_json_format_generates_one_json_object(client, path, base):
    lines = ndjson((await client.post(path, json={**base, "format": "json"})).text)
    field = "message" if path == "/api/chat" else None
    parts = [line["message"]["content"] if field else line["response"] for line in lines[:-1]]
    assert len(parts) == 6
    assert json.loads("".join(parts)) == {"answer": "tok0 tok1 tok2 tok3 tok4 tok5"}


async def test_a_schema_format_fills_each_property(client):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    }
    body = {**GENERATE, "format": schema, "stream": False}
    answer = (await client.post("/api/generate", json=body)).json()
    assert json.loads(answer["response"]) == {"name": "emulated", "age": 1}


async def test_an_invalid_format_fails_in_the_runner(client):
    response = await client.post("/api/generate", json={**GENERATE, "format": "xml"})
    assert response.status_code == 500
    assert response.json() == {
        "error": 'invalid format: expected "json" or a valid JSON Schema object'
    }


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ({"type": "json_object"}, {"answer": "tok0 tok1 tok2 tok3 tok4 tok5"}),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "person",
                    "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
                },
            },
            {"ok": True},
        ),
    ],
)
async def test_openai_response_format_generates_json(client, response_format, expected):
    body = {**CHAT, "response_format": response_format}
    answer = (await client.post("/v1/chat/completions", json=body)).json()
    assert json.loads(answer["choices"][0]["message"]["content"]) == expected
    text = await client.post(
        "/v1/chat/completions", json={**CHAT, "response_format": {"type": "text"}}
    )
    assert text.json()["choices"][0]["message"]["content"].startswith("tok0 ")


# --- logprobs ---------------------------------------------------------------------------------


async def test_openai_logprobs_ride_on_each_chunk_and_the_whole_answer(client):
    body = {**CHAT, "logprobs": True, "top_logprobs": 3}
    [choice] = (await client.post("/v1/chat/completions", json=body)).json()["choices"]
    content = choice["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [f"tok{i} " for i in range(6)]
    first = content[0]
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
    assert first["bytes"] == list(b"tok0 ")
    assert first["logprob"] < 0
    assert len(first["top_logprobs"]) == 3
    assert first["top_logprobs"][0]["token"] == "tok0 "
    assert [alt["logprob"] for alt in first["top_logprobs"]] == sorted(
        (alt["logprob"] for alt in first["top_logprobs"]), reverse=True
    )
    events = chunks((await client.post("/v1/chat/completions", json={**body, "stream": True})).text)
    streamed = [event["choices"][0]["logprobs"]["content"][0] for event in events[:-1]]
    assert streamed == content
    plain = (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert "logprobs" not in plain["choices"][0]


async def test_native_logprobs_and_their_limits(client):
    lines = ndjson((await client.post("/api/chat", json={**CHAT, "logprobs": True})).text)
    entry = lines[0]["logprobs"][0]
    assert entry["token"] == "tok0 "
    assert "top_logprobs" not in entry  # omitempty with top_logprobs 0
    assert "logprobs" not in lines[-1]
    whole = (
        await client.post("/api/generate", json={**GENERATE, "logprobs": True, "stream": False})
    ).json()
    assert len(whole["logprobs"]) == 6
    for path, base in (("/api/chat", CHAT), ("/v1/chat/completions", CHAT)):
        refused = await client.post(path, json={**base, "logprobs": True, "top_logprobs": 21})
        assert refused.status_code == 400
        assert "top_logprobs must be between 0 and 20" in refused.text


# --- the CLI ----------------------------------------------------------------------------------


def test_cli_passes_the_new_knobs_to_the_emulator(monkeypatch):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: seen.update(app=app))
    argv = [
        "--embedding-dimensions",
        "4",
        "--context-length",
        "64",
        "--tool-call",
        "--tool-arguments",
        '{"city": "Paris"}',
        "--registry",
        "mistral,phi3",
    ]
    assert emulator.main(argv) == 0
    config = seen["app"].state.emulator.config
    assert (config.embedding_dimensions, config.context_length) == (4, 64)
    assert (config.tool_call, config.tool_arguments) == (True, {"city": "Paris"})
    assert config.registry == ["mistral", "phi3"]
    assert emulator.main([]) == 0
    defaults = seen["app"].state.emulator.config
    assert (defaults.tool_call, defaults.registry, defaults.embedding_dimensions) == (
        False,
        None,
        8,
    )


def test_cli_help_lists_the_new_knobs(capsys):
    with pytest.raises(SystemExit) as exit_info:
        emulator.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--embedding-dimensions", "--context-length", "--tool-call", "--registry"):
        assert flag in text
    with pytest.raises(SystemExit):
        emulator.main(["--tool-arguments", "[1]"])
    assert "not a JSON object" in capsys.readouterr().err
