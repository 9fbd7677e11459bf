"""The fields real apps rely on, through a real gateway, with the real client packages.

Embeddings, tools, thinking, JSON formats, sampling fields, images and logprobs: the `ollama`
Client, the `openai` SDK and LangChain's chat and embedding classes send them on both surfaces,
to the emulator speaking Ollama's native API or its OpenAI-compatible one. Each must reach the
model (`emulator.state.records[-1].body`, translated for the other family) and come back as
each client reads it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import ollama
import openai
import pytest

from gateway.testing.emulator.embed import normalize, raw_vector
from tests.support.client import MODEL_ALIAS as MODEL
from tests.support.client import opened
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.clients

MESSAGES: Any = [{"role": "user", "content": "hi"}]  # Any: the SDKs type messages as TypedDicts
DIMENSIONS = 8  # the emulator's default vector length


def _dialect(gw: Gateway) -> str:
    return str(gw.settings.upstream_dialect)


def _ollama(gw: Gateway, key: str | None = None) -> ollama.Client:
    client = ollama.Client(host=gw.url, headers=gw.headers(key))
    opened.enter_context(client)
    return client


def _openai(gw: Gateway, key: str | None = None) -> openai.OpenAI:
    # No retries: a refusal must surface as the first answer's typed error.
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key or gw.key, max_retries=0)
    return opened.enter_context(client)


def _embedding(text: str) -> list[float]:
    """The emulator's normalized vector for `text` (what `/api/embed` and `/v1` answer)."""
    return normalize(raw_vector(text, DIMENSIONS))


def _close(vector: list[float], expected: list[float]) -> bool:
    return vector == pytest.approx(expected, rel=1e-6, abs=1e-7)


def _norm(vector: list[float]) -> float:
    return math.sqrt(sum(value * value for value in vector))


# --- embeddings -----------------------------------------------------------------------------


def test_ollama_client_embed_one_and_many_inputs(gw: Gateway) -> None:
    client = _ollama(gw)
    one = client.embed(model=MODEL, input="hello world")
    assert len(one.embeddings) == 1
    assert _close(list(one.embeddings[0]), _embedding("hello world"))
    assert one.prompt_eval_count == 2  # the emulator counts words
    many = client.embed(model=MODEL, input=["hello world", "bye"])
    assert [len(vector) for vector in many.embeddings] == [DIMENSIONS, DIMENSIONS]
    assert _close(list(many.embeddings[1]), _embedding("bye"))
    assert many.prompt_eval_count == 3
    short = client.embed(model=MODEL, input="hello", dimensions=4)
    assert len(short.embeddings[0]) == 4
    assert _norm(list(short.embeddings[0])) == pytest.approx(1.0, rel=1e-5)


def test_ollama_client_legacy_embeddings(gw: Gateway, emulator: Emulator) -> None:
    answer = _ollama(gw).embeddings(model=MODEL, prompt="hello")
    vector = list(answer.embedding)
    assert len(vector) == DIMENSIONS
    if _dialect(gw) == "ollama":
        assert emulator.state.records[-1].path == "/api/embeddings"
        assert _close(vector, raw_vector("hello", DIMENSIONS))  # legacy: unnormalized (6.6)
    else:
        sent = emulator.state.records[-1]
        assert (sent.path, sent.body["input"]) == ("/v1/embeddings", "hello")
        assert _close(vector, _embedding("hello"))  # the upstream's own vector


def test_openai_sdk_embeddings_float_base64_and_dimensions(gw: Gateway) -> None:
    client = _openai(gw)
    floats = client.embeddings.create(model=MODEL, input=["a b", "c"], encoding_format="float")
    assert [item.index for item in floats.data] == [0, 1]
    assert _close(floats.data[0].embedding, _embedding("a b"))
    assert _close(floats.data[1].embedding, _embedding("c"))
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (3, 3)
    # The SDK's default asks for base64 and decodes it: the same float32 values.
    body = {"model": MODEL, "input": "c", "encoding_format": "base64"}
    raw = httpx.post(f"{gw.url}/v1/embeddings", json=body, headers=gw.headers()).json()
    assert isinstance(raw["data"][0]["embedding"], str)
    decoded = client.embeddings.create(model=MODEL, input=["a b", "c"])
    for base64_item, float_item in zip(decoded.data, floats.data, strict=True):
        assert _close(base64_item.embedding, float_item.embedding)
    assert decoded.usage.prompt_tokens == 3
    short = client.embeddings.create(model=MODEL, input="a b", dimensions=3)
    assert len(short.data[0].embedding) == 3
    assert _norm(short.data[0].embedding) == pytest.approx(1.0, rel=1e-5)


