"""The `openai` SDK's Responses API (`client.responses`) through a real gateway, both dialects.

`responses.create` (streamed and not), the `responses.stream` helper, tool calls and their
results, JSON output, images, thinking, and refusals, against the emulator speaking Ollama's
native API or its OpenAI-compatible one. The answers must be what the upstream generated, the
usage its counts, and the request must reach the upstream translated into a chat request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.support.batch import FAST, batch_line, read_jsonl, upload_lines, wait_batch
from tests.support.client import DIALECTS, opened
from tests.support.client import MODEL_ALIAS as MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.clients

TEXT = "".join(f"tok{i} " for i in range(16))  # what the emulator generates by default
THINKING = "think0 think1 think2 "  # with `thinking_tokens = 3`
PROMPT_TOKENS = 12  # the emulator's reported prompt tokens
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
ARGUMENTS = {"city": "Tokyo", "days": 3}


def _dialect(gw: Gateway) -> str:
    return str(gw.settings.upstream_dialect)


def _openai(gw: Gateway, key: str | None = None) -> openai.OpenAI:
    # No retries: a refusal must surface as the first answer's typed error.
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key or gw.key, max_retries=0)
    return opened.enter_context(client)


@pytest.fixture
def tools_on(emulator: Emulator) -> None:
    """The emulator answers a chat that offers tools with a call to the first one."""
    emulator.config.tool_call = True
    emulator.config.tool_arguments = ARGUMENTS


def test_create_answers_what_the_upstream_generated_with_its_usage(
    gw: Gateway, emulator: Emulator
) -> None:
    response = _openai(gw).responses.create(model=MODEL, input="hi", instructions="be brief")
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.output_text == TEXT
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (PROMPT_TOKENS, 16)
    assert response.usage.total_tokens == PROMPT_TOKENS + 16
    assert response.instructions == "be brief"
    assert response.store is False
    sent = emulator.state.records[-1]
    assert sent.path == ("/api/chat" if _dialect(gw) == "ollama" else "/v1/chat/completions")
    assert [m["role"] for m in sent.body["messages"]] == ["system", "user"]
    assert sent.body["messages"][0]["content"] == "be brief"
    text = gw.metrics_text()
    labels = {"route": "/v1/responses", "outcome": "completed"}
    assert metric_value(text, "gateway_requests_total", **labels) == 1
    assert metric_value(text, "gateway_output_tokens_total") == 16


def test_a_stream_is_every_event_in_order_one_delta_per_upstream_token(gw: Gateway) -> None:
    events = list(_openai(gw).responses.create(model=MODEL, input="hi", stream=True))
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 16,  # as the upstream sent them: not buffered
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == TEXT
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == TEXT
    assert final.response.usage is not None
    assert final.response.usage.output_tokens == 16
    assert {e.response.id for e in events if hasattr(e, "response")} == {final.response.id}
    assert metric_value(gw.metrics_text(), "gateway_requests_total", route="/v1/responses") == 1


def test_the_stream_helper_and_the_wire_framing(gw: Gateway) -> None:
    with _openai(gw).responses.stream(model=MODEL, input="hi") as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == TEXT
    assert final.output_text == TEXT
    body = {"model": MODEL, "input": "hi", "stream": True}
    with httpx.stream(
        "POST", f"{gw.url}/v1/responses", json=body, headers=gw.headers()
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    frames = raw.strip("\n").split("\n\n")
    for frame in frames:
        event, data = frame.split("\n")
        assert event.startswith("event: ")
        assert json.loads(data.removeprefix("data: "))["type"] == event.removeprefix("event: ")


def test_a_length_stop_is_an_incomplete_response(gw: Gateway) -> None:
    client = _openai(gw)
    response = client.responses.create(model=MODEL, input="hi", max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "tok0 tok1 tok2 tok3 tok4 "
    events = list(
        client.responses.create(model=MODEL, input="hi", max_output_tokens=5, stream=True)
    )
    assert events[-1].type == "response.incomplete"


@pytest.mark.usefixtures("tools_on")
def test_a_tool_call_round_trip(gw: Gateway, emulator: Emulator) -> None:
    client = _openai(gw)
    first = client.responses.create(
        model=MODEL, input="weather in Tokyo?", tools=[WEATHER, {"type": "web_search"}]
    )
    [call] = first.output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == ARGUMENTS
    assert call.call_id
    sent = emulator.state.records[-1].body
    assert len(sent["tools"]) == 1  # the hosted web_search tool is left out
    assert sent["tools"][0]["function"]["name"] == "get_weather"

    emulator.config.tool_call = False
    second = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "weather in Tokyo?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 25 C"},
        ],
        tools=[WEATHER],
    )
    assert second.output_text == TEXT
    user, assistant, tool = emulator.state.records[-1].body["messages"]
    assert user == {"role": "user", "content": "weather in Tokyo?"}
    [sent_call] = assistant["tool_calls"]
    assert tool["role"] == "tool"
    assert tool["content"] == "sunny, 25 C"
    if _dialect(gw) == "ollama":  # translated again by the Ollama dialect
        assert sent_call["function"] == {"name": "get_weather", "arguments": ARGUMENTS}
        assert tool["tool_name"] == "get_weather"
    else:
        assert sent_call["function"]["name"] == "get_weather"
        assert json.loads(sent_call["function"]["arguments"]) == ARGUMENTS
        assert tool["tool_call_id"] == call.call_id == sent_call["id"]


@pytest.mark.usefixtures("tools_on")
def test_a_streamed_tool_call(gw: Gateway) -> None:
    events = list(
        _openai(gw).responses.create(model=MODEL, input="weather?", tools=[WEATHER], stream=True)
    )
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call"
    assert (added.item.name, added.item.arguments) == ("get_weather", "")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == ARGUMENTS
    final = events[-1]
    assert final.type == "response.completed"
    assert [item.type for item in final.response.output] == ["function_call"]


def test_namespace_and_custom_tools_come_back_under_the_clients_names(
    gw: Gateway, emulator: Emulator
) -> None:
    emulator.config.tool_call = True
    namespace: Any = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "agents",
        "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}],
    }
    custom: Any = {"type": "custom", "name": "apply_patch", "description": "Edit files."}
    client = _openai(gw)
    emulator.config.tool_arguments = {"task": "x"}
    [call] = client.responses.create(model=MODEL, input="go", tools=[namespace, custom]).output
    assert call.type == "function_call"
    assert (call.name, call.namespace, json.loads(call.arguments)) == (
        "spawn",
        "multi_agent_v1",
        {"task": "x"},
    )
    sent = emulator.state.records[-1].body["tools"]
    assert [t["function"]["name"] for t in sent] == ["multi_agent_v1__spawn", "apply_patch"]

    emulator.config.tool_arguments = {"input": "*** Begin Patch"}
    [edit] = client.responses.create(model=MODEL, input="go", tools=[custom, namespace]).output
    assert edit.type == "custom_tool_call"
    assert (edit.name, edit.input) == ("apply_patch", "*** Begin Patch")


def test_json_output(gw: Gateway, emulator: Emulator) -> None:
    response = _openai(gw).responses.create(
        model=MODEL, input="hi", text={"format": {"type": "json_object"}}
    )
    assert json.loads(response.output_text) == {"answer": " ".join(f"tok{i}" for i in range(16))}
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["format"] == "json"
    else:
        assert sent["response_format"] == {"type": "json_object"}
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    shaped = _openai(gw).responses.create(
        model=MODEL,
        input="hi",
        text={"format": {"type": "json_schema", "name": "place", "schema": schema}},
    )
    assert set(json.loads(shaped.output_text)) == {"city"}


def test_an_image_reaches_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    image = "data:image/png;base64,iVBO"
    response = _openai(gw).responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": image, "detail": "auto"},
                ],
            }
        ],
    )
    assert response.output_text == TEXT
    [message] = emulator.state.records[-1].body["messages"]
    if _dialect(gw) == "ollama":
        assert message == {"role": "user", "content": "what is this?", "images": ["iVBO"]}
    else:
        assert message["content"][1] == {
            "type": "image_url",
            "image_url": {"url": image, "detail": "auto"},
        }


def test_thinking_is_a_reasoning_item(gw: Gateway, emulator: Emulator) -> None:
    emulator.config.thinking_tokens = 3
    client = _openai(gw)
    response = client.responses.create(model=MODEL, input="hi", reasoning={"effort": "high"})
    reasoning, message = response.output
    assert reasoning.type == "reasoning"
    assert [s.text for s in reasoning.summary] == [THINKING]
    assert message.type == "message"
    assert response.output_text == TEXT
    assert response.usage is not None
    assert response.usage.output_tokens == 19  # thinking tokens are output tokens
    assert response.usage.output_tokens_details.reasoning_tokens == 3
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["think"] == "high"
    else:
        assert sent["reasoning_effort"] == "high"
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    deltas = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    assert "".join(deltas) == THINKING
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]


def test_a_mid_stream_failure_is_an_error_event_then_response_failed(
    gw: Gateway, emulator: Emulator
) -> None:
    emulator.config.fault = "error_midstream"
    events = list(_openai(gw).responses.create(model=MODEL, input="hi", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert failed.response.error.message == events[-2].message


def test_refusals_are_the_sdks_typed_errors(gw: Gateway) -> None:
    with pytest.raises(openai.AuthenticationError):
        _openai(gw, "gw_wrong_key").responses.create(model=MODEL, input="hi")
    _, narrow = gw.create_key("narrow", models=["qwen2.5:7b"])
    with pytest.raises(openai.PermissionDeniedError):
        _openai(gw, narrow).responses.create(model=MODEL, input="hi")
    client = _openai(gw)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="hi")
    with pytest.raises(openai.UnprocessableEntityError, match="input"):
        client.responses.create(model=MODEL, input=[])
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    _, slow = gw.create_key("slow", rpm=1)
    _openai(gw, slow).responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.RateLimitError) as limited:
        _openai(gw, slow).responses.create(model=MODEL, input="hi")
    assert int(limited.value.response.headers["retry-after"]) >= 1
    assert limited.value.code == "rate_limit_exceeded"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_batch_of_responses_lines(make_gateway: Callable[..., Gateway], dialect: str) -> None:
    gw = make_gateway(upstream_dialect=dialect, **FAST)
    client = _openai(gw)
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 5}
    lines = [batch_line(f"r-{i}", body, "/v1/responses") for i in range(3)]
    lines.append(batch_line("bad", {"model": MODEL, "input": []}, "/v1/responses"))
    refused = client.batches.create(
        input_file_id=upload_lines(client, lines),
        endpoint="/v1/responses",  # type: ignore[arg-type]
        completion_window="24h",
    )
    failed = wait_batch(client, refused.id)
    assert failed.status == "failed"
    assert failed.errors is not None
    assert [(e.line, e.code) for e in failed.errors.data or []] == [(4, "invalid_request")]
    batch = client.batches.create(
        input_file_id=upload_lines(client, lines[:3]),
        endpoint="/v1/responses",  # type: ignore[arg-type]
        completion_window="24h",
    )
    done = wait_batch(client, batch.id)
    assert done.status == "completed", done
    output = read_jsonl(client, done.output_file_id)
    assert sorted(str(o["custom_id"]) for o in output) == ["r-0", "r-1", "r-2"]
    for item in output:
        response: Any = item["response"]
        assert response["status_code"] == 200
        answer = response["body"]
        assert answer["object"] == "response"
        assert answer["status"] == "incomplete"  # max_output_tokens reached
        assert answer["output"][0]["content"][0]["text"] == "tok0 tok1 tok2 tok3 tok4 "
        assert answer["usage"]["output_tokens"] == 5
