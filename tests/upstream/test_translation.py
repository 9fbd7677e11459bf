"""Request translation between the surfaces and the dialects, field by field (pure functions).

`gateway.upstream.dialects.ollama_request` (OpenAI body -> Ollama) and
`gateway.upstream.dialects.openai_request`
(Ollama body -> OpenAI), and the codecs that fold chunks into answers. The client tests in
`tests/clients/` show the same fields end to end; these pin the rules.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.api.ollama.codec import NdjsonCodec
from gateway.neutral import Chunk, GenerationRequest, Operation, Surface
from gateway.upstream.dialects.ollama_request import to_ollama_request
from gateway.upstream.dialects.openai import OpenAIDialect
from gateway.upstream.dialects.openai_request import to_openai_request


def _request(surface: Surface, operation: Operation, **body: Any) -> GenerationRequest:
    body = {"model": "m", **body}
    return GenerationRequest(surface=surface, operation=operation, body=body, model="m")


# --- OpenAI body -> Ollama ------------------------------------------------------------------


def test_a_stop_string_becomes_ollamas_stop_list() -> None:
    messages = [{"role": "user", "content": "hi"}]
    _, chat = to_ollama_request(_request("openai", "chat", messages=messages, stop="\n"))
    assert chat["options"]["stop"] == ["\n"]
    _, completion = to_ollama_request(_request("openai", "generate", prompt="a", stop="END"))
    assert completion["options"]["stop"] == ["END"]
    _, listed = to_ollama_request(_request("openai", "chat", messages=messages, stop=["a", "b"]))
    assert listed["options"]["stop"] == ["a", "b"]


def test_an_openai_tool_result_names_its_tool_for_ollama() -> None:
    """Ollama ties a result to its tool by `tool_name`; OpenAI's names only the call id."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "go", "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "tool", "tool_call_id": "call_9", "content": "?"},  # no such call
        {"role": "tool", "tool_call_id": "call_1", "name": "g", "content": "named"},
    ]
    _, payload = to_ollama_request(_request("openai", "chat", messages=messages))
    user, assistant, tool, unknown, named = payload["messages"]
    assert user == {"role": "user", "content": "go"}  # a participant's name is no tool's
    assert assistant["tool_calls"] == [{"id": "call_1", "function": {"name": "f", "arguments": {}}}]
    assert tool == {"role": "tool", "content": "42", "tool_call_id": "call_1", "tool_name": "f"}
    assert "tool_name" not in unknown
    assert named["tool_name"] == "g"  # the message's own name first, as Ollama reads it


# --- Ollama body -> OpenAI ------------------------------------------------------------------


def _call(name: str, **extra: Any) -> dict[str, Any]:
    return {"function": {"name": name, "arguments": {"x": 1}}, **extra}


def test_ollama_tool_results_answer_their_calls_by_id() -> None:
    """OpenAI ties a result to its call's id; Ollama's by the tool's name, or by position."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [_call("f"), _call("g")]},
        {"role": "tool", "content": "from g", "tool_name": "g"},
        {"role": "tool", "content": "from f", "tool_name": "f"},
        {"role": "assistant", "content": "", "tool_calls": [_call("f"), _call("f", id="c9")]},
        {"role": "tool", "content": "first"},  # older clients: no name, in call order
        {"role": "tool", "content": "by id", "tool_call_id": "c9"},
    ]
    _, payload = to_openai_request("chat", {"model": "m", "messages": messages})
    _, first, g, f, second, unnamed, by_id = payload["messages"]
    ids = [call["id"] for call in first["tool_calls"] + second["tool_calls"]]
    assert ids == ["call_0", "call_1", "call_2", "c9"]  # unique in the conversation
    assert first["tool_calls"][1]["function"] == {"name": "g", "arguments": '{"x":1}'}
    assert (g["tool_call_id"], f["tool_call_id"]) == ("call_1", "call_0")
    assert (unnamed["tool_call_id"], by_id["tool_call_id"]) == ("call_2", "c9")
    assert g == {"role": "tool", "content": "from g", "tool_call_id": "call_1"}


def test_think_becomes_reasoning_effort_for_chat_and_generate() -> None:
    routes: tuple[tuple[Operation, str], ...] = (("chat", "messages"), ("generate", "prompt"))
    for route, field in routes:
        body: dict[str, Any] = {"model": "m", field: [] if route == "chat" else "hi"}
        assert to_openai_request(route, {**body, "think": "high"})[1]["reasoning_effort"] == "high"
        assert to_openai_request(route, {**body, "think": False})[1]["reasoning_effort"] == "none"
        assert "reasoning_effort" not in to_openai_request(route, {**body, "think": True})[1]
    raw = {"model": "m", "prompt": "hi", "raw": True, "think": "low"}
    assert "reasoning_effort" not in to_openai_request("generate", raw)[1]  # /v1/completions


# --- the openai dialect's pass-through ------------------------------------------------------


def _openai_body(request: GenerationRequest) -> dict[str, Any]:
    call = OpenAIDialect().build_request(request, {})
    body: dict[str, Any] = json.loads(call.content)
    return body


def test_max_completion_tokens_also_reaches_an_openai_upstream_as_max_tokens() -> None:
    """The surface's one bound goes out under both names (tests/limits/test_output_bounds.py)."""
    from gateway.api.openai.schema import parse_chat
    from gateway.settings import Settings

    def sent(**fields: Any) -> dict[str, Any]:
        raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})
        return _openai_body(parse_chat(raw.encode(), Settings()))

    newer = sent(max_completion_tokens=3)
    assert (newer["max_completion_tokens"], newer["max_tokens"]) == (3, 3)
    both = sent(max_completion_tokens=3, max_tokens=5)
    assert (both["max_completion_tokens"], both["max_tokens"]) == (5, 5)  # the larger, reserved
    assert "max_tokens" not in sent()