def test_an_empty_openai_input_string_is_one_text(gw: Gateway, emulator: Emulator) -> None:
    """OpenAI embeds "" as one text; so does Ollama's /v1 (reference section 7.4)."""
    answer = _openai(gw).embeddings.create(model=MODEL, input="", encoding_format="float")
    assert len(answer.data) == 1
    assert _close(answer.data[0].embedding, _embedding(""))
    if _dialect(gw) == "ollama":
        assert emulator.state.records[-1].body["input"] == [""]


def test_langchain_embeddings_through_the_gateway(gw: Gateway) -> None:
    from langchain_ollama import OllamaEmbeddings
    from langchain_openai import OpenAIEmbeddings

    native = OllamaEmbeddings(model=MODEL, base_url=gw.url, client_kwargs={"headers": gw.headers()})
    assert native._client is not None
    opened.callback(native._client.close)
    assert _close(native.embed_query("hello"), _embedding("hello"))
    documents = native.embed_documents(["a b", "c"])
    assert _close(documents[1], _embedding("c"))
    compatible = OpenAIEmbeddings(  # type: ignore[call-arg]  # base_url, api_key: aliases
        model=MODEL,
        base_url=f"{gw.url}/v1",
        api_key=gw.key,
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    opened.callback(compatible.client._client.close)
    assert _close(compatible.embed_query("hello"), _embedding("hello"))
    assert _close(compatible.embed_documents(["a b", "c"])[0], _embedding("a b"))


@pytest.mark.parametrize("surface", ["ollama", "openai"])
def test_embeddings_count_input_tokens(gw: Gateway, surface: str) -> None:
    if surface == "ollama":
        _ollama(gw).embed(model=MODEL, input=["one two", "three"])
        route = "/api/embed"
    else:
        _openai(gw).embeddings.create(model=MODEL, input=["one two", "three"])
        route = "/v1/embeddings"
    text = gw.metrics_text()
    assert metric_value(text, "gateway_requests_total", route=route, outcome="completed") == 1
    assert metric_value(text, "gateway_input_tokens_total") == 3
    assert metric_value(text, "gateway_output_tokens_total") == 0


def test_a_forbidden_embedding_model_raises_permission_errors(gw: Gateway) -> None:
    _, key = gw.create_key("narrow", models=["qwen2.5:7b"])
    with pytest.raises(openai.PermissionDeniedError):
        _openai(gw, key).embeddings.create(model=MODEL, input="hi")
    with pytest.raises(ollama.ResponseError) as refused:
        _ollama(gw, key).embed(model=MODEL, input="hi")
    assert refused.value.status_code == 403
    with pytest.raises(ollama.ResponseError) as legacy:
        _ollama(gw, key).embeddings(model=MODEL, prompt="hi")
    assert legacy.value.status_code == 403


def test_invalid_embedding_inputs_are_refused_before_the_upstream(
    gw: Gateway, emulator: Emulator
) -> None:
    client = _openai(gw)
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(model=MODEL, input=[])
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(model=MODEL, input=[[1, 2, 3]])  # token arrays
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input="hi", encoding_format="int8")  # type: ignore[arg-type]
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(model=MODEL, input="hi", dimensions=0)
    response = httpx.post(
        f"{gw.url}/api/embed", headers=gw.headers(), json={"model": MODEL, "input": [1]}
    )
    assert response.status_code == 422
    assert response.json() == {"error": "invalid input type"}
    with pytest.raises(ollama.ResponseError) as refused:
        _ollama(gw).embed(model=MODEL, input="hi", dimensions=-1)
    assert refused.value.status_code == 422
    assert not [r for r in emulator.state.records if "embed" in r.path]


