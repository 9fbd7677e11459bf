"""The emulator's embedding routes: `POST /api/embed`, `/api/embeddings` and `/v1/embeddings`.

Owns the vectors, which are deterministic: hash-seeded from the text alone (so both faces and
every model agree), `embedding_dimensions` long, float32 values as Ollama's runner returns them.
`/api/embed` L2-normalizes them and cuts them to `dimensions` then re-normalizes (§6.6);
`/api/embeddings` sends the raw float32 values widened to float64, without metrics (§6.6);
`/v1/embeddings` wraps `/api/embed` as Ollama's middleware does, with `usage` and the
`base64` encoding of little-endian float32 (§7.4). A token is a whitespace-separated word (at
least one per input); an input of more than `context_length` words is truncated, or refused
with `truncate: false`. The answer waits `ttft` (the load), and the faults sent before any byte
(`status_before`, `busy`, `not_found`) apply as on the generation routes.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from starlette.routing import Route

from gateway.testing.emulator.catalog import resolve
from gateway.testing.emulator.engine import Endpoint, refusal
from gateway.testing.emulator.openai import error_object
from gateway.testing.emulator.state import request_context
from gateway.testing.emulator.wire import json_response, read_json, wrong_type

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp

    from gateway.testing.emulator.config import EmulatorConfig
    from gateway.testing.emulator.state import ReceivedRequest

_TOO_LONG = "the input length exceeds the context length"


def _float32(value: float) -> float:
    """Round to the nearest float32, as a Python float holding exactly that value."""
    rounded: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return rounded


def _shortest32(value: float) -> float:
    """The float32 `value` as Go prints a float32: the shortest decimal that reads back to it."""
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if _float32(float(text)) == value:
            return float(text)
    return value


def raw_vector(text: str, dimensions: int) -> list[float]:
    """The unnormalized float32 embedding of `text`: hash-seeded values in [-1, 1)."""
    seed = hashlib.shake_256(text.encode()).digest(4 * dimensions)
    words = struct.unpack(f"<{dimensions}I", seed)
    return [_float32(word / 2**31 - 1) for word in words]


def normalize(vector: list[float]) -> list[float]:
    """L2-normalize in float32, as Ollama's `normalize` does (§6.6)."""
    norm = 1 / max(math.sqrt(sum(value * value for value in vector)), 1e-12)
    return [_float32(value * norm) for value in vector]


def count_tokens(text: str) -> int:
    """The emulator's token count: whitespace-separated words, at least one (a BOS token)."""
    return max(1, len(text.split()))


@dataclass(frozen=True)
class _Embedded:
    vectors: list[list[float]]  # float32 values, normalized and cut to `dimensions`
    tokens: int
    total_duration: int
    load_duration: int


async def _embed_inputs(
    body: dict[str, Any], config: EmulatorConfig, record: ReceivedRequest, struct_name: str
) -> _Embedded | tuple[int, str]:
    """`EmbedHandler` after decoding: checks, faults, the load wait, then the vectors."""
    model, given = body.get("model", ""), body.get("input")
    if not model:  # writeModelRefParseError's fallback for /api/embed is 404 (§4.2)
        return 404, "model '' not found"
    if isinstance(given, list) and all(isinstance(item, str) for item in given):
        inputs = list(given)
    elif isinstance(given, str) or given is None:
        inputs = [given] if given else []
    else:
        return 400, "invalid input type"
    dimensions, truncate = body.get("dimensions", 0), body.get("truncate", True)
    if not isinstance(dimensions, int) or isinstance(dimensions, bool):
        return 400, wrong_type(struct_name, "dimensions", dimensions, "int")
    if not isinstance(truncate, bool):
        return 400, wrong_type(struct_name, "truncate", truncate, "bool")
    refused = refusal(config, record, model)
    if refused is not None:
        return refused
    if resolve(model, config.models) is None:
        return 404, f"model '{model}' not found"
    await anyio.sleep(config.ttft)  # the model loads even for an empty input (§6.6)
    loaded = time.monotonic()
    vectors, tokens = [], 0
    for text in inputs:
        words = text.split()
        if len(words) > config.context_length:
            if not truncate:
                return 400, _TOO_LONG
            text = " ".join(words[: config.context_length])
        vector = normalize(raw_vector(text, config.embedding_dimensions))
        if 0 < dimensions < len(vector):
            vector = normalize(vector[:dimensions])
        vectors.append(vector)
        tokens += count_tokens(text)
    elapsed = round((time.monotonic() - record.started_at) * 1e9)
    load = min(config.load_duration_ns, round((loaded - record.started_at) * 1e9))
    return _Embedded(vectors, tokens, elapsed if inputs else 0, load if inputs else 0)


