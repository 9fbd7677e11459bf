"""The contract between the emulator's engine and its faces: what a generation produces.

Owns `Piece` (one chunk's text or tool call), `ToolCall`, `Summary` (what the final chunk
reports), `Event` (one streamed event) and the `Dialect` protocol through which the engine
(`gateway.testing.emulator.engine`) asks the native face (`native`) and the OpenAI face
(`openai`) to render them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Event = dict[str, Any] | str
"""One streamed event: a JSON object, or raw text such as SSE `[DONE]`."""


@dataclass(frozen=True)
class ToolCall:
    """A call the emulated model makes to a tool the request offered (reference §3.1).

    Attributes:
        id: `call_` plus 8 lowercase alphanumerics, Ollama's `toolCallId()` format.
        name: The tool's function name.
        arguments: The arguments object (a JSON string on the OpenAI face, §3.1).
    """

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Piece:
    """One step of a generation: a chunk's text, or a tool call.

    Attributes:
        content: Answer text.
        thinking: Thinking text (§2.3).
        counted: False for the empty first chunk, which is no token.
        silent: A token generated but not sent: while tools are offered, Ollama's tool parser
            holds text back, so a call arrives late, in one chunk (§3.2).
        tool_call: The call this chunk carries, if any.
    """

    content: str = ""
    thinking: str = ""
    counted: bool = True
    silent: bool = False
    tool_call: ToolCall | None = None


@dataclass(frozen=True)
class Summary:
    """What the final chunk reports (§2.3). Durations are nanoseconds.

    `tool_called` tells the OpenAI face to report `finish_reason: "tool_calls"` (§7.1).
    `cached_tokens` is the part of `prompt_eval_count` found in the prefix cache, or None
    without a prefix cache (`EmulatorConfig.prefill_rate` 0): like Ollama since v0.30.1,
    `prompt_eval_count` counts the whole prompt, cached or not, and `prompt_eval_duration`
    only the tokens prefilled (reference §9.2 item 3).
    """

    done_reason: str
    prompt_eval_count: int
    eval_count: int
    total_duration: int
    load_duration: int
    prompt_eval_duration: int
    eval_duration: int
    tool_called: bool = False
    cached_tokens: int | None = None

    def metrics(self) -> dict[str, int]:
        """The metric fields in Go struct order, zero ones omitted (`omitempty`, §9.2)."""
        names = (
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_count",
            "eval_duration",
        )
        return {name: getattr(self, name) for name in names if getattr(self, name)}

    def llamacpp_timings(self) -> dict[str, float]:
        """The same counts as llama.cpp server's `timings` object: milliseconds and rates.

        `prompt_*` is the prefill (`prompt_eval_*`), `predicted_*` the decode (`eval_*`); a
        rate or per-token time over zero is 0.0 (llama.cpp would print inf or nan). With a
        prefix cache, llama.cpp's `prompt_n` counts only the tokens prefilled and `cache_n`
        the ones reused (tools/server `result_timings`), so `cache_n` leads.
        """
        timings: dict[str, float] = {}
        cached = self.cached_tokens
        if cached is not None:
            timings["cache_n"] = cached
        for side, count, nanos in (
            ("prompt", self.prompt_eval_count - (cached or 0), self.prompt_eval_duration),
            ("predicted", self.eval_count, self.eval_duration),
        ):
            ms = nanos / 1e6
            timings[f"{side}_n"] = count
            timings[f"{side}_ms"] = ms
            timings[f"{side}_per_token_ms"] = ms / count if count else 0.0
            timings[f"{side}_per_second"] = 1e3 * count / ms if ms else 0.0
        return timings


class Dialect(Protocol):
    """How one endpoint family renders what the engine produces."""

    @property
    def sse(self) -> bool:
        """True for `data: ...` SSE framing, False for NDJSON lines."""

    @property
    def media_type(self) -> str:
        """Content type of a streamed answer."""

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """Render an error sent before the first byte."""

    def chunk(self, piece: Piece, index: int) -> list[Event]:
        """Render one token chunk."""

    def finish(self, summary: Summary) -> list[Event]:
        """Render the end of a complete stream."""

    def midstream_error(self, message: str) -> list[Event]:
        """Render an error after the status line went out."""

    def body(self, pieces: list[Piece], summary: Summary | None) -> dict[str, Any]:
        """Render a `stream: false` answer; `summary` is None when no final chunk came."""
