"""Stand-in Ollama and OpenAI servers a test writes the answers of, and SSE and NDJSON text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.testing.server import LoopbackServer
from tests.support.client import MODEL


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
