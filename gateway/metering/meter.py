"""Per-request measurement: TTFT, token counts, decode rate, outcome; recorded exactly once.

Sources of each number (also in `docs/metrics.md`):

* TTFT: `time.perf_counter()` at the request's arrival (the ASGI middleware) to the moment the
  first chunk carrying generated text (response, content, thinking or tool calls) is handed to
  the server for sending. For `stream:false` it ends when that chunk reaches the gateway.
* Input tokens: the final chunk's `prompt_eval_count` (Ollama) or the upstream's usage (OpenAI);
  when no final chunk came because the client left after the request was sent upstream, the
  prompt's estimate (`gateway.limits.estimate`: the upstream had it and ran its prefill).
  The key's TPM is charged at least the estimate whenever the upstream took the prompt
  (`RequestMeter.charged_tokens`).
* Output tokens: the final chunk's `eval_count` (Ollama) or the upstream's usage (OpenAI); when
  the stream ends early, the number of text-bearing chunks relayed (one token each in Ollama).
* Decode tokens/s: `eval_count / eval_duration * 1e9` when the upstream itself reports both in
  nanoseconds (Ollama, reference section 9.1); else measured here as
  `(n - 1) / (t_last - t_first)` over the times the text chunks were sent, which leaves the first
  token (produced by prefill) out, and with it any chunk sent within a millisecond of the first
  (`gateway.neutral.TokenClock`: a burst says nothing about the upstream's speed).
* Prefill tokens/s: `prompt_eval_count / prompt_eval_duration * 1e9`, only when the upstream
  reports both (Ollama); prompt-cache hits inflate it (reference section 9.2 item 3).
* Queue wait: arrival to the moment the upstream request is sent.
* Time per output token: `eval_duration / max(eval_count - 1, 1)` (reference section 9.1), or
  `(t_last - t_first) / (n - 1)` as measured (the same burst left out).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.metering.metrics import Metrics, RequestSeries
from gateway.neutral import Chunk, Outcome, RequestSummary, Stats, TokenClock


@dataclass(eq=False)  # compared and hashed by identity: `LiveBoard.running` holds it
class RequestMeter:
    """Observations of one request; `finish` turns them into its `RequestSummary`, once.

    Attributes:
        arrival: `time.perf_counter()` seconds when the gateway received the request.
        upstream_timings: Whether the final chunk's durations come from the upstream itself.
        sent_at: perf-counter seconds when the upstream request was sent, or None.
        tokens: When the chunks with generated text were seen (first, last, how many).
        final: The final chunk's stats, when one arrived.
        finish_reason: The final chunk's `done_reason` (`stop`, `length`, ...), when sent.
        response_model: The model the upstream says answered (final chunk), when it said.
        outcome: `completed`, `client_disconnect`, `upstream_error`, `timeout`, ...
        upstream: The upstream tried last (`host:port`), or None.
        tried: Every upstream tried before the first byte, in order (`Generation.connect`).
        route_reason: Why the last upstream was chosen (`gateway.upstream.scheduling`).
        key_id: The API key's id, carried into the summary (usage accounting).
        requested_model: The model the allow-list checked (an alias's target), into the summary.
        prompt_estimate: The request's estimated prompt tokens (`gateway.limits.estimate`):
            charged when the upstream had the prompt but its own count never came.
        summary: The request's summary once `finish` ran.
    """

    metrics: Metrics
    route: str
    model: str
    key: str
    arrival: float
    upstream_timings: bool = True
    sent_at: float | None = None
    tokens: TokenClock = field(default_factory=TokenClock)
    final: Stats | None = None
    finish_reason: str | None = None
    response_model: str | None = None
    outcome: Outcome | None = None
    status: int = 200
    upstream: str | None = None
    tried: list[str] = field(default_factory=list)
    route_reason: str | None = None
    key_id: str | None = None
    requested_model: str | None = None
    prompt_estimate: int = 0
    summary: RequestSummary | None = field(default=None, repr=False)
    series: RequestSeries = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.series = self.metrics.series(self.route, self.model, self.key)
        self.series.in_flight.inc()
        self.metrics.live.running.add(self)

    def observe(self, chunk: Chunk) -> None:
        """Account for one chunk just before it goes to the client."""
        if chunk.text or chunk.thinking or chunk.tool_calls:
            self.tokens.tick(time.perf_counter())
        if chunk.done:
            self.final = chunk.stats or Stats()
            self.finish_reason = chunk.done_reason
            self.response_model = chunk.model

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first generated token, or None if none came."""
        first = self.tokens.first
        return None if first is None else first - self.arrival

    @property
    def input_tokens(self) -> int:
        """Prompt tokens, as far as this request is concerned.

        The upstream's count (`prompt_eval_count`, `usage`) when its final chunk came; the
        estimate when the client left after the request was sent upstream (it had the prompt,
        prefill ran, the count never came); else 0 (not sent, or cut short by the upstream:
        not the key's to pay).
        """
        if self.final is not None:
            return self.final.prompt_eval_count or 0
        return self.prompt_estimate if self._prompt_processed() else 0

    @property
    def charged_tokens(self) -> int:
        """Tokens the key's TPM is charged once the request ended: prompt + output.

        Once the upstream processed the prompt, the prompt counts at least at its estimate:
        an upstream's count can be far below what it was sent (a prompt truncated to the
        context, a server that reports no usage, an emulator's constant), and the window must
        bound what the key sends, so repeated large prompts are limited.
        """
        prompt = self.input_tokens
        if self._prompt_processed():
            prompt = max(prompt, self.prompt_estimate)
        return prompt + self.output_tokens

    def _prompt_processed(self) -> bool:
        """The upstream took the prompt: its answer ended, or the client left after sending."""
        if self.final is not None:
            return True
        return self.sent_at is not None and self.outcome == "client_disconnect"

    @property
    def output_tokens(self) -> int:
        """Generated tokens: upstream's `eval_count`, else the text chunks relayed."""
        return (self.final.eval_count if self.final else None) or self.tokens.count

    def decode_rate(self) -> tuple[float, float] | None:
        """Return (output tokens per second, seconds per output token), or None if unknown."""
        rate = self._reported_rate("eval_count", "eval_duration")
        if rate is not None:
            count = (self.final.eval_count if self.final else None) or 1
            return rate, count / rate / max(count - 1, 1)
        pace = self.tokens.seconds_per_token()
        return None if pace is None else (1 / pace, pace)

    def _reported_rate(self, count_field: str, duration_field: str) -> float | None:
        """`count / duration * 1e9` from the final chunk, if the upstream reported both."""
        final = self.final or Stats()
        count: int | None = getattr(final, count_field)
        duration_ns: int | None = getattr(final, duration_field)
        if not self.upstream_timings or not count or not duration_ns:
            return None
        return count / duration_ns * 1e9

    def finish(self, outcome: Outcome, status: int | None = None) -> RequestSummary:
        """Summarize the request and record it into the metrics, once.

        Args:
            outcome: The `outcome` label (see `docs/metrics.md`). The first call wins.
            status: Final HTTP status, when it differs from 200.

        Returns:
            The request's `RequestSummary`; later calls return the same one.
        """
        if self.summary is not None:
            return self.summary
        self.outcome = outcome  # before the summary: `input_tokens` depends on it
        if status is not None:
            self.status = status
        rate = self.decode_rate()
        summary = self.summary = RequestSummary(
            route=self.route,
            model=self.model,
            key=self.key,
            upstream=self.upstream,
            tried=tuple(self.tried),
            route_reason=self.route_reason,
            outcome=outcome,
            status=self.status,
            duration_s=time.perf_counter() - self.arrival,
            ttft_s=self.ttft,
            queue_wait_s=None if self.sent_at is None else self.sent_at - self.arrival,
            tokens_in=self.input_tokens,
            tokens_out=self.output_tokens,
            tokens_per_s=None if rate is None else rate[0],
            time_per_output_token_s=None if rate is None else rate[1],
            prefill_tokens_per_s=self._reported_rate("prompt_eval_count", "prompt_eval_duration"),
            key_id=self.key_id,
            requested_model=self.requested_model,
        )
        self.metrics.record(self.series, summary)
        self.metrics.live.finished(self, summary)
        return summary

    def drop(self) -> None:
        """Forget a request that never became one (a batch line put back untried); once.

        It leaves the in-flight gauge and the live view, and is recorded nowhere else.
        """
        if self.summary is None and self in self.metrics.live.running:
            self.series.in_flight.dec()
            self.metrics.live.dropped(self)