def test_an_empty_ollama_embed_input_answers_no_vectors(gw: Gateway, emulator: Emulator) -> None:
    """Ollama answers an empty input with no vectors, after loading the model (section 6.6)."""
    from langchain_ollama import OllamaEmbeddings

    client = _ollama(gw)
    empties: tuple[list[str], str] = ([], "")
    for empty in empties:
        answer = client.embed(model=MODEL, input=empty)
        assert (answer.embeddings, answer.prompt_eval_count) == ([], None)
    assert list(client.embeddings(model=MODEL, prompt="").embedding) == []
    native = OllamaEmbeddings(model=MODEL, base_url=gw.url, client_kwargs={"headers": gw.headers()})
    assert native._client is not None
    opened.callback(native._client.close)
    assert native.embed_documents([]) == []  # a pipeline's empty batch
    assert emulator.state.records[-1].path.endswith(
        "/embed" if _dialect(gw) == "ollama" else "/embeddings"
    )
    text = gw.metrics_text()
    assert metric_value(text, "gateway_input_tokens_total") == 0


# --- tools ----------------------------------------------------------------------------------

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
ARGUMENTS = {"city": "Tokyo", "days": 3}


@pytest.fixture
def tools_on(emulator: Emulator) -> None:
    """The emulator answers a chat that offers tools with a call to the first one."""
    emulator.config.tool_call = True
    emulator.config.tool_arguments = ARGUMENTS


@pytest.mark.usefixtures("tools_on")
def test_ollama_client_gets_tool_calls_with_object_arguments(
    gw: Gateway, emulator: Emulator
) -> None:
    client = _ollama(gw)
    answer = client.chat(model=MODEL, messages=MESSAGES, tools=[WEATHER])
    assert answer.message.tool_calls is not None
    [call] = answer.message.tool_calls
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", ARGUMENTS)
    assert answer.done_reason == "stop"
    assert emulator.state.records[-1].body["tools"] == [WEATHER]
    parts = list(client.chat(model=MODEL, messages=MESSAGES, tools=[WEATHER], stream=True))
    calls = [c for part in parts for c in part.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", ARGUMENTS)
    ]
    assert parts[-1].done


@pytest.mark.usefixtures("tools_on")
def test_openai_sdk_gets_tool_calls_with_json_string_arguments(
    gw: Gateway, emulator: Emulator
) -> None:
    client = _openai(gw)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER],
        stream=False,
    )
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.id
    assert call.function.name == "get_weather"
    assert isinstance(call.function.arguments, str)
    assert json.loads(call.function.arguments) == ARGUMENTS
    assert emulator.state.records[-1].body["tools"] == [WEATHER]

    events = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=[WEATHER],
            stream=True,
        )
    )
    # What the SDK's users do: accumulate the deltas' fragments by index.
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    ids: dict[int, str] = {}
    for event in events:
        for delta in (event.choices[0].delta.tool_calls or []) if event.choices else []:
            if delta.id:
                ids[delta.index] = delta.id
            if delta.function is not None:
                names[delta.index] = names.get(delta.index, "") + (delta.function.name or "")
                arguments[delta.index] = arguments.get(delta.index, "") + (
                    delta.function.arguments or ""
                )
    assert names == {0: "get_weather"}
    assert json.loads(arguments[0]) == ARGUMENTS
    assert ids[0]
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == "tool_calls"


@pytest.mark.usefixtures("tools_on")
def test_the_openai_sdk_stream_helper_accumulates_the_same_call(gw: Gateway) -> None:
    with _openai(gw).chat.completions.stream(
        model=MODEL,
        messages=MESSAGES,
        tools=[WEATHER],
    ) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.usefixtures("tools_on")
def test_langchain_bind_tools_gets_tool_calls(gw: Gateway) -> None:
    from langchain_ollama import ChatOllama
    from langchain_openai import ChatOpenAI

    native = ChatOllama(model=MODEL, base_url=gw.url, client_kwargs={"headers": gw.headers()})
    opened.callback(native._client.close)
    answer = native.bind_tools([WEATHER]).invoke("weather in Tokyo?")
    assert [(c["name"], c["args"]) for c in answer.tool_calls] == [("get_weather", ARGUMENTS)]
    compatible = ChatOpenAI(model=MODEL, base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0)
    opened.callback(compatible.root_client.close)
    reply = compatible.bind_tools([WEATHER]).invoke("weather in Tokyo?")
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("get_weather", ARGUMENTS)]
    assert reply.tool_calls[0]["id"]
    streamed: Any = None
    for part in compatible.bind_tools([WEATHER]).stream("weather in Tokyo?"):
        streamed = part if streamed is None else streamed + part
    assert streamed is not None
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [("get_weather", ARGUMENTS)]


_CALL_ID = "call_abc12345"


