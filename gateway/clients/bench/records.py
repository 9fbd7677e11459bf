"""What one measured request yields: `RequestRecord`, with the source of every number.

A record is built by the load generator (`gateway.clients.bench.wire` reads the answer,
`gateway.clients.bench.protocol` understands its dialect) and consumed by the statistics, the load
shapes and the reports. All times are seconds on the load generator's `time.perf_counter()`
clock, durations in seconds, counts in tokens.

Token counts and server-side durations come from the server wherever it reports them: Ollama's
final chunk (`eval_count`, `eval_duration`, `prompt_eval_count`, `prompt_eval_duration`,
`load_duration`; ../shared/reference/ollama-protocol.md section 3), OpenAI's `usage`
(`completion_tokens`, `prompt_tokens`), llama.cpp's `timings` (`predicted_n`, `predicted_ms`,
`prompt_n`, `prompt_ms`). Only when the server reports nothing does a value fall back to the
client's own count of content chunks, and the record says so (`Source`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

Source = Literal[
    "ollama", "openai.usage", "llamacpp.timings", "responses.usage", "messages.usage", "client"
]
"""Where a number came from: a server's own counter, or the client's clock and chunk count.

`responses.usage`: the `usage` of a Responses stream's `response.completed` (or
`response.incomplete`); `messages.usage`: the `usage` of an Anthropic `message_delta`."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the load generator saw it and as the server reported it.

    Attributes:
        start: perf_counter seconds when the request's first byte was sent.
        end: perf_counter seconds when the answer ended (or failed).
        ok: The answer completed: status 200 and a final chunk (`done`, `[DONE]`), no error line.
        status: The HTTP status, None when no status line arrived.
        error: Why it failed (status and the start of the error body, or the exception), or None.
        first_token: perf_counter seconds of the first chunk carrying non-empty text (or
            thinking text), None if none arrived.
        chunk_times: perf_counter seconds of every content chunk, in order (its first is
            `first_token`); their gaps are the inter-token latencies.
        output_tokens: Tokens generated (server's count when reported, see `output_source`).
        output_source: Where `output_tokens` came from.
        prompt_tokens: Tokens in the prompt as the server counted them (None: not reported).
        prompt_source: Where `prompt_tokens` came from (None when not reported).
        decode_seconds: The server's decode time (`eval_duration`, `predicted_ms`), or None.
        prefill_seconds: The server's prompt processing time (`prompt_eval_duration`,
            `prompt_ms`), or None.
        load_seconds: The server's model load time in this request (Ollama `load_duration`),
            or None.
        timing_source: Where the three server durations came from (None: none reported).
        model: The model the request named.
        prompt_id: The workload prompt's id (`gateway.clients.bench.workload`).
        warmup: Sent during warm-up; excluded from every statistic.
        prompt_words: Words (whitespace-separated) of everything the request's prompt held
            (all messages of a multi-turn conversation's history), or None when not counted.
        turn: The turn (1, 2, ...) of a multi-turn conversation, or None.
    """

    start: float
    end: float
    ok: bool
    status: int | None
    error: str | None
    first_token: float | None
    chunk_times: tuple[float, ...]
    output_tokens: int | None
    output_source: Source
    prompt_tokens: int | None = None
    prompt_source: Source | None = None
    decode_seconds: float | None = None
    prefill_seconds: float | None = None
    load_seconds: float | None = None
    timing_source: Source | None = None
    model: str = ""
    prompt_id: str = ""
    warmup: bool = False
    prompt_words: int | None = None
    turn: int | None = None

    @property
    def ttft(self) -> float | None:
        """Seconds from the request sent to the first content chunk (client clock), or None."""
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> float:
        """Seconds from the request sent to the end of the answer (client clock)."""
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - TTFT) / (output_tokens - 1), seconds.

        The client's clock over the server's token count (vLLM's definition); None with fewer
        than two tokens or no first token.
        """
        if self.first_token is None or self.output_tokens is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)

    @property
    def inter_token_latencies(self) -> tuple[float, ...]:
        """Gaps between successive content chunks, seconds (client clock)."""
        times = self.chunk_times
        return tuple(later - earlier for earlier, later in pairwise(times))

    @property
    def decode_rate(self) -> tuple[float, Source] | None:
        """Decode tokens/s and its source: the server's counters, else the client's TPOT.

        A rate that is not finite (a count over a vanishing duration) is missing, not infinite.
        """
        if self.decode_seconds and self.output_tokens and self.timing_source is not None:
            rate = self.output_tokens / self.decode_seconds
            if math.isfinite(rate):
                return rate, self.timing_source
        tpot = self.tpot
        return None if not tpot or not math.isfinite(1.0 / tpot) else (1.0 / tpot, "client")

    @property
    def prefill_rate(self) -> tuple[float, Source] | None:
        """Prefill (prompt processing) tokens/s from the server's counters, or None.

        None too when it is not finite (a count over a vanishing duration).
        """
        if self.prefill_seconds and self.prompt_tokens and self.timing_source is not None:
            rate = self.prompt_tokens / self.prefill_seconds
            if math.isfinite(rate):
                return rate, self.timing_source
        return None
