"""The sans-IO reader of a streamed answer: bytes in (with the client's clock), a record out.

Owns `Api` (the two dialects), `AnswerReader` and `error_text`. The reader splits NDJSON lines
(Ollama) or SSE events (OpenAI), notes the time of the first content chunk and of every content
chunk, the end (`done: true`, `data: [DONE]`), an error line, and the server's own counters,
which arrive with the last chunk (so every line is parsed; for SSE only the `data:` lines are).
Counter precedence: Ollama's final chunk; on `/v1` OpenAI `usage` for counts and llama.cpp
`timings` for durations (and for counts when there is no `usage`); the client's own chunk count
only when the server reports nothing. It never reads a socket or a clock, so every byte split
of an answer can be tested directly.

Over ~300 lines for one reason: `AnswerReader` is one sans-IO parser for both dialects;
the line splitting (`feed`, `_line`), the dispatch of each chunk (`_ndjson`, `_dispatch`) and
the counter precedence in `record` read the same state of one answer.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from gateway.clients.bench.jsontext import loads
from gateway.clients.bench.records import RequestRecord, Source
from gateway.clients.bench.stats import escape_error

Api = Literal["ollama", "openai"]
"""`ollama`: the native `/api/chat`, `/api/generate`; `openai`: `/v1/chat/completions`, ..."""

#: An answer line longer than this is refused (a runaway body must not eat the generator), and
#: so is an SSE event whose `data:` lines add up to more.
MAX_LINE = 1 << 20
#: Content chunks timed per answer; past it the answer fails. Far above any `--max-tokens` a
#: benchmark uses, and it keeps an endless stream's timestamps to about 3 MB.
MAX_CHUNKS = 100_000
#: Bytes of a failed answer's body kept for its error text.
ERROR_BODY = 1024
#: Characters of an answer's text kept with `keep_text` (a conversation's history).
MAX_TEXT = 1 << 20


#: The largest token count or duration a server may report; above it the value is nonsense.
_MAX_COUNT = 10**12
#: The shortest server duration taken as measured, seconds: below it a rate is nonsense.
_MIN_SECONDS = 1e-6
#: The error of an answer that went on after its final chunk.
AFTER_DONE = "answer went on after its final chunk"


def output_allowance(max_tokens: int) -> int:
    """The most output tokens a server may report for `max_tokens` asked and still be trusted.

    A little over `max_tokens` (the larger of 8 tokens and 10%): a server may count an end
    token or a chunk boundary differently; far more is a count that cannot be true.
    """
    return max_tokens + max(8, max_tokens // 10)


def _int(value: Any) -> int | None:
    """A reported token count: a whole number within 0 and 10^12, else None (not reported)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        return None
    return value


