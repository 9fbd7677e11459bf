"""The emulator's embedding routes over real sockets: `/api/embed`, `/api/embeddings`, `/v1`."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import pytest

from gateway.testing.emulator.embed import normalize, raw_vector
from tests.support.emulator import fast_config

pytestmark = pytest.mark.anyio


EMBED = {"model": "llama3.2", "input": ["why is the sky blue", "hello"]}


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(value * value for value in vector))


def float32(value: float) -> float:
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


async def test_embed_answers_normalized_deterministic_vectors_with_metrics(client, state):
    response = await client.post("/api/embed", json=EMBED)
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    body = response.json()
    assert list(body) == [
        "model",
        "embeddings",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
    ]
    assert body["model"] == "llama3.2"  # as asked, not canonical
    first, second = body["embeddings"]
    assert len(first) == len(second) == 8
    assert norm(first) == pytest.approx(1.0, abs=1e-6)
    assert first != second
    assert body["prompt_eval_count"] == 5 + 1  # words
    assert body["total_duration"] >= body["load_duration"] > 0
    # float32 values, printed as Go prints a float32 (the shortest text that reads back)
    assert all(float32(value) == pytest.approx(value, rel=1e-7) for value in first)
    assert all(len(repr(value)) <= 12 for value in first)
    again = (await client.post("/api/embed", json={**EMBED, "model": "qwen2.5:7b"})).json()
    assert again["embeddings"][0] == first  # from the text alone
    assert state.records[0].body == EMBED


async def test_embed_dimensions_truncate_then_renormalize(client, state):
    state.config.embedding_dimensions = 16
    full = (await client.post("/api/embed", json={"model": "llama3.2", "input": "x y"})).json()
    cut = await client.post(
        "/api/embed", json={"model": "llama3.2", "input": "x y", "dimensions": 4}
    )
    [vector] = cut.json()["embeddings"]
    assert len(full["embeddings"][0]) == 16
    assert len(vector) == 4
    assert norm(vector) == pytest.approx(1.0, abs=1e-6)
    expected = normalize(full["embeddings"][0][:4])
    assert vector == pytest.approx(expected, rel=1e-6)


async def test_embed_truncates_long_inputs_unless_told_not_to(client, state):
    state.config.context_length = 3
    long = {"model": "llama3.2", "input": "one two three four five"}
    answer = (await client.post("/api/embed", json=long)).json()
    assert answer["prompt_eval_count"] == 3
    short = (await client.post("/api/embed", json={**long, "input": "one two three"})).json()
    assert answer["embeddings"] == short["embeddings"]
    refused = await client.post("/api/embed", json={**long, "truncate": False})
    assert refused.status_code == 400
    assert refused.json() == {"error": "the input length exceeds the context length"}


@pytest.mark.parametrize("given", ["", [], None])
async def test_embed_empty_input_answers_no_embeddings_and_no_metrics(client, given):
    body = {"model": "llama3.2"} | ({} if given is None else {"input": given})
    response = await client.post("/api/embed", json=body)
    assert response.json() == {"model": "llama3.2", "embeddings": []}


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"model": "llama3.2", "input": ["ok", 1]}, 400, "invalid input type"),
        ({"model": "llama3.2", "input": 3}, 400, "invalid input type"),
        ({"model": "nope", "input": "x"}, 404, "model 'nope' not found"),
        ({"input": "x"}, 404, "model '' not found"),
        (
            {"model": "llama3.2", "input": "x", "dimensions": "4"},
            400,
            "json: cannot unmarshal string into Go struct field EmbedRequest.dimensions"
            " of type int",
        ),
    ],
)
async def test_embed_errors_are_ollama_errors(client, body, status, error):
    response = await client.post("/api/embed", json=body)
    assert (response.status_code, response.json()) == (status, {"error": error})


async def test_embed_plays_the_faults_sent_before_any_byte(client, state):
    state.config.fault = "busy"
    response = await client.post("/api/embed", json=EMBED)
    assert response.status_code == 503
    assert response.json()["error"].startswith("server busy")
    assert state.records[-1].outcome == "fault"


async def test_legacy_embeddings_are_raw_float32_widened_to_float64(client, state):
    response = await client.post("/api/embeddings", json={"model": "llama3.2", "prompt": "x y"})
    body = response.json()
    assert list(body) == ["embedding"]  # no metrics
    assert body["embedding"] == raw_vector("x y", 8)
    assert norm(body["embedding"]) != pytest.approx(1.0, abs=1e-3)
    normalized = (
        await client.post("/api/embed", json={"model": "llama3.2", "input": "x y"})
    ).json()
    assert normalized["embeddings"][0] == pytest.approx(normalize(body["embedding"]), rel=1e-6)
    empty = await client.post("/api/embeddings", json={"model": "llama3.2", "prompt": ""})
    assert empty.json() == {"embedding": []}
    missing = await client.post("/api/embeddings", json={"model": "nope", "prompt": "x"})
    assert missing.status_code == 404
    assert missing.json() == {"error": 'model "nope" not found, try pulling it first'}
    unnamed = await client.post("/api/embeddings", json={"prompt": "x"})
    assert (unnamed.status_code, unnamed.json()) == (400, {"error": "model is required"})


async def test_v1_embeddings_have_the_openai_shape_and_usage(client):
    body = {"model": "llama3.2", "input": ["a b c", "d"]}
    answer = (await client.post("/v1/embeddings", json=body)).json()
    assert answer["object"] == "list"
    assert answer["model"] == "llama3.2"
    assert [item["index"] for item in answer["data"]] == [0, 1]
    assert all(item["object"] == "embedding" for item in answer["data"])
    assert answer["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    native = (await client.post("/api/embed", json=body)).json()
    assert [item["embedding"] for item in answer["data"]] == native["embeddings"]
    single = (await client.post("/v1/embeddings", json={"model": "llama3.2", "input": "a"})).json()
    assert len(single["data"]) == 1
    cut = {**body, "dimensions": 3}
    assert len((await client.post("/v1/embeddings", json=cut)).json()["data"][0]["embedding"]) == 3


async def test_v1_embeddings_base64_is_little_endian_float32(client):
    body = {"model": "llama3.2", "input": "a b c"}
    floats = (await client.post("/v1/embeddings", json=body)).json()["data"][0]["embedding"]
    encoded = await client.post("/v1/embeddings", json={**body, "encoding_format": "base64"})
    text = encoded.json()["data"][0]["embedding"]
    assert isinstance(text, str)
    decoded = struct.unpack(f"<{len(floats)}f", base64.b64decode(text))
    assert list(decoded) == pytest.approx(floats, rel=1e-7)


@pytest.mark.parametrize(
    ("body", "status", "message", "kind"),
    [
        (
            {"model": "llama3.2", "input": "x", "encoding_format": "int8"},
            400,
            "Invalid value for 'encoding_format' = int8. Supported values: ['float', 'base64'].",
            "invalid_request_error",
        ),
        ({"model": "llama3.2", "input": []}, 400, "invalid input", "invalid_request_error"),
        ({"model": "llama3.2"}, 400, "invalid input", "invalid_request_error"),
        ({"model": "llama3.2", "input": [1]}, 400, "invalid input type", "invalid_request_error"),
        ({"model": "nope", "input": "x"}, 404, "model 'nope' not found", "not_found_error"),
    ],
)
async def test_v1_embeddings_errors_use_the_openai_error_object(
    client, body, status, message, kind
):
    response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == status
    assert response.json() == {
        "error": {"message": message, "type": kind, "param": None, "code": None}
    }


async def test_v1_embeddings_of_an_empty_string_is_one_vector(client):
    # EmbeddingsMiddleware turns "" into [""], which /api/embed does embed (reference §7.4)
    answer = (await client.post("/v1/embeddings", json={"model": "llama3.2", "input": ""})).json()
    assert len(answer["data"]) == 1
    assert answer["usage"]["prompt_tokens"] == 1


async def test_embed_waits_for_the_load(client, state):
    state.config = fast_config(ttft=0.15)
    response = await client.post("/api/embed", json=EMBED, timeout=httpx.Timeout(5))
    assert response.json()["total_duration"] >= 0.14e9
    [record] = state.records
    assert record.first_byte_at is not None
    assert record.first_byte_at - record.started_at >= 0.14
