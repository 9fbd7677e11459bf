"""The native face of the Ollama emulator: the `/api/generate` and `/api/chat` wire format.

Owns how the emulator speaks reference §2 and §3: the NDJSON chunks, final chunk and
`stream: false` body in Go struct field order, the load and unload shortcuts (§2.5), tool calls
(`message.tool_calls` with an `arguments` object, in their own chunk before the final one, §3.2),
`logprobs` on the chunks, and the `/` and `/api/version` answers. What the answer says comes
from `gateway.testing.emulator.content`; timing and faults from `gateway.testing.emulator.engine`,
which drives `_NativeDialect`. The model routes (`/api/tags`, `/api/show`, ...) live in
`models`, `transfer` and `embed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.testing.emulator.catalog import resolve
from gateway.testing.emulator.content import (
    Shape,
    choose_tool_call,
    json_document,
    read_logprobs,
    token_logprob,
)
from gateway.testing.emulator.engine import Endpoint, answer
from gateway.testing.emulator.state import request_context
from gateway.testing.emulator.wire import format_created_at, json_response, read_json

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp

    from gateway.testing.emulator.dialect import Event, Piece, Summary, ToolCall


def native_tool_call(call: ToolCall, index: int = 0) -> dict[str, Any]:
    """Render a tool call as `/api/chat` sends it: `arguments` is an object (§3.1)."""
    function = {"index": index, "name": call.name, "arguments": call.arguments}
    return {"id": call.id, "function": function}


class _NativeDialect:
    """Renders `/api/generate` (§2) and `/api/chat` (§3) in Go struct field order."""

    sse = False
    media_type = "application/x-ndjson"

    def __init__(self, model: str, *, chat: bool, context: bool, logprobs: int | None) -> None:
        self._model = model
        self._chat = chat
        self._context = context and not chat  # /api/chat never returns context
        self._logprobs = logprobs

    def _text(
        self, content: str, thinking: str, calls: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        head: dict[str, Any] = {"model": self._model, "created_at": format_created_at()}
        extra = {"thinking": thinking} if thinking else {}
        if self._chat:
            message = {"role": "assistant", "content": content} | extra
            return {**head, "message": message | ({"tool_calls": calls} if calls else {})}
        return {**head, "response": content} | extra

    def _logprobs_of(self, pieces: list[Piece]) -> dict[str, Any]:
        """`{"logprobs": [...]}` for the pieces' tokens when asked (`top_logprobs` omitempty)."""
        if self._logprobs is None:
            return {}
        entries = [
            token_logprob(piece.content, self._logprobs) for piece in pieces if piece.content
        ]
        entries = [{k: v for k, v in entry.items() if v != []} for entry in entries]
        return {"logprobs": entries} if entries else {}

    def _final(
        self,
        summary: Summary,
        pieces: list[Piece],
        calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        content = "".join(piece.content for piece in pieces)
        thinking = "".join(piece.thinking for piece in pieces)
        text = self._text(content, thinking, calls)
        final = {**text, "done": True, "done_reason": summary.done_reason}
        if self._context:  # prompt plus output token ids, re-tokenized at the end (§2.3)
            final["context"] = list(range(1, summary.prompt_eval_count + summary.eval_count + 1))
        logprobs = self._logprobs_of(pieces)
        if self._chat:  # ChatResponse: logprobs before the metrics; GenerateResponse: after
            return final | logprobs | summary.metrics()
        return final | summary.metrics() | logprobs

    def loaded(self, reason: str) -> dict[str, Any]:
        """Render the load or unload answer to an empty prompt or message list (§2.5)."""
        return {**self._text("", ""), "done": True, "done_reason": reason}

    def error_body(self, status: int, message: str) -> dict[str, Any]:  # noqa: ARG002
        """Render `{"error": message}` (§4.1)."""
        return {"error": message}

    def chunk(self, piece: Piece, index: int) -> list[Event]:  # noqa: ARG002
        """Render one token chunk, or the chunk carrying a tool call with empty content."""
        calls = [native_tool_call(piece.tool_call)] if piece.tool_call else None
        text = self._text(piece.content, piece.thinking, calls)
        return [{**text, "done": False} | self._logprobs_of([piece])]

    def finish(self, summary: Summary) -> list[Event]:
        """Render the separate empty final chunk that carries the metrics (§9.2 item 10)."""
        return [self._final(summary, [])]

    def midstream_error(self, message: str) -> list[Event]:
        """Render the bare `{"error": ...}` line; no `done` chunk follows (§4.3)."""
        return [{"error": message}]

    def body(self, pieces: list[Piece], summary: Summary | None) -> dict[str, Any]:
        """Aggregate text, thinking and tool calls; the rest comes from the last chunk (§2.4)."""
        calls = [native_tool_call(call, i) for i, call in enumerate(_calls(pieces))]
        if summary is None:  # no final chunk: done false and no metrics (§2.4 pitfall)
            content = "".join(piece.content for piece in pieces)
            thinking = "".join(piece.thinking for piece in pieces)
            text = self._text(content, thinking, calls)
            return {**text, "done": False} | self._logprobs_of(pieces)
        return self._final(summary, pieces, calls)


def _calls(pieces: list[Piece]) -> list[ToolCall]:
    return [piece.tool_call for piece in pieces if piece.tool_call is not None]


async def _native(request: Request, *, chat: bool) -> ASGIApp:
    """`POST /api/generate` (§2) and `POST /api/chat` (§3)."""
    state, config, record = request_context(request)
    struct = "api.ChatRequest" if chat else "api.GenerateRequest"
    error = await read_json(request, record, struct, "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    body: dict[str, Any] = record.body
    model = body.get("model", "")
    if chat and not model:  # /api/generate answers 404 `model '' not found` instead (§4.2)
        return json_response(400, {"error": "model is required"})
    try:
        logprobs = read_logprobs(body)
    except ValueError as exc:
        return json_response(400, {"error": str(exc)})
    try:
        document = json_document(body.get("format"), config.tokens)
    except ValueError as exc:  # the runner rejects it once the model is found (§2.1)
        if resolve(model, config.models) is not None:
            return json_response(500, {"error": str(exc)})
        document = None
    options = body.get("options")
    limit = options.get("num_predict") if isinstance(options, dict) else None
    context = body.get("raw") is not True
    dialect = _NativeDialect(model, chat=chat, context=context, logprobs=logprobs)
    loaded = None
    unload = body.get("keep_alive") in (0, "0", "0s")  # the model unloads once this ends
    if not body.get("messages" if chat else "prompt"):
        loaded = dialect.loaded("unload" if unload else "load")
    tools = body.get("tools") if chat else None  # /api/generate has no tools (§2.1)
    seed = f"{state.next_id()}"
    call = choose_tool_call(tools, config, seed, body.get("messages")) if tools else None
    return answer(
        dialect,
        config,
        record,
        capacity=state.capacity,
        model=model,
        stream=body.get("stream") is not False,
        limit=limit if isinstance(limit, int) else None,
        loaded=loaded,
        unload=unload,
        shape=Shape(document=document, tool_call=call),
    )


async def _generate(request: Request) -> ASGIApp:
    return await _native(request, chat=False)


async def _chat(request: Request) -> ASGIApp:
    return await _native(request, chat=True)


async def _root(request: Request) -> ASGIApp:  # noqa: ARG001
    return PlainTextResponse("Ollama is running")


async def _version(request: Request) -> ASGIApp:
    return json_response(200, {"version": request_context(request)[1].version})


# Starlette adds HEAD to every GET route, as Ollama has.
ROUTES = (
    Route("/", Endpoint(_root), methods=["GET"]),
    Route("/api/version", Endpoint(_version), methods=["GET"]),
    Route("/api/generate", Endpoint(_generate), methods=["POST"]),
    Route("/api/chat", Endpoint(_chat), methods=["POST"]),
)
"""`/`, `/api/version`, `/api/generate` and `/api/chat`, as `create_emulator_app` mounts them."""