async def _embed(request: Request) -> ASGIApp:
    """`POST /api/embed` (§6.6); an empty input answers `embeddings: []` without metrics."""
    _, config, record = request_context(request)
    error = await read_json(request, record, "api.EmbedRequest", "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    result = await _embed_inputs(record.body, config, record, "api.EmbedRequest")
    if isinstance(result, tuple):
        return json_response(result[0], {"error": result[1]})
    answer: dict[str, Any] = {
        "model": record.body["model"],
        "embeddings": [[_shortest32(value) for value in vector] for vector in result.vectors],
        "total_duration": result.total_duration,
        "load_duration": result.load_duration,
        "prompt_eval_count": result.tokens,
    }
    return json_response(200, {key: value for key, value in answer.items() if value != 0})


async def _embeddings(request: Request) -> ASGIApp:
    """Legacy `POST /api/embeddings` (§6.6): `{model, prompt}` → `{"embedding": [...]}`."""
    _, config, record = request_context(request)
    error = await read_json(request, record, "api.EmbeddingRequest", "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    model, prompt = record.body.get("model", ""), record.body.get("prompt", "")
    if not model:
        return json_response(400, {"error": "model is required"})
    if not isinstance(prompt, str):
        message = wrong_type("api.EmbeddingRequest", "prompt", prompt, "string")
        return json_response(400, {"error": message})
    refused = refusal(config, record, model)
    if refused is not None:
        return json_response(refused[0], {"error": refused[1]})
    if resolve(model, config.models) is None:  # handleScheduleError's os.ErrNotExist text (§4.2)
        missing = f'model "{model}" not found, try pulling it first'
        return json_response(404, {"error": missing})
    await anyio.sleep(config.ttft)
    vector = raw_vector(prompt, config.embedding_dimensions) if prompt else []
    return json_response(200, {"embedding": vector})


async def _v1_embeddings(request: Request) -> ASGIApp:
    """`POST /v1/embeddings` (§7.4): `EmbeddingsMiddleware` in front of `/api/embed`."""
    _, config, record = request_context(request)
    error = await read_json(request, record, "openai.EmbedRequest", "EOF")
    if error is not None:
        return json_response(400, error_object(400, error))
    body: dict[str, Any] = record.body
    encoding = body.get("encoding_format") or ""
    if not isinstance(encoding, str) or encoding.lower() not in ("", "float", "base64"):
        message = (
            f"Invalid value for 'encoding_format' = {encoding}."
            " Supported values: ['float', 'base64']."
        )
        return json_response(400, error_object(400, message))
    given = [""] if body.get("input") == "" else body.get("input")
    if given is None or given == []:
        return json_response(400, error_object(400, "invalid input"))
    ask = {"model": body.get("model", ""), "input": given, "dimensions": body.get("dimensions", 0)}
    result = await _embed_inputs(ask, config, record, "openai.EmbedRequest")
    if isinstance(result, tuple):
        return json_response(result[0], error_object(*result))
    data = [
        {"object": "embedding", "embedding": _encode(vector, encoding), "index": index}
        for index, vector in enumerate(result.vectors)
    ]
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    answer = {"object": "list", "data": data, "model": body["model"], "usage": usage}
    return json_response(200, answer)


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    """The float list, or `floatsToBase64`: little-endian float32 bytes in standard base64."""
    if encoding.lower() == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return [_shortest32(value) for value in vector]


ROUTES = (
    Route("/api/embed", Endpoint(_embed), methods=["POST"]),
    Route("/api/embeddings", Endpoint(_embeddings), methods=["POST"]),
    Route("/v1/embeddings", Endpoint(_v1_embeddings), methods=["POST"]),
)
"""The embedding routes, in the order `create_emulator_app` mounts them."""
