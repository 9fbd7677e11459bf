"""The real client packages through a real gateway, in front of both upstream dialects.

`ollama` (Client with a key header), the `openai` SDK, and LangChain's ChatOllama and
ChatOpenAI talk to a gateway on a loopback port, in front of the emulator speaking Ollama's
native API or its OpenAI-compatible one. Every combination must give the same text and the
same counts, streamed and not, and refusals must raise each SDK's own typed exception.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import ollama
import openai
import pytest

from tests.support.client import MODEL_ALIAS as MODEL
from tests.support.client import opened
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.clients

TEXT = "".join(f"tok{i} " for i in range(16))  # what the emulator generates by default
MESSAGES = [{"role": "user", "content": "hi"}]


def _ollama(gw: Gateway, key: str | None = None) -> ollama.Client:
    return opened.enter_context(ollama.Client(host=gw.url, headers=gw.headers(key)))


def _openai(gw: Gateway, key: str | None = None) -> openai.OpenAI:
    # No retries: a refusal must surface as the first answer's typed error.
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key or gw.key, max_retries=0)
    return opened.enter_context(client)


def test_ollama_client_generate_and_chat_streamed_and_not(gw: Gateway) -> None:
    client = _ollama(gw)
    answer = client.generate(model=MODEL, prompt="hi")
    assert (answer.response, answer.done, answer.eval_count) == (TEXT, True, 16)
    parts = list(client.generate(model=MODEL, prompt="hi", stream=True))
    assert "".join(p.response for p in parts) == TEXT
    assert parts[-1].done
    assert parts[-1].eval_count == 16
    assert parts[-1].eval_duration
    assert parts[-1].eval_duration > 0

    chat = client.chat(model=MODEL, messages=MESSAGES)
    assert (chat.message.role, chat.message.content, chat.eval_count) == ("assistant", TEXT, 16)
    streamed = list(client.chat(model=MODEL, messages=MESSAGES, stream=True))
    assert "".join(p.message.content or "" for p in streamed) == TEXT
    assert streamed[-1].done_reason == "stop"


def test_openai_sdk_chat_and_completions_streamed_and_not(gw: Gateway) -> None:
    client = _openai(gw)
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.content == TEXT
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage is not None
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (12, 16)

    events = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert events[0].choices[0].delta.role == "assistant"
    assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == TEXT
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == "stop"
    assert events[-1].choices == []
    assert events[-1].usage is not None
    assert events[-1].usage.completion_tokens == 16
    assert len({e.id for e in events}) == 1

    plain = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))  # type: ignore[arg-type]
    assert all(e.usage is None for e in plain)  # no usage event unless asked for

    completion = client.completions.create(model=MODEL, prompt="hi", max_tokens=5)
    assert completion.object == "text_completion"
    assert completion.choices[0].text == "tok0 tok1 tok2 tok3 tok4 "  # max_tokens reached it
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.total_tokens == 12 + 5
    texts = [
        e.choices[0].text
        for e in client.completions.create(model=MODEL, prompt="hi", stream=True)
        if e.choices
    ]
    assert "".join(texts) == TEXT


def test_the_sse_stream_is_openai_framed(gw: Gateway) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    with httpx.stream(
        "POST", f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers()
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read()
    events = raw.split(b"\n\n")
    assert events[-1] == b""  # every event ends with its blank line
    assert events[-2] == b"data: [DONE]"
    assert all(event.startswith(b"data: {") for event in events[:-2])


@pytest.mark.parametrize("surface", ["ollama", "openai"])
def test_metrics_count_each_surface_under_its_own_route(gw: Gateway, surface: str) -> None:
    if surface == "ollama":
        _ollama(gw).chat(model=MODEL, messages=MESSAGES)
        route = "/api/chat"
    else:
        _openai(gw).chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        route = "/v1/chat/completions"
    text = gw.metrics_text()
    assert metric_value(text, "gateway_requests_total", route=route, outcome="completed") == 1
    # A fresh gateway per test: the per-model series hold this one request.
    assert metric_value(text, "gateway_time_to_first_token_seconds_count") == 1
    assert metric_value(text, "gateway_output_tokens_total") == 16


def test_wrong_key_raises_each_clients_typed_error(gw: Gateway) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        _openai(gw, "gw_nope_nope").chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert raised.value.status_code == 401
    assert raised.value.code == "invalid_api_key"
    with pytest.raises(ollama.ResponseError) as refused:
        _ollama(gw, "gw_nope_nope").chat(model=MODEL, messages=MESSAGES)
    assert refused.value.status_code == 401


def test_a_forbidden_model_raises_permission_errors(gw: Gateway) -> None:
    _, key = gw.create_key("narrow", models=["qwen2.5:7b"])
    with pytest.raises(openai.PermissionDeniedError):
        _openai(gw, key).chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(ollama.ResponseError) as refused:
        _ollama(gw, key).generate(model=MODEL, prompt="hi")
    assert refused.value.status_code == 403
    assert [m.id for m in _openai(gw, key).models.list()] == ["qwen2.5:7b"]


def test_a_rate_limit_raises_rate_limit_errors_with_retry_after(gw: Gateway) -> None:
    _, key = gw.create_key("slow", rpm=1)
    _openai(gw, key).chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as raised:
        _openai(gw, key).chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
    assert int(raised.value.response.headers["retry-after"]) >= 1
    assert raised.value.code == "rate_limit_exceeded"
    with pytest.raises(ollama.ResponseError) as refused:
        _ollama(gw, key).chat(model=MODEL, messages=MESSAGES)
    assert refused.value.status_code == 429


def test_unknown_models_and_routes_are_openai_not_found_errors(gw: Gateway) -> None:
    client = _openai(gw)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    assert client.models.retrieve("llama3.2:latest").id == "llama3.2:latest"
    assert client.models.retrieve("LLAMA3.2").id == "llama3.2:latest"  # as the allow-list matches
    response = httpx.post(f"{gw.url}/v1/nope", headers=gw.headers(), json={})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_bad_bodies_are_openai_errors_with_the_right_status(gw: Gateway) -> None:
    client = _openai(gw)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model=MODEL, messages=[])
    response = httpx.post(
        f"{gw.url}/v1/chat/completions",
        headers={**gw.headers(), "content-type": "application/json"},
        content=b"{not json",
    )
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_mid_stream_failure_is_an_sse_error_event_and_the_stream_ends(
    gw: Gateway, emulator: Emulator
) -> None:
    emulator.config.fault = "error_midstream"
    stream = _openai(gw).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    # An Ollama upstream's error line arrives as its message; an OpenAI-compatible one (like
    # Ollama's /v1, reference section 4.4) just ends the stream without data: [DONE].
    failure = f"{emulator.config.fault_message}|before data: \\[DONE\\]"
    with pytest.raises(openai.APIError, match=failure):
        for _ in stream:
            pass
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    raw = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers()).content
    last = raw.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b'data: {"error":')
    assert b"data: [DONE]" not in raw.split(b"\n\n")
    with pytest.raises(ollama.ResponseError, match=failure):
        list(_ollama(gw).chat(model=MODEL, messages=MESSAGES, stream=True))


def test_langchain_chat_models_stream_through_the_gateway(gw: Gateway) -> None:
    from langchain_ollama import ChatOllama
    from langchain_openai import ChatOpenAI

    native = ChatOllama(model=MODEL, base_url=gw.url, client_kwargs={"headers": gw.headers()})
    opened.callback(native._client.close)
    assert native.invoke("hi").content == TEXT
    assert "".join(str(part.content) for part in native.stream("hi")) == TEXT
    compatible = ChatOpenAI(model=MODEL, base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0)  # type: ignore[arg-type]
    opened.callback(compatible.root_client.close)
    answer = compatible.invoke("hi")
    assert answer.content == TEXT
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == 16
    assert "".join(str(part.content) for part in compatible.stream("hi")) == TEXT


def test_openai_fields_reach_an_ollama_upstream_translated(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    gw = make_gateway(upstream_dialect="ollama")
    _openai(gw).chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                ],
            },
        ],
        max_tokens=7,
        temperature=0.2,
        seed=3,
        stop=["\n"],
        response_format={"type": "json_object"},
    )
    sent = emulator.state.records[-1]
    assert sent.path == "/api/chat"
    assert sent.body["stream"] is True
    assert sent.body["options"] == {"num_predict": 7, "temperature": 0.2, "seed": 3, "stop": ["\n"]}
    assert sent.body["format"] == "json"
    assert sent.body["messages"][1] == {
        "role": "user",
        "content": "what is this?",
        "images": ["iVBO"],
    }


def test_openai_bodies_pass_through_to_an_openai_upstream(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    gw = make_gateway(upstream_dialect="openai")
    _openai(gw).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=7,
        top_p=0.5,
        user="u1",  # type: ignore[arg-type]
    )
    sent = emulator.state.records[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert (sent.body["max_tokens"], sent.body["top_p"], sent.body["user"]) == (7, 0.5, "u1")