def test_an_openai_tool_result_turn_reaches_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    _openai(gw).chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "weather in Tokyo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": _CALL_ID,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": _CALL_ID, "content": "sunny, 25 C"},
        ],
        tools=[WEATHER],
    )
    sent = emulator.state.records[-1].body
    assert sent["tools"] == [WEATHER]
    user, assistant, tool = sent["messages"]
    if _dialect(gw) == "ollama":  # translated (reference section 3.1)
        assert user == {"role": "user", "content": "weather in Tokyo?"}
        assert assistant["role"] == "assistant"
        assert assistant["content"] == ""
        assert assistant["tool_calls"] == [
            {"id": _CALL_ID, "function": {"name": "get_weather", "arguments": ARGUMENTS}}
        ]
        assert tool["role"] == "tool"
        assert tool["content"] == "sunny, 25 C"
        assert tool["tool_call_id"] == _CALL_ID
        assert tool["tool_name"] == "get_weather"  # Ollama matches a result by the tool's name
    else:  # passed through as sent
        assert assistant["tool_calls"][0]["function"]["arguments"] == json.dumps(ARGUMENTS)
        assert tool == {"role": "tool", "tool_call_id": _CALL_ID, "content": "sunny, 25 C"}


def test_an_ollama_tool_result_turn_reaches_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    _ollama(gw).chat(
        model=MODEL,
        messages=[
            {"role": "user", "content": "weather in Tokyo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": ARGUMENTS}}],
            },
            {"role": "tool", "content": "sunny, 25 C", "tool_name": "get_weather"},
        ],
        tools=[WEATHER],
    )
    sent = emulator.state.records[-1].body
    assert sent["tools"] == [WEATHER]
    _, assistant, tool = sent["messages"]
    if _dialect(gw) == "ollama":  # the client's own body
        assert assistant["tool_calls"][0]["function"]["arguments"] == ARGUMENTS
        assert tool["tool_name"] == "get_weather"
    else:  # translated: arguments a JSON string, the result tied to the call's id
        [call] = assistant["tool_calls"]
        assert call["type"] == "function"
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == ARGUMENTS
        assert tool["role"] == "tool"
        assert tool["content"] == "sunny, 25 C"
        assert tool["tool_call_id"] == call["id"]


# --- thinking -------------------------------------------------------------------------------

TEXT = "".join(f"tok{i} " for i in range(16))  # what the emulator generates by default
THINKING = "think0 think1 think2 "


@pytest.fixture
def thinking_on(emulator: Emulator) -> None:
    """The emulator thinks three tokens before it answers."""
    emulator.config.thinking_tokens = 3


@pytest.mark.usefixtures("thinking_on")
def test_ollama_client_gets_thinking_streamed_and_not(gw: Gateway) -> None:
    client = _ollama(gw)
    chat = client.chat(model=MODEL, messages=MESSAGES, think=True)
    assert (chat.message.thinking, chat.message.content) == (THINKING, TEXT)
    parts = list(client.chat(model=MODEL, messages=MESSAGES, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == THINKING
    assert "".join(p.message.content or "" for p in parts) == TEXT
    generated = client.generate(model=MODEL, prompt="hi", think=True)
    assert (generated.thinking, generated.response) == (THINKING, TEXT)
    pieces = list(client.generate(model=MODEL, prompt="hi", think=True, stream=True))
    assert "".join(p.thinking or "" for p in pieces) == THINKING
    assert "".join(p.response or "" for p in pieces) == TEXT
    assert pieces[-1].eval_count == 19  # thinking tokens are output tokens (section 2.3)


@pytest.mark.usefixtures("thinking_on")
def test_langchain_chat_ollama_gets_the_reasoning(gw: Gateway) -> None:
    from langchain_ollama import ChatOllama

    native = ChatOllama(
        model=MODEL, base_url=gw.url, client_kwargs={"headers": gw.headers()}, reasoning=True
    )
    opened.callback(native._client.close)
    reply = native.invoke("hi")
    assert (reply.content, reply.additional_kwargs["reasoning_content"]) == (TEXT, THINKING)


@pytest.mark.usefixtures("thinking_on")
def test_openai_surface_sends_reasoning_content(gw: Gateway) -> None:
    body = {"model": MODEL, "messages": MESSAGES}
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers())
    message = answer.json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (THINKING, TEXT)
    assert answer.json()["usage"]["completion_tokens"] == 19
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/chat/completions",
        json={**body, "stream": True},
        headers=gw.headers(),
    ) as response:
        events = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")
        ]
    deltas = [event["choices"][0]["delta"] for event in events if event["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == THINKING
    assert "".join(d.get("content") or "" for d in deltas) == TEXT
    assert deltas[0]["role"] == "assistant"


@pytest.mark.parametrize(("think", "effort"), [("high", "high"), (False, "none")])
def test_ollama_think_reaches_the_upstream(
    gw: Gateway, emulator: Emulator, think: bool | str, effort: str
) -> None:
    client = _ollama(gw)
    client.chat(model=MODEL, messages=MESSAGES, think=think)
    chat = emulator.state.records[-1].body
    client.generate(model=MODEL, prompt="hi", think=think)
    generate = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert (chat["think"], generate["think"]) == (think, think)
    else:  # both become chat completions (module docstring of gateway.upstream.dialects.openai)
        assert (chat["reasoning_effort"], generate["reasoning_effort"]) == (effort, effort)


def test_openai_reasoning_effort_reaches_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    _openai(gw).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        reasoning_effort="low",
    )
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["think"] == "low"
    else:
        assert sent["reasoning_effort"] == "low"


# --- JSON mode and schemas ------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "warm": {"type": "boolean"}},
    "required": ["city", "warm"],
    "additionalProperties": False,
}
SAMPLE = {"city": "emulated", "warm": True}  # what the emulator generates for SCHEMA
JSON_ANSWER = {"answer": " ".join(f"tok{i}" for i in range(16))}  # its `format: "json"` answer


