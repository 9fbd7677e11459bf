"""Neutral chunks written as OpenAI Responses answers: an SSE event stream, or one `response`.

The stream is OpenAI's (https://platform.openai.com/docs/api-reference/responses-streaming, and
what Codex reads: ../shared/reference/agent-clients.md, "OpenAI Codex CLI"): `event: <type>` and
`data: <json>` per event, each with its `type` and an increasing `sequence_number`:

- `response.created`, `response.in_progress` (the `response` so far, `output` empty);
- per output item, in the order the model produced them: `response.output_item.added`, then
  for a `message` `response.content_part.added`, `response.output_text.delta` per upstream
  chunk, `response.output_text.done`, `response.content_part.done`; for a `reasoning` item
  (the model's thinking) `response.reasoning_summary_part.added`,
  `response.reasoning_summary_text.delta` per chunk, `.text.done`, `.part.done`; for a
  `function_call` `response.function_call_arguments.delta` and `.done` (a call arrives whole
  from either dialect, so one delta); for a `custom_tool_call`
  `response.custom_tool_call_input.delta`/`.done`; then `response.output_item.done`;
- `response.completed` with the whole `response` and its `usage`, or `response.incomplete`
  (`incomplete_details.reason` `max_output_tokens`) when the output bound stopped the model;
- a failure after the first byte: an `error` event, then `response.failed`; the stream ends.

Deltas are written as their chunks arrive (the codec runs per upstream read). `usage` is the
upstream's own counts (`Stats`); `reasoning_tokens` counts the chunks that carried thinking
(one token each from Ollama and the OpenAI-compatible servers, which stream a token a chunk).

Over ~300 lines for one reason: `ResponsesCodec` is one state machine over the event stream above:
the open item, its text so far and the sequence number are read by every event it writes, and the
`response` object it ends with is built from the same items (the item builders after it are its
own).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from gateway.api.responses.schema import Plan, ToolName
from gateway.neutral import Chunk, GenerationRequest, ToolCall
from gateway.upstream.dialects.base import TextEvent
from gateway.upstream.dialects.json_codec import encode_json, text_splice
from gateway.wire.json import parse_arguments

SSE = b"text/event-stream; charset=utf-8"


#: The sequence number a text event is rendered with, to be found and cut (`_splice`): no
#: stream gets this far, and no other field of the event holds its digits.
_SEQUENCE_PROBE = 9_876_543_210_123


class _Item:
    """The output item being streamed: a `message` or a `reasoning` item, and its text so far."""

    __slots__ = ("id", "index", "kind", "parts")

    def __init__(self, kind: str, index: int) -> None:
        self.kind = kind
        self.index = index
        prefix = "msg_" if kind == "message" else "rs_"
        self.id = prefix + secrets.token_hex(16)
        self.parts: list[str] = []


class ResponsesCodec:
    """The answer to `/v1/responses` (`relay.surface.Codec`; module docstring)."""

    media_type = SSE
    writes_raw = False

    def __init__(self, request: GenerationRequest) -> None:
        self._plan: Plan = getattr(request, "plan", None) or Plan()
        self._model = request.model
        self._id = "resp_" + secrets.token_hex(24)
        self._created = int(time.time())
        self._sequence = 0
        self._started = False
        self._output: list[dict[str, Any]] = []  # finished items, in order
        self._open: _Item | None = None
        self._generated = 0  # chunks with output, when the upstream sent no count
        self._reasoning = 0  # chunks with thinking
        # Non-streamed answers: the pieces, joined in `result`.
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._calls: list[ToolCall] = []
        self._last: Chunk | None = None
        #: The `response` object once the answer completed (or stopped at its bound): what a
        #: stored response keeps. None while it runs, and after a failure.
        self.final: dict[str, Any] | None = None
        # A text delta's event for the open message item: before the text, between it and
        # the sequence number, after that; None when it cannot be spliced (`_text_event`).
        self._around_text: tuple[_Item, tuple[bytes, bytes, bytes] | None] | None = None
        self.text_event: TextEvent | None = self._text_event

    def _text_event(self, text: str) -> bytes | None:
        """A text delta in the open message item (`TextEvent`): `encode`'s bytes, spliced.

        None while no message item is open (the long way opens one, after the response's
        first events), and when the event's other fields would be written differently around
        another text or number (`text_splice`).
        """
        item = self._open
        if item is None or item.kind != "message":
            return None
        cached = self._around_text
        if cached is None or cached[0] is not item:
            cached = self._around_text = (item, self._splice(item))
        around = cached[1]
        if around is None:
            return None
        self._generated += 1
        item.parts.append(text)
        sequence = self._sequence
        self._sequence += 1
        return around[0] + encode_json(text) + around[1] + b"%d" % sequence + around[2]

    def _splice(self, item: _Item) -> tuple[bytes, bytes, bytes] | None:
        """`_delta`'s text event for `item` cut around its text and its sequence number."""
        kind = "response.output_text.delta"
        probe = _SEQUENCE_PROBE

        def render(text: str) -> bytes:
            fields = self._part(item, delta=text, logprobs=[])
            return self._event_bytes(kind, fields, probe)

        around = text_splice(render)
        if around is None:
            return None
        middle, found, after = around[1].rpartition(b"%d" % probe)
        return (around[0], middle, after) if found else None

    # --- streamed -------------------------------------------------------------------------

    def encode(self, chunks: list[Chunk]) -> bytes:
        """SSE events for one upstream read's `chunks` (module docstring)."""
        events: list[bytes] = []
        if not self._started:
            self._started = True
            snapshot = self._response("in_progress", [])
            events.append(self._event("response.created", {"response": snapshot}))
            events.append(self._event("response.in_progress", {"response": snapshot}))
        for chunk in chunks:
            if chunk.error is not None:
                events.extend(self._fail(chunk.error))
                continue
            if chunk.generates:
                self._generated += 1
            if chunk.thinking:
                self._reasoning += 1
                events.extend(self._delta("reasoning", chunk.thinking))
            if chunk.text:
                events.extend(self._delta("message", chunk.text))
            for call in chunk.tool_calls or ():
                events.extend(self._close("completed"))
                events.extend(self._call_events(call))
            if chunk.done:
                events.extend(self._finish(chunk))
        return b"".join(events)

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        event = self._event_bytes(kind, fields, self._sequence)
        self._sequence += 1
        return event

    @staticmethod
    def _event_bytes(kind: str, fields: dict[str, Any], sequence: int) -> bytes:
        data = {"type": kind, **fields, "sequence_number": sequence}
        return b"event: " + kind.encode() + b"\ndata: " + encode_json(data) + b"\n\n"

    def _delta(self, kind: str, text: str) -> list[bytes]:
        """Text or thinking for the open item of `kind`, opening it (and closing another)."""
        events: list[bytes] = []
        item = self._open
        if item is None or item.kind != kind:
            events.extend(self._close("completed"))
            item = self._open = _Item(kind, len(self._output))
            added = (
                _message(item.id, "", "in_progress")
                if kind == "message"
                else _reasoning(item.id, None)
            )
            events.append(self._event("response.output_item.added", self._at(item, item=added)))
            if kind == "message":
                part = _text_part("")
                events.append(
                    self._event("response.content_part.added", self._part(item, part=part))
                )
            else:
                part = {"type": "summary_text", "text": ""}
                events.append(
                    self._event(
                        "response.reasoning_summary_part.added", self._summary(item, part=part)
                    )
                )
        item.parts.append(text)
        if kind == "message":
            fields = self._part(item, delta=text, logprobs=[])
            events.append(self._event("response.output_text.delta", fields))
        else:
            fields = self._summary(item, delta=text)
            events.append(self._event("response.reasoning_summary_text.delta", fields))
        return events

    def _close(self, status: str) -> list[bytes]:
        """The `.done` events of the open item, which joins the output."""
        item = self._open
        if item is None:
            return []
        self._open = None
        text = "".join(item.parts)
        events: list[bytes] = []
        if item.kind == "message":
            done = _message(item.id, text, status)
            events.append(
                self._event("response.output_text.done", self._part(item, text=text, logprobs=[]))
            )
            events.append(
                self._event("response.content_part.done", self._part(item, part=_text_part(text)))
            )
        else:
            done = _reasoning(item.id, text)
            part = {"type": "summary_text", "text": text}
            events.append(
                self._event("response.reasoning_summary_text.done", self._summary(item, text=text))
            )
            events.append(
                self._event("response.reasoning_summary_part.done", self._summary(item, part=part))
            )
        events.append(self._event("response.output_item.done", self._at(item, item=done)))
        self._output.append(done)
        return events

    def _call_events(self, call: ToolCall) -> list[bytes]:
        """One tool call as its own output item, whole (both dialects deliver calls whole)."""
        done = _call_item(call, self._plan.tools.get(call.name))
        index = len(self._output)
        at = {"output_index": index, "item_id": done["id"]}
        events: list[bytes] = []
        if done["type"] == "custom_tool_call":
            added = {**done, "input": ""}
            events.append(
                self._event("response.output_item.added", {"output_index": index, "item": added})
            )
            events.append(
                self._event("response.custom_tool_call_input.delta", {**at, "delta": done["input"]})
            )
            events.append(
                self._event("response.custom_tool_call_input.done", {**at, "input": done["input"]})
            )
        else:
            added = {**done, "arguments": "", "status": "in_progress"}
            events.append(
                self._event("response.output_item.added", {"output_index": index, "item": added})
            )
            arguments = done["arguments"]
            events.append(
                self._event("response.function_call_arguments.delta", {**at, "delta": arguments})
            )
            done_fields = {**at, "name": done["name"], "arguments": arguments}
            events.append(self._event("response.function_call_arguments.done", done_fields))
        events.append(
            self._event("response.output_item.done", {"output_index": index, "item": done})
        )
        self._output.append(done)
        return events

    def _finish(self, chunk: Chunk) -> list[bytes]:
        incomplete = chunk.done_reason == "length"
        events = self._close("incomplete" if incomplete else "completed")
        status = "incomplete" if incomplete else "completed"
        final = self.final = self._response(status, self._output, chunk)
        kind = "response.incomplete" if incomplete else "response.completed"
        events.append(self._event(kind, {"response": final}))
        return events

    def _fail(self, message: str) -> list[bytes]:
        """An `error` event, then `response.failed` with the output so far; the stream ends."""
        error = {"code": "server_error", "message": message}
        events = [self._event("error", {**error, "param": None})]
        item = self._open
        if item is not None:  # no `.done` events: the item was cut off
            text = "".join(item.parts)
            cut = (
                _message(item.id, text, "incomplete")
                if item.kind == "message"
                else _reasoning(item.id, text)
            )
            self._output.append(cut)
            self._open = None
        failed = self._response("failed", self._output, error=error)
        events.append(self._event("response.failed", {"response": failed}))
        return events

    def _at(self, open_item: _Item, **fields: Any) -> dict[str, Any]:
        return {"output_index": open_item.index, **fields}

    def _part(self, item: _Item, **fields: Any) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index, "content_index": 0, **fields}

    def _summary(self, item: _Item, **fields: Any) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.index, "summary_index": 0, **fields}

    # --- not streamed ---------------------------------------------------------------------

    def add(self, chunk: Chunk) -> None:
        """Fold in one non-error chunk."""
        if chunk.generates:
            self._generated += 1
        if chunk.thinking:
            self._reasoning += 1
            self._thinking.append(chunk.thinking)
        self._text.append(chunk.text)
        self._calls.extend(chunk.tool_calls or ())
        self._last = chunk

    def result(self) -> bytes:
        """The `response` object: reasoning, then the message, then the tool calls."""
        last = self._last or Chunk(done=True)
        incomplete = last.done_reason == "length"
        output: list[dict[str, Any]] = []
        if self._thinking:
            output.append(_reasoning("rs_" + secrets.token_hex(16), "".join(self._thinking)))
        text = "".join(self._text)
        if text or not self._calls:
            status = "incomplete" if incomplete else "completed"
            output.append(_message("msg_" + secrets.token_hex(16), text, status))
        output.extend(_call_item(call, self._plan.tools.get(call.name)) for call in self._calls)
        status = "incomplete" if incomplete else "completed"
        self.final = self._response(status, output, last)
        return encode_json(self.final)

    # --- the response object --------------------------------------------------------------

    def _response(
        self,
        status: str,
        output: list[dict[str, Any]],
        last: Chunk | None = None,
        *,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The `response` object (OpenAI's `Response`), its request fields echoed."""
        response: dict[str, Any] = {
            "id": self._id,
            "object": "response",
            "created_at": self._created,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            **self._plan.echo,
            "model": self._model,
            "output": list(output),
            "previous_response_id": self._plan.previous_response_id,
            "store": self._plan.store,
            "usage": None,
        }
        if status in ("completed", "incomplete"):
            response["completed_at"] = int(time.time()) if status == "completed" else None
            response["usage"] = self._usage(last)
        return response

    def _usage(self, last: Chunk | None) -> dict[str, Any]:
        stats = last.stats if last else None
        prompt = (stats.prompt_eval_count if stats else None) or 0
        completion = (stats.eval_count if stats else None) or self._generated
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": min(self._reasoning, completion)},
            "total_tokens": prompt + completion,
        }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [_text_part(text)] if status != "in_progress" else []
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _reasoning(item_id: str, text: str | None) -> dict[str, Any]:
    summary = [] if text is None else [{"type": "summary_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": summary}


def _call_item(call: ToolCall, meaning: ToolName | None) -> dict[str, Any]:
    """A tool call as a `function_call` or `custom_tool_call` item, under the client's name."""
    call_id = call.id or "call_" + secrets.token_hex(12)
    if meaning is not None and meaning.custom:
        item: dict[str, Any] = {
            "id": "ctc_" + secrets.token_hex(16),
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": meaning.name,
            "input": _custom_input(call.arguments),
        }
    else:
        item = {
            "id": "fc_" + secrets.token_hex(16),
            "type": "function_call",
            "status": "completed",
            "call_id": call_id,
            "name": meaning.name if meaning else call.name,
            "arguments": call.arguments,
        }
    if meaning is not None and meaning.namespace is not None:
        item["namespace"] = meaning.namespace
    return item


def _custom_input(arguments: str) -> str:
    """A custom tool's input: the `input` string of the function call's arguments.

    A model that answered something else gets its arguments text passed on as the input.
    """
    try:
        parsed = parse_arguments(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments
