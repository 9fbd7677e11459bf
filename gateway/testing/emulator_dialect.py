"""The contract between the emulator's engine and its faces: what a generation produces.

Owns `Piece` (one chunk's text), `Summary` (what the final chunk reports), `Event` (one streamed
event) and the `Dialect` protocol through which the engine (`gateway.testing.emulator_engine`)
asks the native face (`emulator_native`) and the OpenAI face (`emulator_openai`) to render them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Event = dict[str, Any] | str
"""One streamed event: a JSON object, or raw text such as SSE `[DONE]`."""


@dataclass(frozen=True)
class Piece:
    """One streamed chunk's text; `counted` is False for the empty first chunk."""

    content: str = ""
    thinking: str = ""
    counted: bool = True


@dataclass(frozen=True)
class Summary:
    """What the final chunk reports (§2.3). Durations are nanoseconds."""

    done_reason: str
    prompt_eval_count: int
    eval_count: int
    total_duration: int
    load_duration: int
    prompt_eval_duration: int
    eval_duration: int

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
