"""The `openai` dialect: request translation, and Ollama-shaped answers over real sockets."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.upstream.dialects.openai import SseDecoder
from gateway.upstream.dialects.openai_request import to_openai_request
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway


def test_generate_becomes_a_chat_completion_with_system_and_options():
    path, payload = to_openai_request(
        "generate",
        {
            "model": "m",
            "prompt": "why?",
            "system": "be brief",
            "options": {"temperature": 0.1, "num_predict": 20, "top_k": 5, "stop": ["\n"]},
            "format": "json",
        },
    )
    assert path == "/v1/chat/completions"
    assert payload["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "why?"},
    ]
    assert payload["stream"] is True
    assert payload["stream_options"] == {"include_usage": True}
    assert payload["max_tokens"] == 20
    assert payload["temperature"] == 0.1
    assert payload["top_k"] == 5
    assert payload["stop"] == ["\n"]
    assert payload["response_format"] == {"type": "json_object"}


def test_raw_generate_becomes_a_completion_without_a_token_limit():
    path, payload = to_openai_request("generate", {"model": "m", "prompt": "abc", "raw": True})
    assert path == "/v1/completions"
    assert payload["prompt"] == "abc"
    assert payload["max_tokens"] is None  # Ollama's default is no limit, not 16


def test_chat_translates_images_and_native_tool_calls():
    _, payload = to_openai_request(
        "chat",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "see", "images": ["aGk="]},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
                },
                {"role": "tool", "content": "42", "tool_name": "f"},
            ],
            "format": {"type": "object"},
        },
    )
    user, assistant, tool = payload["messages"]
    assert user["content"][1]["image_url"]["url"] == "data:image/png;base64,aGk="
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]  # the call, not its name
    assert payload["response_format"]["json_schema"]["schema"] == {"type": "object"}


@pytest.fixture
def openai_gateway(make_gateway) -> Gateway:
    return make_gateway(upstream_dialect="openai")


def _lines(response: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def _post(gw: Gateway, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{gw.url}{path}", json=body, headers=gw.headers(), timeout=30)


@pytest.mark.parametrize("omit_usage", [False, True])
def test_stream_is_translated_into_ollama_chunks_with_a_final_metrics_chunk(
    openai_gateway: Gateway, emulator: Emulator, omit_usage
):
    """F-17: token counts are right whether or not the upstream sends usage."""
    emulator.config.tokens = 6
    emulator.config.omit_usage = omit_usage
    response = _post(
        openai_gateway,
        "/v1/chat",
        {"model": "llama3.2:latest", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = _lines(response)
    content = [line for line in lines if not line["done"]]
    assert len(content) == 6
    assert all(line["message"]["role"] == "assistant" for line in content)
    final = lines[-1]
    assert final["done"] is True
    assert final["done_reason"] == "stop"
    assert final["eval_count"] == 6
    assert final["eval_duration"] > 0
    assert final["total_duration"] >= final["eval_duration"]
    assert (final.get("prompt_eval_count") == 12) is not omit_usage
    [record] = [r for r in emulator.state.records if r.path == "/v1/chat/completions"]
    assert record.body["stream_options"] == {"include_usage": True}
    text = openai_gateway.metrics_text()
    assert metric_value(text, "gateway_output_tokens_total") == 6


def test_durations_nest_when_the_stream_ends_right_after_its_last_token(monkeypatch):
    """The extrapolated decode time never exceeds what the total leaves after prefill.

    Seen in CI: six tokens, the first one 0.1 s after sending, then gaps of 0.2 s, and
    [DONE] at once: 6/5 of the measured span (1.2 s) overshot the 1.1 s the total had
    left, and `total_duration < eval_duration` broke Ollama's nesting (section 9.1).
    """
    clock = iter([0.1, 0.3, 0.5, 0.7, 0.9, 1.1, 1.1])
    monkeypatch.setattr("gateway.upstream.dialects.openai.time.perf_counter", lambda: next(clock))
    decoder = SseDecoder(started=0.0, sent=0.0)
    events = b"".join(b'data: {"choices":[{"delta":{"content":"t"}}]}\n\n' for _ in range(6))
    [*content, final] = decoder.feed(events + b"data: [DONE]\n\n")
    assert len(content) == 6
    stats = final.stats
    assert stats.total_duration == 1_100_000_000
    assert stats.prompt_eval_duration == 100_000_000
    assert stats.eval_duration == 1_000_000_000  # capped: 1.2 s extrapolated
    assert stats.prompt_eval_duration + stats.eval_duration <= stats.total_duration


def test_eval_duration_is_the_measured_decode_rate_when_it_fits(monkeypatch):
    """With time left after the last token, eval_count / eval_duration is the chunk rate."""
    clock = iter([0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 3.0])
    monkeypatch.setattr("gateway.upstream.dialects.openai.time.perf_counter", lambda: next(clock))
    decoder = SseDecoder(started=0.0, sent=0.0)
    events = b"".join(b'data: {"choices":[{"delta":{"content":"t"}}]}\n\n' for _ in range(6))
    final = decoder.feed(events + b"data: [DONE]\n\n")[-1]
    assert final.stats.eval_duration == pytest.approx(600_000_000, abs=10)  # 6 tokens at 10/s


def test_generate_without_streaming_returns_one_ollama_object(
    openai_gateway: Gateway, emulator: Emulator
):
    emulator.config.tokens = 4
    body = {"model": "llama3.2:latest", "prompt": "x", "stream": False}
    result = _post(openai_gateway, "/v1/generate", body).json()
    assert result["done"] is True
    assert result["response"].strip()
    assert result["eval_count"] == 4


def test_num_predict_limits_tokens_and_reports_length(openai_gateway: Gateway, emulator: Emulator):
    emulator.config.tokens = 10
    body = {"model": "llama3.2:latest", "prompt": "x", "options": {"num_predict": 3}}
    lines = _lines(_post(openai_gateway, "/v1/generate", body))
    assert lines[-1]["done_reason"] == "length"
    assert lines[-1]["eval_count"] == 3


@pytest.mark.parametrize("fault", ["error_midstream", "drop_midstream", "eof_without_done"])
def test_a_stream_without_done_marker_ends_with_an_error_line(
    openai_gateway: Gateway, emulator: Emulator, fault
):
    """Reference section 4.4: a missing `data: [DONE]` is the only sign of a mid-stream error."""
    emulator.config.fault = fault
    emulator.config.fault_after = 3
    lines = _lines(
        _post(openai_gateway, "/v1/generate", {"model": "llama3.2:latest", "prompt": "x"})
    )
    assert len(lines) == 4
    assert set(lines[-1]) == {"error"}
    assert not any(line.get("done") for line in lines)


def test_upstream_error_object_before_start_is_passed_on_in_ollama_shape(
    openai_gateway: Gateway, emulator: Emulator
):
    emulator.config.fault = "not_found"
    response = _post(openai_gateway, "/v1/generate", {"model": "llama3.2:latest", "prompt": "x"})
    assert response.status_code == 404
    assert isinstance(response.json()["error"], str)


def test_models_come_from_the_upstream_v1_models(openai_gateway: Gateway):
    data = httpx.get(f"{openai_gateway.url}/v1/models", headers=openai_gateway.headers()).json()
    assert {m["id"] for m in data["data"]} == {"llama3.2:latest", "qwen2.5:7b"}
    assert httpx.get(f"{openai_gateway.url}/readyz").status_code == 200