def test_openai_json_object_mode(gw: Gateway, emulator: Emulator) -> None:
    chat = _openai(gw).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format={"type": "json_object"},
    )
    assert json.loads(chat.choices[0].message.content or "") == JSON_ANSWER
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["format"] == "json"
        assert "response_format" not in sent
    else:
        assert sent["response_format"] == {"type": "json_object"}


def test_openai_json_schema_mode(gw: Gateway, emulator: Emulator) -> None:
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
    }
    chat = _openai(gw).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format=response_format,
    )
    assert json.loads(chat.choices[0].message.content or "") == SAMPLE
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["format"] == SCHEMA
    else:
        assert sent["response_format"] == response_format


def test_openai_sdk_parse_with_a_pydantic_model(gw: Gateway) -> None:
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        warm: bool

    completion = _openai(gw).chat.completions.parse(
        model=MODEL,
        messages=MESSAGES,
        response_format=Weather,
    )
    assert completion.choices[0].message.parsed == Weather(city="emulated", warm=True)


def test_langchain_structured_output(gw: Gateway, emulator: Emulator) -> None:
    from langchain_ollama import ChatOllama
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        warm: bool

    native = ChatOllama(model=MODEL, base_url=gw.url, client_kwargs={"headers": gw.headers()})
    opened.callback(native._client.close)
    expected = Weather(city="emulated", warm=True)
    assert native.with_structured_output(Weather).invoke("weather?") == expected
    sent = emulator.state.records[-1].body
    schema = sent["format"] if _dialect(gw) == "ollama" else sent["response_format"]
    assert "city" in json.dumps(schema)
    compatible = ChatOpenAI(model=MODEL, base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0)
    opened.callback(compatible.root_client.close)
    assert compatible.with_structured_output(Weather).invoke("weather?") == expected


@pytest.mark.parametrize("operation", ["chat", "generate"])
def test_ollama_format_json_and_schema(gw: Gateway, emulator: Emulator, operation: str) -> None:
    client = _ollama(gw)

    def ask(fmt: Any) -> str:
        if operation == "chat":
            return client.chat(model=MODEL, messages=MESSAGES, format=fmt).message.content or ""
        return client.generate(model=MODEL, prompt="hi", format=fmt).response or ""

    assert json.loads(ask("json")) == JSON_ANSWER
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["format"] == "json"
    else:
        assert sent["response_format"] == {"type": "json_object"}
    assert json.loads(ask(SCHEMA)) == SAMPLE
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["format"] == SCHEMA
    else:
        assert sent["response_format"]["type"] == "json_schema"
        assert sent["response_format"]["json_schema"]["schema"] == SCHEMA


# --- sampling fields, keep_alive, options ---------------------------------------------------

