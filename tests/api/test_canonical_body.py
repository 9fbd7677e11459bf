"""What the gateway checks is what Ollama acts on: keys that Go's decoder folds together (issue 11).

Ollama decodes request bodies with Go's `encoding/json`, which matches keys case-insensitively
and lets the last match win; Python's `json` keeps keys exact. `GoLikeUpstream` decodes the way
Go does and records what it would have served, so each test shows the bypass the gateway used to
let through: it authorised one model (or metered one `num_predict`) and Ollama acted on another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from gateway.errors import BadRequestError
from gateway.testing.server import LoopbackServer
from tests.support.client import parse_ollama as parse_body
from tests.support.lookalikes import OllamaLookalike, ndjson
from tests.support.stack import Gateway

ALLOWED = "llama3.2:latest"
FORBIDDEN = "qwen2.5:7b"


def go_decode(raw: bytes) -> Any:
    """Decode JSON as Go's `encoding/json` does into a struct: keys fold, the last one wins.

    Every object keeps the first spelling of a key and the last value under any spelling of it
    (a simplification at every depth: Ollama's `options` is a map, its request a struct).
    """

    def fold(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        names: dict[str, str] = {}
        obj: dict[str, Any] = {}
        for key, value in pairs:
            obj[names.setdefault(key.casefold(), key)] = value
        return obj

    return json.loads(raw, object_pairs_hook=fold)


class GoLikeUpstream(OllamaLookalike):
    """An Ollama stand-in that records the model and `num_predict` it would have served."""

    def __init__(self) -> None:
        models = [{"model": m, "modified_at": "2025-01-01T00:00:00Z"} for m in (ALLOWED, FORBIDDEN)]
        super().__init__(tags={"models": models}, generate_paths=("/api/generate", "/api/chat"))
        self.served: list[dict[str, Any]] = []

    async def generate(self, request: Request) -> Response:
        body = go_decode(await request.body())
        options = body.get("options") or {}
        self.served.append({"model": body.get("model"), "num_predict": options.get("num_predict")})
        final = {"model": body.get("model"), "response": "", "done": True, "eval_count": 1}
        line = {"model": body.get("model"), "response": "a", "done": False}
        text = ndjson(line, final)
        return PlainTextResponse(text, media_type="application/x-ndjson")


@pytest.fixture
def go_gateway(
    make_gateway: Callable[..., Gateway],
) -> Iterator[tuple[GoLikeUpstream, Gateway, str]]:
    """A gateway in front of `GoLikeUpstream`, and a key that may use only `ALLOWED`."""
    upstream = GoLikeUpstream()
    with LoopbackServer(upstream.app) as server:
        gw = make_gateway(upstream_url=server.url, upstream_poll_interval=0.1)
        _, key = gw.create_key("allowed-only", models=[ALLOWED])
        yield upstream, gw, key


def _post(gw: Gateway, key: str, raw: bytes, route: str = "generate") -> httpx.Response:
    headers = {**gw.headers(key), "content-type": "application/json"}
    return httpx.post(f"{gw.url}/v1/{route}", content=raw, headers=headers, timeout=10)


def test_the_stand_in_serves_what_the_gateway_authorised(go_gateway):
    upstream, gw, key = go_gateway
    raw = json.dumps({"model": ALLOWED, "prompt": "x", "options": {"num_predict": 8}}).encode()
    assert _post(gw, key, raw).status_code == 200
    assert upstream.served == [{"model": ALLOWED, "num_predict": 8}]


@pytest.mark.parametrize(
    ("raw", "named", "route"),
    [
        # Go serves FORBIDDEN: `MODEL` folds onto `model` and comes last.
        (f'{{"model":"{ALLOWED}","MODEL":"{FORBIDDEN}","prompt":"x"}}', "'MODEL'", "generate"),
        (
            f'{{"model":"{ALLOWED}","Model":"{FORBIDDEN}","messages":[]}}',
            "'Model'",
            "chat",
        ),
        # An exact repeat: Python and Go both keep the last, but a parser that keeps the first
        # (or a log of the raw body) disagrees; nothing a client needs, so refused too.
        (f'{{"model":"{FORBIDDEN}","model":"{ALLOWED}","prompt":"x"}}', "'model'", "generate"),
        # Nested: metered for 8 tokens, Go reads 100000.
        (
            f'{{"model":"{ALLOWED}","prompt":"x","options":{{"num_predict":8,'
            '"NUM_PREDICT":100000}}',
            "'NUM_PREDICT'",
            "generate",
        ),
        # A spelling Go matches to `options` that the gateway, reading `options`, never saw.
        (
            f'{{"model":"{ALLOWED}","prompt":"x","Options":{{"num_predict":100000}}}}',
            "'Options'",
            "generate",
        ),
    ],
)
def test_keys_go_would_fold_together_are_refused_before_upstream(go_gateway, raw, named, route):
    upstream, gw, key = go_gateway
    response = _post(gw, key, raw.encode(), route)
    assert (response.status_code, upstream.served) == (400, [])
    assert named in response.json()["error"]  # Ollama's error shape, naming the key


@pytest.mark.parametrize(
    "raw",
    [
        '{"model":"m","stream":true,"\u017ftream":false}',  # the long s folds to s in Go
        '{"model":"m","keep_alive":1,"\u212aeep_alive":2}',  # the Kelvin sign folds to k
        '{"model":"m","images":[],"\u0131mages":["x"]}',  # Go folds the dotless i with i
        '{"model":"m","\u0131mages":["x"]}',
        '{"model":"m","messages":[{"role":"user","content":"a","CONTENT":"b"}]}',
        '{"model":"m","messages":[{"role":"user","Content":"long text the meter never saw"}]}',
        '{"model":"m","tools":[{"function":{"parameters":{"a":1,"A":2}}}]}',
    ],
)
def test_unicode_folds_and_deep_collisions_are_refused(raw):
    with pytest.raises(BadRequestError):
        parse_body(raw.encode(), "chat", max_depth=64)


def test_case_is_free_where_go_decodes_into_maps_or_schemas():
    raw = b'{"model":"m","format":{"properties":{"userId":{},"UserName":{}}},"messages":[]}'
    assert parse_body(raw, "chat", max_depth=64)["format"]["properties"].keys() == {
        "userId",
        "UserName",
    }


def test_the_upstream_body_is_serialised_from_the_checked_dict():
    from gateway.api.ollama.schema import parse_generation
    from gateway.settings import Settings
    from gateway.upstream.dialects.ollama import OllamaDialect
    from gateway.upstream.dialects.openai_request import to_openai_request

    body = parse_body(
        b'{"model":"m","prompt":"x","options":{"num_predict":3}}', "generate", max_depth=64
    )
    request = parse_generation(
        b'{"model":"m","prompt":"x","options":{"num_predict":3}}', "generate", Settings()
    )
    call = OllamaDialect().build_request(request, {})
    assert go_decode(call.content) == {**body, "stream": True}
    _, payload = to_openai_request("generate", body)
    assert (payload["model"], payload["max_tokens"]) == ("m", 3)
