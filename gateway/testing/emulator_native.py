"""The native face of the Ollama emulator: the `/api/*` wire format and its routes.

Owns how the emulator speaks reference §2, §3 and §6.1-6.4: the NDJSON chunks, final chunk and
`stream: false` body of `/api/generate` and `/api/chat` in Go struct field order, the load and
unload shortcuts (§2.5), and the `/`, `/api/version`, `/api/tags` and `/api/ps` answers. Timing
and faults come from `gateway.testing.emulator_engine`, which drives `_NativeDialect`.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Any

from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.testing.emulator_engine import Endpoint, answer
from gateway.testing.emulator_state import request_context
from gateway.testing.emulator_wire import (
    format_created_at,
    format_local_time,
    json_response,
    read_json,
)

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp

    from gateway.testing.emulator_dialect import Event, Piece, Summary


class _NativeDialect:
    """Renders `/api/generate` (§2) and `/api/chat` (§3) in Go struct field order."""

    sse = False
    media_type = "application/x-ndjson"

    def __init__(self, model: str, *, chat: bool, context: bool) -> None:
        self._model = model
        self._chat = chat
        self._context = context and not chat  # /api/chat never returns context

    def _text(self, content: str, thinking: str) -> dict[str, Any]:
        head: dict[str, Any] = {"model": self._model, "created_at": format_created_at()}
        if self._chat:
            message = {"role": "assistant", "content": content}
            return {**head, "message": message | ({"thinking": thinking} if thinking else {})}
        return {**head, "response": content} | ({"thinking": thinking} if thinking else {})

    def _final(self, summary: Summary, content: str, thinking: str) -> dict[str, Any]:
        final = {**self._text(content, thinking), "done": True, "done_reason": summary.done_reason}
        if self._context:  # prompt plus output token ids, re-tokenized at the end (§2.3)
            final["context"] = list(range(1, summary.prompt_eval_count + summary.eval_count + 1))
        return final | summary.metrics()

    def loaded(self, reason: str) -> dict[str, Any]:
        """Render the load or unload answer to an empty prompt or message list (§2.5)."""
        return {**self._text("", ""), "done": True, "done_reason": reason}

    def error_body(self, status: int, message: str) -> dict[str, Any]:  # noqa: ARG002
        """Render `{"error": message}` (§4.1)."""
        return {"error": message}

    def chunk(self, piece: Piece, index: int) -> list[Event]:  # noqa: ARG002
        """Render one token chunk."""
        return [{**self._text(piece.content, piece.thinking), "done": False}]

    def finish(self, summary: Summary) -> list[Event]:
        """Render the separate empty final chunk that carries the metrics (§9.2 item 10)."""
        return [self._final(summary, "", "")]

    def midstream_error(self, message: str) -> list[Event]:
        """Render the bare `{"error": ...}` line; no `done` chunk follows (§4.3)."""
        return [{"error": message}]

    def body(self, pieces: list[Piece], summary: Summary | None) -> dict[str, Any]:
        """Aggregate text and thinking; the rest comes from the last chunk (§2.4)."""
        content = "".join(piece.content for piece in pieces)
        thinking = "".join(piece.thinking for piece in pieces)
        if summary is None:  # no final chunk: done false and no metrics (§2.4 pitfall)
            return {**self._text(content, thinking), "done": False}
        return self._final(summary, content, thinking)


async def _native(request: Request, *, chat: bool) -> ASGIApp:
    """`POST /api/generate` (§2) and `POST /api/chat` (§3)."""
    _, config, record = request_context(request)
    struct = "api.ChatRequest" if chat else "api.GenerateRequest"
    error = await read_json(request, record, struct, "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    body: dict[str, Any] = record.body
    model = body.get("model", "")
    if chat and not model:  # /api/generate answers 404 `model '' not found` instead (§4.2)
        return json_response(400, {"error": "model is required"})
    options = body.get("options")
    limit = options.get("num_predict") if isinstance(options, dict) else None
    dialect = _NativeDialect(model, chat=chat, context=body.get("raw") is not True)
    loaded = None
    if not body.get("messages" if chat else "prompt"):
        unload = body.get("keep_alive") in (0, "0", "0s")
        loaded = dialect.loaded("unload" if unload else "load")
    return answer(
        dialect,
        config,
        record,
        model=model,
        stream=body.get("stream") is not False,
        limit=limit if isinstance(limit, int) else None,
        loaded=loaded,
    )


async def _generate(request: Request) -> ASGIApp:
    return await _native(request, chat=False)


async def _chat(request: Request) -> ASGIApp:
    return await _native(request, chat=True)


def _details(name: str) -> dict[str, Any]:
    base, _, tag = name.partition(":")
    family = base.rsplit("/", 1)[-1].rstrip("0123456789.") or "llama"
    size = tag.upper() if tag[:1].isdigit() and tag.endswith("b") else "3.2B"
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": size,
        "quantization_level": "Q4_K_M",
    }


def _listing(name: str) -> dict[str, Any]:
    digest = hashlib.sha256(name.encode()).hexdigest()
    size = 2_000_000_000 + int(digest[:7], 16)
    return {"name": name, "model": name, "size": size, "digest": digest, "details": _details(name)}


async def _root(request: Request) -> ASGIApp:  # noqa: ARG001
    return PlainTextResponse("Ollama is running")


async def _version(request: Request) -> ASGIApp:
    return json_response(200, {"version": request_context(request)[1].version})


async def _tags(request: Request) -> ASGIApp:
    state, config, _ = request_context(request)
    modified = format_local_time(state.booted_at)
    return json_response(
        200, {"models": [{**_listing(m), "modified_at": modified} for m in config.models]}
    )


async def _ps(request: Request) -> ASGIApp:
    _, config, _ = request_context(request)
    expires = format_local_time(time.time() + 300)  # the default keep_alive, 5m
    models = [
        {**entry, "expires_at": expires, "size_vram": entry["size"], "context_length": 4096}
        for entry in map(_listing, config.models)
    ]
    return json_response(200, {"models": models})


# Starlette adds HEAD to every GET route, as Ollama has.
ROUTES = (
    Route("/", Endpoint(_root), methods=["GET"]),
    Route("/api/version", Endpoint(_version), methods=["GET"]),
    Route("/api/tags", Endpoint(_tags), methods=["GET"]),
    Route("/api/ps", Endpoint(_ps), methods=["GET"]),
    Route("/api/generate", Endpoint(_generate), methods=["POST"]),
    Route("/api/chat", Endpoint(_chat), methods=["POST"]),
)
"""The `/api/*` routes and `/`, in the order `create_emulator_app` mounts them."""