OPTIONS = {
    "temperature": 0.2,
    "top_p": 0.5,
    "top_k": 3,
    "seed": 7,
    "stop": ["\n\n"],
    "num_predict": 5,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.3,
}
SAMPLING = {
    "temperature": 0.2,
    "top_p": 0.5,
    "top_k": 3,
    "seed": 7,
    "stop": ["\n\n"],
    "max_tokens": 5,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.3,
}


@pytest.mark.parametrize("operation", ["chat", "generate"])
def test_ollama_options_and_keep_alive_reach_the_upstream(
    gw: Gateway, emulator: Emulator, operation: str
) -> None:
    client = _ollama(gw)
    if operation == "chat":
        answer: Any = client.chat(model=MODEL, messages=MESSAGES, options=OPTIONS, keep_alive="10m")
        text = answer.message.content
    else:
        answer = client.generate(model=MODEL, prompt="hi", options=OPTIONS, keep_alive="10m")
        text = answer.response
    assert (text, answer.done_reason, answer.eval_count) == (
        "tok0 tok1 tok2 tok3 tok4 ",
        "length",
        5,
    )
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":  # the client's own fields, untouched
        assert sent["options"] == OPTIONS
        assert sent["keep_alive"] == "10m"
    else:
        assert {k: sent[k] for k in SAMPLING} == SAMPLING
        assert "keep_alive" not in sent  # no OpenAI counterpart
        assert "options" not in sent


def test_ollama_keep_alive_numbers_reach_an_ollama_upstream_untouched(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    client = _ollama(make_gateway(upstream_dialect="ollama"))
    for keep_alive in (-1, 300, "1h30m", 0):
        client.chat(model=MODEL, messages=MESSAGES, keep_alive=keep_alive)
        assert emulator.state.records[-1].body["keep_alive"] == keep_alive
    client.embed(model=MODEL, input="hi", keep_alive="2m")
    assert emulator.state.records[-1].body["keep_alive"] == "2m"


def test_openai_sampling_fields_reach_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    chat = _openai(gw).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0.2,
        top_p=0.5,
        seed=7,
        stop="\n\n",
        max_tokens=5,
        presence_penalty=0.1,
        frequency_penalty=0.3,
    )
    assert chat.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 "
    assert chat.choices[0].finish_reason == "length"
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["options"] == {
            "temperature": 0.2,
            "top_p": 0.5,
            "seed": 7,
            "stop": ["\n\n"],  # Ollama's `stop` is a list (section 2.2)
            "num_predict": 5,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.3,
        }
    else:
        assert sent["stop"] == "\n\n"
        assert (sent["temperature"], sent["top_p"], sent["seed"], sent["max_tokens"]) == (
            0.2,
            0.5,
            7,
            5,
        )


def test_openai_max_completion_tokens_limits_the_answer(gw: Gateway, emulator: Emulator) -> None:
    chat = _openai(gw).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=3,
    )
    assert chat.choices[0].message.content == "tok0 tok1 tok2 "
    assert chat.choices[0].finish_reason == "length"
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["options"]["num_predict"] == 3
    else:  # also as `max_tokens`, which Ollama's /v1 (reference section 7.1) reads
        assert (sent["max_completion_tokens"], sent["max_tokens"]) == (3, 3)


def test_langchain_max_tokens_and_stop_reach_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    from langchain_ollama import ChatOllama
    from langchain_openai import ChatOpenAI

    compatible = ChatOpenAI(
        model=MODEL, base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0, max_tokens=3
    )
    opened.callback(compatible.root_client.close)
    assert (
        compatible.invoke("hi", stop=["\n\n"]).content == "tok0 tok1 tok2 "
    )  # sent as max_completion_tokens
    native = ChatOllama(
        model=MODEL,
        base_url=gw.url,
        client_kwargs={"headers": gw.headers()},
        num_predict=2,
        temperature=0.1,
        keep_alive="3m",
    )
    opened.callback(native._client.close)
    assert native.invoke("hi", stop=["\n\n"]).content == "tok0 tok1 "
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert (sent["options"]["num_predict"], sent["options"]["stop"]) == (2, ["\n\n"])
        assert sent["keep_alive"] == "3m"
    else:
        assert (sent["max_tokens"], sent["stop"], sent["temperature"]) == (2, ["\n\n"], 0.1)


def test_openai_completion_stop_string_reaches_the_upstream(
    gw: Gateway, emulator: Emulator
) -> None:
    _openai(gw).completions.create(model=MODEL, prompt="hi", stop="\n", max_tokens=2, seed=1)
    sent = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert sent["options"] == {"stop": ["\n"], "num_predict": 2, "seed": 1}
    else:
        assert (sent["stop"], sent["max_tokens"], sent["seed"]) == ("\n", 2, 1)