# --- the codecs: chunks folded into answers -------------------------------------------------


def _logprob(token: str) -> dict[str, Any]:
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}


def test_ollama_answers_keep_every_chunks_logprobs() -> None:
    """Ollama's `stream:false` answer carries the logprobs of all chunks (section 2.4)."""
    request = _request("ollama", "chat", messages=[], stream=False)
    native = [
        Chunk(text="a", logprobs=[_logprob("a")], native={"message": {"content": "a"}}),
        Chunk(text="b", logprobs=[_logprob("b")], native={"message": {"content": "b"}}),
        Chunk(done=True, native={"message": {"content": ""}, "done": True}),
    ]
    built = [Chunk(text=c.text, logprobs=c.logprobs, done=c.done) for c in native]  # from /v1
    for chunks in (native, built):
        codec = NdjsonCodec(request)
        for chunk in chunks:
            codec.add(chunk)
        answer = json.loads(codec.result())
        assert [entry["token"] for entry in answer["logprobs"]] == ["a", "b"]
        assert answer["message"]["content"] == "ab"
    line = json.loads(NdjsonCodec(request).encode(built[:1]))  # a line built for a /v1 chunk
    assert line["logprobs"] == [_logprob("a")]
    plain = NdjsonCodec(request)
    plain.add(Chunk(done=True))
    assert "logprobs" not in json.loads(plain.result())


def test_an_empty_ollama_embed_input_loads_an_openai_upstreams_model_and_embeds_nothing() -> None:
    """Ollama's empty input loads the model and answers no vectors (reference section 6.6)."""
    dialect = OpenAIDialect()
    for body, legacy in (({"input": []}, False), ({"input": ""}, False), ({"prompt": ""}, True)):
        request = GenerationRequest("ollama", "embed", {"model": "m", **body}, "m", legacy=legacy)
        sent = json.loads(dialect.build_request(request, {}).content)
        assert sent["input"] == [" "]  # OpenAI-compatible servers refuse an empty input
        decoder = dialect.decoder(request, 0.0, 0.0)
        decoder.feed(b'{"data": [{"index": 0, "embedding": [0.5]}], "usage": {"prompt_tokens": 1}}')
        [chunk] = decoder.end()
        assert (chunk.done, chunk.embeddings, chunk.stats) == (True, [], None)
    request = GenerationRequest("ollama", "embed", {"model": "m", "input": []}, "m")
    decoder = dialect.decoder(request, 0.0, 0.0)
    decoder.feed(b'{"error": {"message": "model not found"}}')
    assert decoder.end()[0].error == "model not found"
    asked = GenerationRequest("ollama", "embed", {"model": "m", "input": ["a"]}, "m")
    assert json.loads(dialect.build_request(asked, {}).content)["input"] == ["a"]


def test_an_empty_openai_input_string_reaches_ollama_as_one_text() -> None:
    """OpenAI embeds "" as one text, Ollama's /api/embed as none (sections 6.6, 7.4)."""
    assert to_ollama_request(_request("openai", "embed", input=""))[1]["input"] == [""]
    assert to_ollama_request(_request("openai", "embed", input=["a"]))[1]["input"] == ["a"]
    assert to_ollama_request(_request("openai", "embed", input="a"))[1]["input"] == "a"
