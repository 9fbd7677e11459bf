"""The real `anthropic` SDK through a real gateway, in front of both upstream dialects.

`/v1/messages` is translated into a chat request (`gateway.api.anthropic.schema`) and goes to
the emulator's `/api/chat` or `/v1/chat/completions`; what the SDK reads back must be what the
upstream generated, with the upstream's token counts, and refusals must raise the SDK's typed
exceptions with Anthropic's error body.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.client import MODEL_ALIAS as MODEL
from tests.support.client import opened
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.clients

TEXT = "".join(f"tok{i} " for i in range(16))  # what the emulator generates by default
THINKING = "think0 think1 think2 "
MESSAGES: Any = [{"role": "user", "content": "hi"}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
ARGUMENTS = {"city": "Tokyo", "days": 3}
IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGAAAAAFAAFd"  # PNG bytes


def _client(gw: Gateway, key: str | None = None) -> Any:
    # No retries: a refusal must surface as the first answer's typed error.
    client = anthropic.Anthropic(base_url=gw.url, api_key=key or gw.key, max_retries=0)
    return opened.enter_context(client)


def _dialect(gw: Gateway) -> str:
    return str(gw.settings.upstream_dialect)


def test_create_and_stream_give_the_upstreams_text_and_counts(gw: Gateway) -> None:
    client = _client(gw)
    message = client.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES)
    assert message.id.startswith("msg_")
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL)
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == TEXT
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 16)

    with client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == TEXT
    assert len(pieces) == 16  # one delta per upstream token: not buffered
    assert final.content[0].text == TEXT
    assert final.stop_reason == "end_turn"
    # message_start knows no input count yet; message_delta's replaces it.
    assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 16)

    events = list(
        client.messages.create(model=MODEL, max_tokens=100, messages=MESSAGES, stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    text = metric_value(gw.metrics_text(), "gateway_requests_total", route="/v1/messages")
    assert text == 3


def test_the_stream_is_anthropic_framed_with_a_ping(gw: Gateway) -> None:
    body = {"model": MODEL, "max_tokens": 5, "messages": MESSAGES, "stream": True}
    with httpx.stream(
        "POST", f"{gw.url}/v1/messages?beta=true", json=body, headers=gw.headers()
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read()
    events = raw.split(b"\n\n")
    assert events[-1] == b""
    names = [event.split(b"\n")[0] for event in events[:-1]]
    assert names[:2] == [b"event: message_start", b"event: ping"]
    assert names[-2:] == [b"event: message_delta", b"event: message_stop"]
    delta = json.loads(events[-3].split(b"\ndata: ")[1])
    assert delta["delta"]["stop_reason"] == "max_tokens"  # max_tokens 5 < the 16 tokens


def test_a_tool_use_and_tool_result_round_trip(gw: Gateway, emulator: Emulator) -> None:
    emulator.config.tool_call = True
    emulator.config.tool_arguments = ARGUMENTS
    client = _client(gw)
    asked = "weather in Tokyo?"
    first: Any = [{"role": "user", "content": asked}]
    message = client.messages.create(model=MODEL, max_tokens=100, messages=first, tools=[WEATHER])
    assert message.stop_reason == "tool_use"
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert (call.name, call.input) == ("get_weather", ARGUMENTS)
    assert call.id
    with client.messages.stream(
        model=MODEL, max_tokens=100, messages=first, tools=[WEATHER]
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
        ("get_weather", ARGUMENTS)
    ]

    emulator.config.tool_call = False
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 25 C"}
    turns: Any = [
        *first,
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": [result]},
    ]
    answer = client.messages.create(model=MODEL, max_tokens=100, messages=turns, tools=[WEATHER])
    assert answer.content[0].text == TEXT
    sent = emulator.state.records[-1].body
    tool = sent["messages"][-1]
    assert (tool["role"], tool["content"]) == ("tool", "sunny, 25 C")
    if _dialect(gw) == "ollama":
        assert tool["tool_name"] == "get_weather"
        assert sent["messages"][-2]["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
    else:
        assert tool["tool_call_id"] == call.id
        assert sent["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]


def test_thinking_comes_back_as_thinking_blocks(gw: Gateway, emulator: Emulator) -> None:
    emulator.config.thinking_tokens = 3
    client = _client(gw)
    thinking: Any = {"type": "enabled", "budget_tokens": 2048}
    message = client.messages.create(
        model=MODEL, max_tokens=100, messages=MESSAGES, thinking=thinking
    )
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == (THINKING, TEXT)
    assert message.usage.output_tokens == 19  # thinking tokens are output tokens
    sent = emulator.state.records[-1].body
    assert sent.get("think" if _dialect(gw) == "ollama" else "reasoning_effort") == "low"
    with client.messages.stream(
        model=MODEL, max_tokens=100, messages=MESSAGES, thinking=thinking
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert (final.content[0].thinking, final.content[1].text) == (THINKING, TEXT)


def test_an_image_reaches_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    source = {"type": "base64", "media_type": "image/png", "data": IMAGE}
    content: Any = [{"type": "image", "source": source}, {"type": "text", "text": "what?"}]
    message = _client(gw).messages.create(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": content}]
    )
    assert message.content[0].text == TEXT
    [sent] = emulator.state.records[-1].body["messages"]
    if _dialect(gw) == "ollama":
        assert sent == {"role": "user", "content": "what?", "images": [IMAGE]}
    else:
        url = f"data:image/png;base64,{IMAGE}"
        assert sent["content"][0] == {"type": "image_url", "image_url": {"url": url}}


def test_a_claude_code_shaped_body_is_accepted(gw: Gateway, emulator: Emulator) -> None:
    """What Claude Code sends beside the basics (reference: agent-clients.md) is no error."""
    body = {
        "model": MODEL,
        "max_tokens": 32000,
        "stream": False,
        "temperature": None,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": '{"session": "x"}'},
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
            {"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {**WEATHER, "cache_control": {"type": "ephemeral"}},
            {"name": "Later", "input_schema": {"type": "object"}, "defer_loading": True},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": "a reminder"},
        ],
    }
    headers = {
        "x-api-key": gw.key,  # Claude Code's header with ANTHROPIC_API_KEY
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    }
    answer = httpx.post(f"{gw.url}/v1/messages?beta=true", json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["content"][0]["text"] == TEXT
    sent = emulator.state.records[-1].body
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["system", "user", "system"]
    names = [tool["function"]["name"] for tool in sent["tools"]]
    assert names == ["get_weather", "Later"]  # the server tool is left out
    # Adaptive thinking is the model's default: a forced `think` fails models that cannot think.
    assert "think" not in sent
    assert "reasoning_effort" not in sent


def test_refusals_raise_the_sdks_typed_errors_with_anthropics_body(gw: Gateway) -> None:
    with pytest.raises(anthropic.AuthenticationError) as wrong:
        _client(gw, "gw_nope_nope").messages.create(model=MODEL, max_tokens=5, messages=MESSAGES)
    assert wrong.value.status_code == 401
    assert wrong.value.body == {"type": "error", "error": wrong.value.body["error"]}
    assert wrong.value.body["error"]["type"] == "authentication_error"

    _, narrow = gw.create_key("narrow", models=["qwen2.5:7b"])
    with pytest.raises(anthropic.PermissionDeniedError) as forbidden:
        _client(gw, narrow).messages.create(model=MODEL, max_tokens=5, messages=MESSAGES)
    assert forbidden.value.body["error"]["type"] == "permission_error"
    with pytest.raises(anthropic.PermissionDeniedError):
        _client(gw, narrow).messages.count_tokens(model=MODEL, messages=MESSAGES)

    with pytest.raises(anthropic.NotFoundError) as unknown:
        _client(gw).messages.create(model="nope", max_tokens=5, messages=MESSAGES)
    assert unknown.value.body["error"]["type"] == "not_found_error"

    # The SDK itself insists on max_tokens; Anthropic's API answers 400 without it.
    body = {"model": MODEL, "messages": MESSAGES}
    bad = httpx.post(f"{gw.url}/v1/messages", headers=gw.headers(), json=body)
    assert bad.status_code == 400
    assert bad.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }

    nowhere = httpx.post(f"{gw.url}/v1/messages/nope", headers=gw.headers(), json={})
    assert nowhere.status_code == 404
    assert nowhere.json()["error"]["type"] == "not_found_error"


def test_a_rate_limit_raises_rate_limit_error_with_retry_after(gw: Gateway) -> None:
    _, key = gw.create_key("slow", rpm=1)
    _client(gw, key).messages.create(model=MODEL, max_tokens=5, messages=MESSAGES)
    with pytest.raises(anthropic.RateLimitError) as raised:
        _client(gw, key).messages.create(model=MODEL, max_tokens=5, messages=MESSAGES)
    assert int(raised.value.response.headers["retry-after"]) >= 1
    assert raised.value.body["error"]["type"] == "rate_limit_error"
    with pytest.raises(anthropic.RateLimitError):  # count_tokens counts against the RPM too
        _client(gw, key).messages.count_tokens(model=MODEL, messages=MESSAGES)


def test_a_prompt_over_the_keys_whole_tpm_is_a_400_that_says_so(gw: Gateway) -> None:
    """Anthropic's "prompt is too long" is a 400 `invalid_request_error`; a 413 would be shown
    by Claude Code as its own "Request too large (max 32MB) ... images" text instead."""
    _, key = gw.create_key("small", tpm=100)
    long: Any = [{"role": "user", "content": "word " * 400}]  # about 500 tokens
    with pytest.raises(anthropic.BadRequestError) as raised:
        _client(gw, key).messages.create(model=MODEL, max_tokens=5, messages=long)
    assert raised.value.status_code == 400
    error = raised.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert "100 tokens per minute" in error["message"]
    # The same prompt on the OpenAI surface keeps its 413.
    body = {"model": MODEL, "max_tokens": 5, "messages": long}
    headers = {"Authorization": f"Bearer {key}"}
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers)
    assert answer.status_code == 413
    metrics = gw.metrics_text()
    assert (
        metric_value(metrics, "gateway_requests_total", route="/v1/messages", outcome="bad_request")
        == 1
    )


def test_count_tokens_is_a_marked_estimate_outside_the_tpm(gw: Gateway) -> None:
    _, key = gw.create_key("tiny", tpm=10)
    client = _client(gw, key)
    long: Any = [{"role": "user", "content": "word " * 200}]
    counted = client.messages.count_tokens(model=MODEL, messages=long)
    assert counted.input_tokens >= 250  # 1,000 bytes of prompt, 4 bytes a token
    raw = client.messages.with_raw_response.count_tokens(model=MODEL, messages=MESSAGES)
    assert raw.headers["x-gateway-token-count"] == "estimate"
    assert 0 < raw.parse().input_tokens < 20


def test_a_midstream_failure_is_an_error_event(gw: Gateway, emulator: Emulator) -> None:
    emulator.config.fault = "error_midstream"
    emulator.config.fault_after = 3
    body = {"model": MODEL, "max_tokens": 100, "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{gw.url}/v1/messages", json=body, headers=gw.headers()) as response:
        assert response.status_code == 200
        raw = response.read()
    last = raw.split(b"\n\n")[-2]
    assert last.startswith(b"event: error\ndata: ")
    assert b"api_error" in last
    assert b"message_stop" not in raw
    client = _client(gw)
    with (
        pytest.raises(anthropic.APIStatusError),
        client.messages.stream(model=MODEL, max_tokens=100, messages=MESSAGES) as stream,
    ):
        list(stream.text_stream)