# --- images ---------------------------------------------------------------------------------

IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGAAAAAFAAFd"  # PNG bytes
IMAGE_URL = f"data:image/png;base64,{IMAGE}"


def test_ollama_images_reach_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    client = _ollama(gw)
    client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "what is this?", "images": [IMAGE]}],
    )
    chat = emulator.state.records[-1].body
    client.generate(model=MODEL, prompt="what is this?", images=[IMAGE])
    generate = emulator.state.records[-1].body
    if _dialect(gw) == "ollama":
        assert chat["messages"][0]["images"] == [IMAGE]
        assert generate["images"] == [IMAGE]
    else:
        parts = [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": IMAGE_URL}},
        ]
        assert chat["messages"] == [{"role": "user", "content": parts}]
        assert generate["messages"] == [{"role": "user", "content": parts}]


def test_openai_image_url_parts_reach_the_upstream(gw: Gateway, emulator: Emulator) -> None:
    content: Any = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": IMAGE_URL, "detail": "low"}},
    ]
    _openai(gw).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
    )
    [message] = emulator.state.records[-1].body["messages"]
    if _dialect(gw) == "ollama":
        assert message == {"role": "user", "content": "what is this?", "images": [IMAGE]}
    else:
        assert message == {"role": "user", "content": content}


def test_a_remote_image_url_cannot_reach_an_ollama_upstream(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    """Ollama takes only inline `data:` images (reference section 7.1): the client's 4xx."""
    content: Any = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    with pytest.raises(openai.UnprocessableEntityError):
        _openai(make_gateway(upstream_dialect="ollama")).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": content}],
        )
    assert not [r for r in emulator.state.records if r.path == "/api/chat"]


# --- logprobs -------------------------------------------------------------------------------


def test_openai_logprobs_come_back_streamed_and_not(gw: Gateway, emulator: Emulator) -> None:
    client = _openai(gw)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        logprobs=True,
        top_logprobs=2,
        max_tokens=3,
    )
    sent = emulator.state.records[-1].body
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)
    logprobs = chat.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert [entry.token for entry in logprobs.content] == ["tok0 ", "tok1 ", "tok2 "]
    assert all(entry.logprob < 0 for entry in logprobs.content)
    assert [len(entry.top_logprobs) for entry in logprobs.content] == [2, 2, 2]
    assert logprobs.content[0].top_logprobs[0].token == "tok0 "
    events = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            logprobs=True,
            top_logprobs=2,
            max_tokens=3,
            stream=True,
        )
    )
    tokens = [
        entry.token
        for event in events
        if event.choices and event.choices[0].logprobs
        for entry in event.choices[0].logprobs.content or []
    ]
    assert tokens == ["tok0 ", "tok1 ", "tok2 "]


def test_openai_logprobs_without_alternatives_have_an_empty_list(gw: Gateway) -> None:
    """OpenAI's `top_logprobs` is a list even when none were asked for; Ollama omits it."""
    chat = _openai(gw).chat.completions.create(
        model=MODEL, messages=MESSAGES, logprobs=True, max_tokens=2
    )
    assert chat.choices[0].logprobs is not None
    content = chat.choices[0].logprobs.content or []
    assert [(entry.token, entry.top_logprobs) for entry in content] == [
        ("tok0 ", []),
        ("tok1 ", []),
    ]


def test_ollama_logprobs_come_back_streamed_and_not(gw: Gateway, emulator: Emulator) -> None:
    client = _ollama(gw)
    chat = client.chat(
        model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=2, options={"num_predict": 3}
    )
    sent = emulator.state.records[-1].body
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)
    assert chat.logprobs is not None
    assert [entry.token for entry in chat.logprobs] == ["tok0 ", "tok1 ", "tok2 "]
    assert [len(entry.top_logprobs or []) for entry in chat.logprobs] == [2, 2, 2]
    parts = list(
        client.chat(
            model=MODEL,
            messages=MESSAGES,
            logprobs=True,
            top_logprobs=2,
            options={"num_predict": 3},
            stream=True,
        )
    )
    assert [entry.token for part in parts for entry in part.logprobs or []] == [
        "tok0 ",
        "tok1 ",
        "tok2 ",
    ]
