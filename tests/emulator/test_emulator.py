"""The Ollama emulator over real sockets: wire shapes, timing, gates, faults and disconnects."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from gateway.testing.emulator.app import (
    ReceivedRequest,
    create_emulator_app,
    main,
)
from gateway.testing.server import LoopbackServer
from tests.support.emulator import fast_config

pytestmark = pytest.mark.anyio

GENERATE = {"model": "llama3.2", "prompt": "Why is the sky blue?"}
CHAT = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}
KEY_EXPECTED = "looking for beginning of object key string"
VALUE_EXPECTED = "looking for beginning of value"
GENERATE_TYPE = "Go value of type api.GenerateRequest"
METRICS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


def ndjson(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line]


def sse(text: str) -> list[str]:
    assert text.endswith("\n\n")
    events = text.removesuffix("\n\n").split("\n\n")
    assert all(event.startswith("data: ") for event in events)
    return [event.removeprefix("data: ") for event in events]


async def wait_ended(record: ReceivedRequest) -> bool:
    """Wait up to 1 s, off the event loop, for the emulator to notice the end."""
    return await anyio.to_thread.run_sync(record.wait_ended, 1.0)


async def read_lines(response: httpx.Response, into: list[str]) -> None:
    async for line in response.aiter_lines():
        into.append(line)


# --- endpoints and shapes ---------------------------------------------------------------------


async def test_metadata_endpoints_answer_like_ollama(client: httpx.AsyncClient):
    root = await client.get("/")
    assert (root.status_code, root.text) == (200, "Ollama is running")
    assert root.headers["content-type"] == "text/plain; charset=utf-8"
    head = await client.head("/")
    assert (head.status_code, head.content) == (200, b"")
    assert (await client.get("/api/version")).json() == {"version": "0.33.0"}

    tags = (await client.get("/api/tags")).json()["models"]
    assert [model["name"] for model in tags] == ["llama3.2:latest", "qwen2.5:7b"]
    assert set(tags[0]) == {"name", "model", "modified_at", "size", "digest", "details"}
    assert tags[0]["details"]["format"] == "gguf"
    ps = (await client.get("/api/ps")).json()["models"]
    assert {"size", "size_vram", "expires_at", "context_length"} <= set(ps[0])

    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert models["data"][0] == {
        **models["data"][0],
        "id": "llama3.2:latest",
        "owned_by": "library",
    }


async def test_v1_models_data_is_null_without_models(client: httpx.AsyncClient, state):
    state.config.models = []
    assert (await client.get("/v1/models")).json() == {"object": "list", "data": None}
    assert (await client.get("/api/tags")).json() == {"models": []}


async def test_generate_streams_tokens_then_a_final_chunk_with_ns_metrics(client):
    response = await client.post("/api/generate", json=GENERATE)
    assert response.headers["content-type"] == "application/x-ndjson"
    assert "content-length" not in response.headers  # chunked
    lines = ndjson(response.text)
    assert len(lines) == 7
    assert [line["response"] for line in lines[:6]] == [f"tok{i} " for i in range(6)]
    assert all(line["done"] is False and line["model"] == "llama3.2" for line in lines[:6])
    assert lines[0]["created_at"].endswith("Z")
    final = lines[-1]
    assert list(final)[:6] == ["model", "created_at", "response", "done", "done_reason", "context"]
    assert (final["response"], final["done"], final["done_reason"]) == ("", True, "stop")
    assert final["context"] == list(range(1, 12 + 6 + 1))
    assert all(isinstance(final[name], int) and final[name] > 0 for name in METRICS)
    assert final["eval_count"] == 6
    assert final["prompt_eval_count"] == 12
    # Go-style compact JSON on the wire
    assert response.text.startswith('{"model":"llama3.2","created_at":"')


async def test_chat_streams_assistant_messages_without_context(client):
    lines = ndjson((await client.post("/api/chat", json=CHAT)).text)
    assert lines[0]["message"] == {"role": "assistant", "content": "tok0 "}
    assert lines[-1]["message"] == {"role": "assistant", "content": ""}
    assert lines[-1]["done_reason"] == "stop"
    assert "context" not in lines[-1]


async def test_zero_metrics_are_omitted(client, state):
    state.config = fast_config(tokens=0, prompt_eval_count=0, load_duration_ns=0)
    [final] = ndjson((await client.post("/api/generate", json=GENERATE)).text)
    assert set(final) & set(METRICS) == {"total_duration", "prompt_eval_duration"}


async def test_headers_wait_for_the_first_chunk_and_chunks_are_paced(client, state):
    state.config = fast_config(ttft=0.15, inter_token=0.03, tokens=5)
    start = time.monotonic()
    async with client.stream("POST", "/api/generate", json=GENERATE) as response:
        headers_at = time.monotonic() - start
        arrivals, lines = [], []
        async for line in response.aiter_lines():
            arrivals.append(time.monotonic() - start)
            lines.append(json.loads(line))
    assert headers_at >= 0.14
    assert arrivals[0] >= 0.14
    assert arrivals[-1] - arrivals[0] >= 0.12  # 5 inter-token gaps of 30 ms, not one burst
    final = lines[-1]
    assert final["prompt_eval_duration"] + final["load_duration"] == pytest.approx(0.15e9, abs=4e7)
    assert final["eval_duration"] == pytest.approx(5 * 0.03e9, abs=4e7)
    parts = final["load_duration"] + final["prompt_eval_duration"] + final["eval_duration"]
    assert final["total_duration"] >= parts
    [record] = state.records
    assert record.first_byte_at is not None
    assert record.first_byte_at - record.started_at >= 0.15


async def test_non_stream_answers_aggregate_text_and_thinking(client, state):
    state.config = fast_config(tokens=3, thinking_tokens=2)
    response = await client.post("/api/chat", json={**CHAT, "stream": False})
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    body = response.json()
    assert body["message"] == {
        "role": "assistant",
        "content": "tok0 tok1 tok2 ",
        "thinking": "think0 think1 ",
    }
    assert (body["done"], body["done_reason"], body["eval_count"]) == (True, "stop", 5)
    generated = (await client.post("/api/generate", json={**GENERATE, "stream": False})).json()
    assert generated["response"] == "tok0 tok1 tok2 "
    assert "context" in generated


async def test_num_predict_truncates_and_reports_length(client):
    body = {**GENERATE, "options": {"num_predict": 3}}
    lines = ndjson((await client.post("/api/generate", json=body)).text)
    assert len(lines) == 4
    assert (lines[-1]["done_reason"], lines[-1]["eval_count"]) == ("length", 3)


async def test_thinking_chunks_and_empty_first_chunk_come_before_content(client, state):
    state.config = fast_config(tokens=2, thinking_tokens=2, empty_first_chunk=True)
    lines = ndjson((await client.post("/api/generate", json=GENERATE)).text)
    assert [(line["response"], line.get("thinking")) for line in lines[:5]] == [
        ("", None),
        ("", "think0 "),
        ("", "think1 "),
        ("tok0 ", None),
        ("tok1 ", None),
    ]
    assert lines[-1]["eval_count"] == 4


@pytest.mark.parametrize(
    ("path", "body", "reason"),
    [
        ("/api/generate", {"model": "llama3.2"}, "load"),
        ("/api/generate", {"model": "llama3.2", "prompt": "", "keep_alive": 0}, "unload"),
        ("/api/chat", {"model": "llama3.2", "messages": []}, "load"),
    ],
)
async def test_empty_prompt_or_messages_only_load(client, path, body, reason):
    response = await client.post(path, json=body)
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    answer = response.json()
    assert (answer["done"], answer["done_reason"]) == (True, reason)
    assert "eval_count" not in answer


@pytest.mark.parametrize(
    ("path", "content", "status", "error"),
    [
        ("/api/generate", b"", 400, "missing request body"),
        ("/api/generate", b'{"model": ', 400, "unexpected EOF"),
        ("/api/chat", b"{bad", 400, f"invalid character 'b' {KEY_EXPECTED}"),
        ("/api/generate", b'{"prompt": NaN}', 400, f"invalid character 'N' {VALUE_EXPECTED}"),
        ("/api/generate", b"[1]", 400, f"json: cannot unmarshal array into {GENERATE_TYPE}"),
        ("/api/generate", b'{"model": "nope:1b", "prompt": "x"}', 404, "model 'nope:1b' not found"),
        ("/api/generate", b'{"prompt": "x"}', 404, "model '' not found"),
        ("/api/chat", b'{"messages": []}', 400, "model is required"),
    ],
)  # fmt: skip
async def test_bad_requests_get_ollama_errors(client, path, content, status, error):
    response = await client.post(path, content=content)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert response.json() == {"error": error}


async def test_json_is_html_escaped_like_go(client):
    response = await client.post("/api/generate", json={"model": "a<b>&c", "prompt": "x"})
    assert response.text == '{"error":"model \'a\\u003cb\\u003e\\u0026c\' not found"}'


async def test_unknown_route_and_wrong_method_are_plain_text(client):
    missing = await client.get("/api/nope")
    assert (missing.status_code, missing.text) == (404, "404 page not found")
    wrong = await client.get("/api/generate")
    assert (wrong.status_code, wrong.text) == (405, "405 method not allowed")


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"host": "evil.example.com"}, 403),
        ({"host": "localhost:11434"}, 200),
        ({"host": "ollama.internal"}, 200),
        ({"host": "10.1.2.3:11434"}, 200),
        ({"origin": "https://evil.example.com"}, 403),
        ({"origin": "http://localhost:3000"}, 200),
    ],
)
async def test_host_and_origin_gates(client, state, headers, status):
    response = await client.get("/api/version", headers=headers)
    assert response.status_code == status
    if status == 403:
        assert response.content == b""
        assert response.headers["content-length"] == "0"
        assert state.records[-1].status == 403
        state.config.host_gate = state.config.origin_gate = False
        assert (await client.get("/api/version", headers=headers)).status_code == 200


# --- faults -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "message"),
    [
        ("status_before", 500, "an error was encountered while running the model"),
        ("busy", 503, "server busy, please try again.  maximum pending requests exceeded"),
        ("not_found", 404, "model 'llama3.2' not found"),
    ],
)
async def test_faults_before_the_first_byte_get_a_real_status(
    client, state, fault, status, message
):
    state.config.fault = fault
    native = await client.post("/api/generate", json=GENERATE)
    assert (native.status_code, native.json()) == (status, {"error": message})
    openai = await client.post("/v1/chat/completions", json=CHAT)
    assert openai.status_code == status
    assert openai.json()["error"]["message"] == message
    assert [record.outcome for record in state.records] == ["fault", "fault"]


async def test_error_midstream_sends_one_error_line_and_no_done(client, state):
    state.config = fast_config(fault="error_midstream", fault_after=3)
    response = await client.post("/api/chat", json=CHAT)
    assert response.status_code == 200
    lines = ndjson(response.text)
    assert len(lines) == 4
    assert lines[-1] == {"error": "an error was encountered while running the model"}
    assert not any(line.get("done") for line in lines)
    [record] = state.records
    assert await wait_ended(record)  # the client may read the last byte before the record ends
    assert (record.outcome, record.tokens_sent) == ("fault", 3)
    unstreamed = await client.post("/api/chat", json={**CHAT, "stream": False})
    assert unstreamed.status_code == 500
    assert unstreamed.json() == {"error": "an error was encountered while running the model"}


async def test_eof_without_done_ends_the_body_cleanly(client, state):
    state.config = fast_config(fault="eof_without_done", fault_after=2)
    lines = ndjson((await client.post("/api/generate", json=GENERATE)).text)
    assert [line["response"] for line in lines] == ["tok0 ", "tok1 "]
    body = (await client.post("/api/generate", json={**GENERATE, "stream": False})).json()
    assert (body["response"], body["done"]) == ("tok0 tok1 ", False)
    assert not set(body) & set(METRICS)


async def test_malformed_sends_a_line_that_is_not_json(client, state):
    state.config = fast_config(fault="malformed", fault_after=2)
    response = await client.post("/api/generate", json=GENERATE)
    *good, bad = response.text.splitlines()
    assert len(good) == 2
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad)


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_drop_midstream_cuts_the_connection(http):
    app = create_emulator_app(fast_config(fault="drop_midstream", fault_after=2))
    with LoopbackServer(app, http=http) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            lines: list[str] = []
            async with client.stream("POST", "/api/generate", json=GENERATE) as response:
                assert response.status_code == 200
                with pytest.raises(httpx.RemoteProtocolError):
                    await read_lines(response, lines)
            assert len(lines) == 2
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post("/api/generate", json={**GENERATE, "stream": False})
    records = app.state.emulator.records
    assert all([await wait_ended(record) for record in records])
    assert [record.outcome for record in records] == ["fault", "fault"]


async def test_hang_midstream_keeps_the_connection_open_until_the_client_leaves(client, state):
    state.config = fast_config(fault="hang_midstream", fault_after=2)
    lines: list[str] = []
    timeout = httpx.Timeout(5, read=0.3)
    async with client.stream("POST", "/api/generate", json=GENERATE, timeout=timeout) as response:
        with pytest.raises(httpx.ReadTimeout):
            await read_lines(response, lines)
    assert len(lines) == 2
    [record] = state.records
    assert await wait_ended(record)
    assert (record.outcome, record.tokens_sent) == ("client_disconnect", 2)


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_during_hang_before_is_recorded(client, state, stream):
    state.config.fault = "hang_before"
    with pytest.raises(httpx.ReadTimeout):
        await client.post(
            "/api/chat", json={**CHAT, "stream": stream}, timeout=httpx.Timeout(5, read=0.2)
        )
    [record] = state.records
    assert await wait_ended(record)
    assert record.outcome == "client_disconnect"
    assert record.first_byte_at is None


async def test_disconnect_mid_stream_stops_generation_and_is_recorded(client, state):
    state.config = fast_config(tokens=500, inter_token=0.01)
    async with client.stream("POST", "/api/generate", json=GENERATE) as response:
        async for _ in response.aiter_lines():
            break
    left_at = time.monotonic()
    [record] = state.records
    assert await wait_ended(record)
    assert record.outcome == "client_disconnect"
    assert record.ended_at is not None
    assert record.ended_at - left_at < 1.0
    assert record.tokens_sent < 100


async def test_records_describe_the_request(client, state):
    await client.post("/api/generate", json=GENERATE, headers={"X-Trace": "abc"})
    [record] = state.records
    assert (record.method, record.path, record.body) == ("POST", "/api/generate", GENERATE)
    assert record.headers["x-trace"] == "abc"
    assert await wait_ended(record)
    assert record.started_at < record.first_byte_at < record.ended_at
    assert (record.outcome, record.status, record.tokens_sent) == ("completed", 200, 6)


# --- OpenAI-compatible endpoints --------------------------------------------------------------


async def test_chat_completions_stream_has_the_current_openai_shape(client):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.headers["content-type"] == "text/event-stream"
    *events, done = sse(response.text)
    assert done == "[DONE]"
    chunks = [json.loads(event) for event in events]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "tok0 "}
    assert chunks[1]["choices"][0]["delta"] == {"content": "tok1 "}
    assert chunks[1]["object"] == "chat.completion.chunk"
    assert chunks[1]["choices"][0]["finish_reason"] is None
    finish, usage = chunks[-2:]
    assert finish["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}
    assert len({chunk["id"] for chunk in chunks}) == 1


async def test_chat_completions_max_tokens_and_omit_usage(client, state):
    state.config.omit_usage = True
    body = {**CHAT, "stream": True, "max_tokens": 2, "stream_options": {"include_usage": True}}
    *events, _ = sse((await client.post("/v1/chat/completions", json=body)).text)
    chunks = [json.loads(event) for event in events]
    assert len(chunks) == 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("usage" in chunk for chunk in chunks)


async def test_v1_answers_do_not_stream_by_default(client):
    chat = await client.post("/v1/chat/completions", json=CHAT)
    assert chat.headers["content-type"] == "application/json; charset=utf-8"
    answer = chat.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {
        "role": "assistant",
        "content": "tok0 tok1 tok2 tok3 tok4 tok5 ",
    }
    assert answer["usage"]["completion_tokens"] == 6
    completion = (
        await client.post("/v1/completions", json={"model": "llama3.2", "prompt": "x"})
    ).json()
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["finish_reason"] == "stop"


async def test_completions_stream_carries_zero_usage_on_every_chunk(client):
    body = {
        "model": "llama3.2",
        "prompt": "x",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    *events, _ = sse((await client.post("/v1/completions", json=body)).text)
    chunks = [json.loads(event) for event in events]
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert all(chunk["usage"] == zero for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 6


async def test_openai_midstream_error_is_an_empty_chunk_without_done(client, state):
    state.config = fast_config(fault="error_midstream", fault_after=2)
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    chunks = [json.loads(event) for event in sse(response.text)]
    assert len(chunks) == 3
    assert chunks[-1]["choices"] == [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]
    assert "[DONE]" not in response.text


async def test_openai_request_errors_use_the_openai_error_object(client):
    empty = await client.post("/v1/chat/completions", json={"model": "llama3.2", "messages": []})
    assert empty.status_code == 400
    assert empty.json() == {
        "error": {
            "message": "[] is too short - 'messages'",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    unknown = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "not_found_error"


# --- runners ----------------------------------------------------------------------------------


async def test_loopback_server_releases_its_port_on_exit():
    with LoopbackServer(create_emulator_app(), http="h11") as server:
        port = server.port
        assert server.url == f"http://127.0.0.1:{port}"
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("127.0.0.1", port))


async def test_cli_rejects_an_unknown_fault(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--fault", "nope"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