def _seconds(value: Any, scale: float) -> float | None:
    """A reported duration in seconds: finite, at least 1 us (units of `scale`), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 < value <= _MAX_COUNT * 1e9 or not math.isfinite(value):
        return None
    seconds = float(value) * scale
    return seconds if seconds >= _MIN_SECONDS else None


def _why(exc: ValueError) -> str:
    """Why a line is not JSON, when it is not plain invalid text (nested too deeply, ...)."""
    return "" if isinstance(exc, json.JSONDecodeError) else f" ({exc})"


def error_text(body: bytes, key: str | None = None) -> str:
    """The error message in a failed answer's body (`{"error": "..."}`, `{"error": {"message"}}`).

    Falls back to the body's text; either way escaped and cut short, `key` redacted first
    (`stats.escape_error`).
    """
    text = body.decode("utf-8", "replace").strip()
    try:
        data = loads(text)
    except ValueError:
        return escape_error(text, key=key)
    if isinstance(data, dict) and "error" in data:
        error = data["error"]
        if isinstance(error, dict):
            error = error.get("message", error)
        return escape_error(str(error), key=key)
    return escape_error(text, key=key)


class AnswerReader:
    """Reads one streamed answer as its bytes arrive; sans-IO (the caller supplies the clock).

    Feed the body of a 200 answer with `feed`, a failed answer's body with `feed_error`, then
    call `close` once the body ended and `record` to get the `RequestRecord`.

    The first final chunk ends the answer: a line or event after it is not read (its chunks
    and counters would override the real ones) and fails the answer (`AFTER_DONE`). With
    `max_tokens`, a server's output count above `output_allowance(max_tokens)` fails it too:
    such a count cannot be true, so neither can the server's other numbers; so do more content
    chunks than that allowance, whatever the server counts. An answer with no content and no
    output count above 0 fails (`empty answer`).

    Attributes:
        first_token: Client seconds of the first chunk with non-empty content or thinking.
        chunk_times: Client seconds of every such chunk.
        done: The final chunk arrived (`done: true`; `data: [DONE]`; Responses
            `response.completed` or `response.incomplete`; Messages `message_stop`).
        text_parts: The answer's content pieces, with `keep_text` (up to `MAX_TEXT`
            characters; thinking is not kept: a chat client resends only the answer).
        error: The first error the answer carried (error line or event, a line that is not
            JSON), escaped, or None.
    """

    def __init__(
        self,
        api: Api,
        key: str | None = None,
        max_tokens: int | None = None,
        *,
        surface: str = "",
        keep_text: bool = False,
    ) -> None:
        self.api: Api = api
        self.surface = surface
        self.keep_text = keep_text
        self.text_parts: list[str] = []
        self._text_size = 0
        self._max_tokens = max_tokens
        self._key = key  # redacted from error text before it is cut (`stats.escape_error`)
        self.first_token: float | None = None
        self.chunk_times: list[float] = []
        self.done = False
        self.error: str | None = None
        self._sse = api == "openai"
        self._buffer = bytearray()  # grows in place: a line trickled byte by byte stays linear
        self._data: list[bytes] = []  # the `data:` lines of the SSE event being read
        self._data_size = 0  # their bytes: without a blank line they would pile up unbounded
        self._event = b""  # the SSE event's `event:` field
        self._error_body = bytearray()
        self._counts: dict[str, tuple[int | None, int | None, Source]] = {}
        self._durations: tuple[float | None, float | None, float | None, Source] | None = None

    # --- bytes -------------------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> None:
        """Take the next piece of a 200 answer's (de-chunked) body, received at `now`."""
        if b"\n" not in data:
            self._buffer += data
            if len(self._buffer) > MAX_LINE:
                self._fail(f"answer line longer than {MAX_LINE} bytes")
                self._buffer = bytearray()
            return
        *lines, rest = (bytes(self._buffer) + data).split(b"\n")
        self._buffer = bytearray(rest)
        for line in lines:
            self._line(line, now)
        if len(self._buffer) > MAX_LINE:
            self._fail(f"answer line longer than {MAX_LINE} bytes")
            self._buffer = bytearray()

    def feed_error(self, data: bytes) -> None:
        """Take a piece of a failed (non-200) answer's body; its start becomes the error text."""
        room = ERROR_BODY - len(self._error_body)
        if room > 0:
            self._error_body += data[:room]

    @property
    def error_body_full(self) -> bool:
        """A failed answer's body filled its `ERROR_BODY` bytes: the rest is not read."""
        return len(self._error_body) >= ERROR_BODY

    def close(self, now: float) -> None:
        """The body ended at `now`: read a last line that had no newline, end the SSE event."""
        if self._buffer:
            line, self._buffer = bytes(self._buffer), bytearray()
            self._line(line, now)
        if self._data:
            self._dispatch(now)

    def _line(self, line: bytes, now: float) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not self._sse:
            if line.strip():
                if self.done:
                    self._fail(AFTER_DONE)
                    return
                self._ndjson(line, now)
            return
        if not line:  # a blank line ends an SSE event
            if self._data:
                self._dispatch(now)
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._data_size += len(value) + 1
            if self._data_size > MAX_LINE:
                self._fail(f"answer event longer than {MAX_LINE} bytes")
                self._data, self._data_size = [], 0
                return
            self._data.append(value[1:] if value.startswith(b" ") else value)
        elif line.startswith(b"event:"):
            self._event = line[6:].strip()
        # `id:`, `retry:` and `:` comments carry nothing a benchmark needs

    def _fail(self, text: str) -> None:
        if self.error is None:
            self.error = escape_error(text, key=self._key)

    @property
    def text(self) -> str:
        """The answer's content so far (empty without `keep_text`)."""
        return "".join(self.text_parts)

    def _chunk(self, now: float, content: Any = None) -> None:
        if self.keep_text and isinstance(content, str) and self._text_size < MAX_TEXT:
            piece = content[: MAX_TEXT - self._text_size]
            self.text_parts.append(piece)
            self._text_size += len(piece)
        if self.first_token is None:
            self.first_token = now
        if len(self.chunk_times) >= MAX_CHUNKS:
            self._fail(f"answer exceeded {MAX_CHUNKS} content chunks")
            return
        limit = self._max_tokens
        if limit is not None and len(self.chunk_times) >= output_allowance(limit):
            # Each chunk carries at least one token, so more chunks than the allowance is an
            # answer that ignored `max_tokens` whatever the server counts (or does not).
            self._fail(f"answer streamed over {output_allowance(limit)} chunks for {limit} tokens")
            return
        self.chunk_times.append(now)

    # --- Ollama NDJSON -----------------------------------------------------------------------

    def _ndjson(self, line: bytes, now: float) -> None:
        try:
            data = loads(line)
        except ValueError as exc:
            shown = line[:80].decode("utf-8", "replace")
            self._fail(f"answer line is not JSON{_why(exc)}: {shown}")
            return
        if not isinstance(data, dict):
            self._fail("answer line is not a JSON object")
            return
        if "error" in data:
            self._fail(str(data["error"]))
            return
        message = data.get("message")
        content = data.get("response")
        text = content or data.get("thinking")
        if not text and isinstance(message, dict):
            content = message.get("content")
            text = content or message.get("thinking")
        if text:
            self._chunk(now, content)
        if data.get("done") is True:
            self.done = True
            self._counts["ollama"] = (
                _int(data.get("eval_count")),
                _int(data.get("prompt_eval_count")),
                "ollama",
            )
            self._durations = (
                _seconds(data.get("eval_duration"), 1e-9),
                _seconds(data.get("prompt_eval_duration"), 1e-9),
                _seconds(data.get("load_duration"), 1e-9),
                "ollama",
            )

    # --- OpenAI SSE --------------------------------------------------------------------------

    def _dispatch(self, now: float) -> None:
        payload = b"\n".join(self._data)
        event, self._data, self._event = self._event, [], b""
        self._data_size = 0
        if self.done:
            self._fail(AFTER_DONE)
            return
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            data = loads(payload)
        except ValueError as exc:
            shown = payload[:80].decode("utf-8", "replace")
            self._fail(f"event data is not JSON{_why(exc)}: {shown}")
            return
        if not isinstance(data, dict):
            self._fail("event data is not a JSON object")
            return
        if event == b"error" or ("error" in data and data.get("type") != "response.failed"):
            error = data.get("error", data)
            if isinstance(error, dict):
                error = error.get("message", error)
            self._fail(str(error))
            return
        if self.surface == "responses":
            self._responses(data, now)
            return
        if self.surface == "messages":
            self._messages(data, now)
            return
        choices = data.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            delta = choice.get("delta")
            text = choice.get("text")
            content = text
            if not text and isinstance(delta, dict):
                content = delta.get("content")
                text = content or delta.get("reasoning") or delta.get("reasoning_content")
            if text:
                self._chunk(now, content)
        usage = data.get("usage")
        # /v1/completions puts zero usage on every chunk: only the choices-less usage chunk,
        # or a non-zero one, carries the real counts.
        if isinstance(usage, dict) and (not choices or _int(usage.get("completion_tokens"))):
            self._counts["openai.usage"] = (
                _int(usage.get("completion_tokens")),
                _int(usage.get("prompt_tokens")),
                "openai.usage",
            )
        timings = data.get("timings")
        if isinstance(timings, dict):
            self._counts["llamacpp.timings"] = (
                _int(timings.get("predicted_n")),
                _int(timings.get("prompt_n")),
                "llamacpp.timings",
            )
            self._durations = (
                _seconds(timings.get("predicted_ms"), 1e-3),
                _seconds(timings.get("prompt_ms"), 1e-3),
                None,
                "llamacpp.timings",
            )

    # --- the agent surfaces ---------------------------------------------------------------------

    def _responses(self, data: dict[str, Any], now: float) -> None:
        """A Responses stream event (OpenAI API reference, "Streaming events").

        `response.output_text.delta` carries content, `response.reasoning_text.delta` and
        `response.reasoning_summary_text.delta` thinking (timed as chat's reasoning is);
        `response.completed` and `response.incomplete` (stopped by `max_output_tokens`) end the
        answer with `response.usage` (`input_tokens`, `output_tokens`); `response.failed` fails it.
        """
        kind = data.get("type")
        delta = data.get("delta")
        if kind == "response.output_text.delta":
            if isinstance(delta, str) and delta:
                self._chunk(now, delta)
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            if isinstance(delta, str) and delta:
                self._chunk(now)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = data.get("response")
            response = response if isinstance(response, dict) else {}
            if kind == "response.failed":
                error = response.get("error")
                message = error.get("message") if isinstance(error, dict) else None
                self._fail(str(message or "response.failed"))
                return
            self.done = True
            usage = response.get("usage")
            if isinstance(usage, dict):
                self._counts["responses.usage"] = (
                    _int(usage.get("output_tokens")),
                    _int(usage.get("input_tokens")),
                    "responses.usage",
                )

    def _messages(self, data: dict[str, Any], now: float) -> None:
        """An Anthropic Messages stream event (Anthropic API reference, "Streaming Messages").

        `content_block_delta` with a `text_delta` carries content, with a `thinking_delta`
        thinking; `message_start` carries the input count, `message_delta` the final `usage`
        (its counts are cumulative: the last one given wins); `message_stop` ends the answer.
        """
        kind = data.get("type")
        if kind == "content_block_delta":
            delta = data.get("delta")
            if isinstance(delta, dict):
                content = delta.get("text")
                if content or delta.get("thinking"):
                    self._chunk(now, content)
            return
        usage: Any = None
        if kind == "message_start" and isinstance(data.get("message"), dict):
            usage = data["message"].get("usage")
        elif kind == "message_delta":
            usage = data.get("usage")
        elif kind == "message_stop":
            self.done = True
        if isinstance(usage, dict):
            output, prompt, _ = self._counts.get("messages.usage", (None, None, "messages.usage"))
            got_output, got_prompt = (
                _int(usage.get("output_tokens")),
                _int(usage.get("input_tokens")),
            )
            self._counts["messages.usage"] = (
                got_output if got_output is not None else output,
                got_prompt if got_prompt else prompt,  # message_start's 0 is no count yet
                "messages.usage",
            )

    # --- the record --------------------------------------------------------------------------

    def _counted(self) -> tuple[int | None, Source, int | None, Source | None]:
        output: tuple[int | None, Source] = (len(self.chunk_times), "client")
        prompt: tuple[int | None, Source | None] = (None, None)
        order = ("llamacpp.timings", "openai.usage", "responses.usage", "messages.usage", "ollama")
        for source in order:  # later ones win
            if source in self._counts:
                out, pro, name = self._counts[source]
                if out is not None:
                    output = (out, name)
                if pro is not None:
                    prompt = (pro, name)
        return output[0], output[1], prompt[0], prompt[1]

    def record(
        self,
        start: float,
        end: float,
        status: int | None,
        model: str = "",
        prompt_id: str = "",
        warmup: bool = False,
        *,
        failure: str | None = None,
        prompt_words: int | None = None,
        turn: int | None = None,
    ) -> RequestRecord:
        """The request as read: ok when status 200, a final chunk arrived and no error did.

        Args:
            start: Client seconds the request was sent.
            end: Client seconds the answer ended (or failed).
            status: The HTTP status, None when no status line arrived.
            model: The model the request named.
            prompt_id: The workload prompt's id.
            warmup: Sent during warm-up.
            failure: Why the exchange failed on the client's side (an exception, a timeout),
                or None; it takes precedence over what the body said.
            prompt_words: Words of the prompt sent (`RequestRecord.prompt_words`).
            turn: The conversation turn (`RequestRecord.turn`).
        """
        error = self.error
        if status is not None and status != 200:
            body = error_text(bytes(self._error_body), self._key)
            error = f"HTTP {status}: {body}".rstrip(": ")
        if failure is not None and self.error is None:
            # the reader's own error came first (the exchange stops at it): a later timeout
            # or reset would hide why the answer failed
            error = escape_error(failure, key=self._key)
        if error is None and status == 200 and not self.done:
            error = "answer ended without a final chunk"
        if error is None and status is None:
            error = "no answer"
        output, output_source, prompt, prompt_source = self._counted()
        limit = self._max_tokens
        if (
            error is None
            and limit is not None
            and output is not None
            and output_source != "client"
            and output > output_allowance(limit)
        ):
            error = f"the server reported {output} output tokens for at most {limit} asked"
        if error is None and self.first_token is None and not output:
            # No content and no output count: nothing was generated, so no rate may be taken
            # from it (a `data: [DONE]`-only server would otherwise pass with 0 tok/s).
            error = "empty answer"
        decode = prefill = load = None
        timing_source: Source | None = None
        if self._durations is not None:
            decode, prefill, load, timing_source = self._durations
            if decode is None and prefill is None and load is None:
                timing_source = None
        return RequestRecord(
            start=start,
            end=end,
            ok=error is None,
            status=status,
            error=error,
            first_token=self.first_token,
            chunk_times=tuple(self.chunk_times),
            output_tokens=output,
            output_source=output_source,
            prompt_tokens=prompt,
            prompt_source=prompt_source,
            decode_seconds=decode,
            prefill_seconds=prefill,
            load_seconds=load,
            timing_source=timing_source,
            model=model,
            prompt_id=prompt_id,
            warmup=warmup,
            prompt_words=prompt_words,
            turn=turn,
        )
