"""Neutral chunks written as Anthropic Messages answers: SSE events, or one `message` object.

A stream is what Anthropic sends (Messages API reference, "Streaming messages";
../shared/reference/agent-clients.md, "What it consumes"): `message_start` (the message with
empty `content`), `ping`, then per content block `content_block_start`, its deltas
(`text_delta`, `thinking_delta`, `input_json_delta`) and `content_block_stop`, then
`message_delta` (`stop_reason`, `usage`) and `message_stop`. Each upstream read is written as it
arrives (the codec runs per read: `gateway.relay.surface`). A failure after the first byte is
one `error` event, `{"type": "error", "error": {"type": "api_error", "message"}}`, and the
stream ends there: the SDK raises on it.

Token counts: an Ollama or OpenAI-compatible upstream reports its prompt tokens only at the end,
so `message_start` carries `input_tokens: 0` and `message_delta` carries the upstream's exact
`input_tokens` and `output_tokens` (the SDKs take the last counts given: `message_delta`'s
`usage` replaces `message_start`'s). A stop sequence and the end of the turn look the same from
both upstream dialects (`stop`), so `stop_reason` is `end_turn` for both.
"""

from __future__ import annotations

import secrets
from typing import Any

from gateway.neutral import Chunk, GenerationRequest, ToolCall
from gateway.upstream.dialects.base import TextEvent
from gateway.upstream.dialects.json_codec import encode_json, text_splice
from gateway.wire.json import parse_arguments

SSE = b"text/event-stream; charset=utf-8"
_PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def error_event(message: str) -> bytes:
    """The `error` event that ends a stream which failed after its first byte."""
    error = {"type": "error", "error": {"type": "api_error", "message": message}}
    return _event("error", error)


class MessagesCodec:
    """The answer to `/v1/messages` (`gateway.relay.surface.Codec`); one per request."""

    media_type = SSE
    writes_raw = False

    def __init__(self, request: GenerationRequest) -> None:
        self._model = request.model
        self._id = "msg_" + secrets.token_hex(12)
        self._started = False
        self._block = -1  # index of the open content block; -1: none open yet
        self._open: str | None = None  # its type: text, thinking or tool_use; None: closed
        self._generated = 0  # chunks with output: the output count when the upstream gave none
        self._blocks: list[dict[str, Any]] = []  # the non-streamed answer's content
        self._called = False
        self._last: Chunk | None = None
        self._around_text: tuple[int, tuple[bytes, bytes] | None] | None = None  # per block
        self.text_event: TextEvent | None = self._text_event

    def _text_event(self, text: str) -> bytes | None:
        """A text delta in the open text block (`TextEvent`): `encode`'s bytes, in one splice.

        None before the message started and while no text block is open (the long way opens
        one), and when the event's other fields would be written differently around another
        text (`text_splice`).
        """
        if self._open != "text":
            return None
        cached = self._around_text
        if cached is None or cached[0] != self._block:
            delta = {"type": "text_delta"}
            around = text_splice(lambda t: self._block_delta({**delta, "text": t}))
            cached = self._around_text = (self._block, around)
        around = cached[1]
        if around is None:
            return None
        self._generated += 1
        return around[0] + encode_json(text) + around[1]

    # --- streamed -------------------------------------------------------------------------

    def encode(self, chunks: list[Chunk]) -> bytes:
        """SSE events for one upstream read's chunks (module docstring)."""
        events: list[bytes] = []
        for chunk in chunks:
            if chunk.error is not None:
                events.append(error_event(chunk.error))
                continue
            if not self._started:
                self._started = True
                events.append(_event("message_start", {"type": "message_start", **self._start()}))
                events.append(_PING)
            if chunk.generates:
                self._generated += 1
            if chunk.thinking:
                events.extend(self._delta("thinking", {"thinking": ""}, chunk.thinking))
            if chunk.text:
                events.extend(self._delta("text", {"text": ""}, chunk.text))
            for call in chunk.tool_calls or ():
                self._called = True
                events.extend(self._close())
                events.extend(self._open_block("tool_use", _tool_use(call, {})))
                # Always an object's JSON, as the non-streamed answer has it: the SDKs parse
                # `partial_json` and raise on broken arguments an OpenAI-compatible upstream
                # streamed (anthropic 2.17: "Unable to parse tool parameter JSON").
                partial = {"type": "input_json_delta", "partial_json": _input_json(call.arguments)}
                events.append(self._block_delta(partial))
            if chunk.done:
                events.extend(self._close())
                stop = {"stop_reason": self._stop_reason(chunk), "stop_sequence": None}
                end = {"type": "message_delta", "delta": stop, "usage": self._usage(chunk)}
                events.append(_event("message_delta", end))
                events.append(_event("message_stop", {"type": "message_stop"}))
        return b"".join(events)

    def _start(self) -> dict[str, Any]:
        return {
            "message": {
                "id": self._id,
                "type": "message",
                "role": "assistant",
                "model": self._model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
        }

    def _delta(self, kind: str, empty: dict[str, Any], text: str) -> list[bytes]:
        """A text or thinking delta, opening its block first when another one is open."""
        events: list[bytes] = []
        if self._open != kind:
            events.extend(self._close())
            events.extend(self._open_block(kind, {"type": kind, **empty}))
        events.append(self._block_delta({"type": f"{kind}_delta", kind: text}))
        return events

    def _open_block(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        self._block += 1
        self._open = kind
        start = {"type": "content_block_start", "index": self._block, "content_block": block}
        return [_event("content_block_start", start)]

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        body = {"type": "content_block_delta", "index": self._block, "delta": delta}
        return _event("content_block_delta", body)

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        events = []
        if self._open == "thinking":
            # Anthropic signs thinking so that it can check it when sent back; the gateway's
            # is not checked by anyone, and the SDK's accumulator expects the field.
            signature = {"type": "signature_delta", "signature": ""}
            events.append(self._block_delta(signature))
        self._open = None
        stop = {"type": "content_block_stop", "index": self._block}
        return [*events, _event("content_block_stop", stop)]

    # --- not streamed ---------------------------------------------------------------------

    def add(self, chunk: Chunk) -> None:
        """Fold one non-error chunk into the content blocks (adjacent pieces of a kind joined)."""
        if chunk.generates:
            self._generated += 1
        if chunk.thinking:
            self._append("thinking", chunk.thinking)
        if chunk.text:
            self._append("text", chunk.text)
        for call in chunk.tool_calls or ():
            self._called = True
            self._blocks.append(_tool_use(call, _arguments(call.arguments)))
        self._last = chunk

    def _append(self, kind: str, text: str) -> None:
        # A text or thinking block holds its pieces until `result` joins them: adding each
        # piece to a string was quadratic (100,000 chunks: 5 s of the event loop's CPU).
        if self._blocks and self._blocks[-1]["type"] == kind:
            self._blocks[-1][kind].append(text)
        elif kind == "thinking":
            self._blocks.append({"type": "thinking", "thinking": [text], "signature": ""})
        else:
            self._blocks.append({"type": "text", "text": [text]})

    def result(self) -> bytes:
        """The `message` object: content blocks, `stop_reason`, `usage`."""
        last = self._last or Chunk(done=True)
        message = self._start()["message"]
        message["content"] = [
            {**block, block["type"]: "".join(block[block["type"]])}
            if block["type"] in ("text", "thinking")
            else block
            for block in self._blocks
        ]
        message["stop_reason"] = self._stop_reason(last)
        message["usage"] = self._usage(last)
        return encode_json(message)

    # --- both -----------------------------------------------------------------------------

    def _stop_reason(self, chunk: Chunk) -> str:
        if chunk.done_reason == "length":
            return "max_tokens"
        return "tool_use" if self._called else "end_turn"

    def _usage(self, chunk: Chunk) -> dict[str, int]:
        stats = chunk.stats
        prompt = (stats.prompt_eval_count if stats else None) or 0
        output = (stats.eval_count if stats else None) or self._generated
        return {"input_tokens": prompt, "output_tokens": output}


def _tool_use(call: ToolCall, arguments: dict[str, Any]) -> dict[str, Any]:
    """A `tool_use` block; a call the upstream gave no id gets one (`toolu_...`)."""
    return {
        "type": "tool_use",
        "id": call.id or f"toolu_{secrets.token_hex(12)}",
        "name": call.name,
        "input": arguments,
    }


def _arguments(text: str) -> dict[str, Any]:
    """A call's JSON arguments as an object; text that is not an object is kept under `_raw`."""
    try:
        value = parse_arguments(text) if text.strip() else {}
    except ValueError:  # invalid, too deep or too many values
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_raw": text}


def _input_json(text: str) -> str:
    """`text` when it is a JSON object; else the object `_arguments` makes of it, as JSON."""
    given = _arguments(text)
    if text.strip() and given.get("_raw") is not text:
        return text
    return encode_json(given).decode()


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + encode_json(data) + b"\n\n"
