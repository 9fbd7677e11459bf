"""Helpers shared by the test modules: a model name, Ollama and OpenAI look-alikes, a poll wait."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.testing.server import LoopbackServer
from tests.conftest import Gateway, metric_value

MODEL = "llama3.2:latest"


class OllamaLookalike:
    """A stand-in Ollama over Starlette; a subclass writes `generate`, a test sets `tags`/`ps`.

    It serves `/api/version`, `/api/tags` (the JSON in `tags`), `/api/ps` (the JSON in `ps`;
    not routed when `serve_ps` is false) and `generate` at every path in `generate_paths`.
    """

    def __init__(
        self,
        *,
        tags: Any = None,
        serve_ps: bool = True,
        generate_paths: tuple[str, ...] = ("/api/generate",),
    ) -> None:
        self.tags: Any = {"models": [{"model": MODEL}]} if tags is None else tags
        self.ps: Any = {"models": []}
        routes = [Route("/api/version", self._version), Route("/api/tags", self._tags)]
        if serve_ps:
            routes.append(Route("/api/ps", self._ps))
        routes += [Route(path, self.generate, methods=["POST"]) for path in generate_paths]
        self.app = Starlette(routes=routes)

    async def _version(self, _: Request) -> Response:
        return JSONResponse({"version": "0.33.0"})

    async def _tags(self, _: Request) -> Response:
        return _json(self.tags)

    async def _ps(self, _: Request) -> Response:
        return _json(self.ps)

    async def generate(self, request: Request) -> Response:
        """The answer to `/api/generate` (and any other path in `generate_paths`)."""
        raise NotImplementedError


def _json(value: Any) -> Response:
    """`value` as JSON; bytes as they are (JSON no Python value makes, such as deep nesting)."""
    if isinstance(value, bytes):
        return Response(value, media_type="application/json")
    return JSONResponse(value)


Lookalike = TypeVar("Lookalike", bound=OllamaLookalike)


def served(upstream: Lookalike) -> Iterator[tuple[Lookalike, str]]:
    """`upstream` on a loopback server, and its URL (a fixture does `yield from served(...)`)."""
    with LoopbackServer(upstream.app) as server:
        yield upstream, server.url


class OpenAILookalike:
    """A stand-in OpenAI-compatible server over Starlette; a subclass writes `complete`.

    It serves `/v1/models` (the JSON in `models`) and `complete` at every path in
    `complete_paths`. Serve it with `LoopbackServer(upstream.app)`.
    """

    def __init__(
        self,
        *,
        models: Any = None,
        complete_paths: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions"),
    ) -> None:
        listing = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0}]}
        self.models: Any = listing if models is None else models
        routes = [Route("/v1/models", self._models)]
        routes += [Route(path, self.complete, methods=["POST"]) for path in complete_paths]
        self.app = Starlette(routes=routes)

    async def _models(self, _: Request) -> Response:
        return _json(self.models)

    async def complete(self, request: Request) -> Response:
        """The answer to every path in `complete_paths`."""
        raise NotImplementedError


def sse(*events: dict[str, Any] | str) -> str:
    """The SSE text of `events`: `data: <event>` and a blank line each; a string goes as is.

    JSON is written compact and unescaped (UTF-8 on the wire), as vLLM and llama.cpp write it.
    """
    texts = (
        e if isinstance(e, str) else json.dumps(e, ensure_ascii=False, separators=(",", ":"))
        for e in events
    )
    return "".join(f"data: {text}\n\n" for text in texts)


def ndjson(*lines: dict[str, Any]) -> str:
    """The NDJSON text of `lines`: one JSON object a line, each ended by a newline."""
    return "".join(json.dumps(line) + "\n" for line in lines)


def wait_polled(gw: Gateway, count: int) -> None:
    """Wait (up to 5 s) until the gateway's monitor has seen `count` upstreams up."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if metric_value(gw.metrics_text(), "gateway_upstream_up") >= count:
            return
        time.sleep(0.05)


def stream_generation(url: str, key: str, lines: list[dict[str, Any]]) -> int:
    """Stream one generation of `MODEL` from the gateway at `url` as `key`; return its status.

    Each NDJSON line is parsed and appended to `lines` as it arrives, so a caller whose stream
    is cut keeps what came before the cut.
    """
    with httpx.stream(
        "POST",
        f"{url}/v1/generate",
        json={"model": MODEL, "prompt": "x"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ) as response:
        lines.extend(json.loads(line) for line in response.iter_lines() if line)
        return response.status_code


def parse_ollama(
    raw: bytes, operation: str, *, max_depth: int = 64, max_values: int = 100_000
) -> dict[str, Any]:
    """Check an Ollama generate or chat body as the gateway does; return the checked body."""
    from gateway.api.ollama.schema import parse_generation
    from gateway.settings import Settings

    settings = Settings(max_json_depth=max_depth, max_json_values=max_values)
    return parse_generation(raw, operation, settings).body  # type: ignore[arg-type]


#: Seconds a loopback hop may add after a silence. Some VMs (this project's CI among them)
#: wake a process tens of milliseconds late after 0.3 s idle, which a TTFT measured across a
#: hop pays and the emulator's knobs leave out (tests/test_bench_driver.py measures it).
LOOPBACK_WAKE = 0.06


def assert_ttft(exported: float, client: float | None, truth: float | None) -> None:
    """The gateway's TTFT agrees with the client's and with the emulator's `truth` (seconds;
    None: not checked).

    The client's clock starts before the gateway's and stops after it, so it may read up to
    `LOOPBACK_WAKE` more; both may exceed the truth by that much, never fall short of it.
    """
    if client is not None:
        assert client - 0.02 - LOOPBACK_WAKE <= exported <= client * 1.05 + 0.02, (exported, client)
    if truth is not None:
        assert truth * 0.85 <= exported <= truth * 1.15 + LOOPBACK_WAKE, (exported, truth)
