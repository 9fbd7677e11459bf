"""The neutral request and chunk: what every client surface and every upstream dialect speak.

A client surface (`gateway.api.ollama`, `gateway.api.openai`) turns a client's body into a
`GenerationRequest`, and neutral `Chunk`s back into its client's bytes. An upstream dialect
(`gateway.upstream.dialects.ollama`, `gateway.upstream.dialects.openai`) turns a
`GenerationRequest` into the
upstream's request, and the upstream's answer into `Chunk`s. The engine (`gateway.relay`) moves
chunks from one to the other and measures them; it never looks at a client's or an upstream's
wire format. Two surfaces times two dialects are four paths, none of them written out.

Nothing here does I/O or imports another gateway module: every layer may import it.

Over ~300 lines for one reason: these types are the one contract between the surfaces, the dialects
and the engine, and most of their lines document fields; split, the author of a surface or a dialect
would read several modules to learn the one shape every path shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

#: What a request asks the model to do. `generate` is a prompt (Ollama `/api/generate`,
#: OpenAI `/v1/completions`), `chat` a list of messages, `embed` vectors for input texts.
Operation = Literal["generate", "chat", "embed"]

#: The wire form of a request body: the client surface it came through.
Surface = Literal["ollama", "openai"]

#: How a request ended: the `outcome` label of `gateway_requests_total`, the access log's
#: `outcome` field and the spans' `gateway.outcome` (docs/metrics.md has the table). A batch
#: line (`gateway.batch.line`) also ends `preempted` (an interactive request took its slot) or
#: `deferred` (no spare slot: `gateway.upstream.slots.NoSpareCapacity`, never recorded).
Outcome = Literal[
    "completed",
    "client_disconnect",
    "shutdown",
    "upstream_error",
    "timeout",
    "client_error",
    "rejected_auth",
    "forbidden",
    "rate_limited",
    "rejected_busy",
    "bad_request",
    "not_found",
    "error",
    "preempted",
    "deferred",
]


#: Tokens seen less than this many seconds after the first one arrived with it: in the same
#: read, or after a stall of the reader's event loop. Their spacing says nothing about the
#: upstream's decode speed (no single stream decodes 1000 tokens/s).
SAME_ARRIVAL_SECONDS = 0.001


@dataclass(slots=True)
class TokenClock:
    """When generated tokens were seen, and the decode pace that shows.

    The pace is measured after the first arrival: `(last - first) / (count - at_first)`, in
    seconds per token. With one token per arrival that is the usual `(t_last - t_first) /
    (n - 1)`, which leaves the first token (produced by prefill) out; tokens that came with
    the first one (`at_first`) are left out too, so a burst at the start (a reader that
    stalled, several SSE events in one read) cannot make the pace look near zero.

    Attributes:
        first: `time.perf_counter()` seconds when the first token was seen, or None.
        last: Seconds when the latest token was seen, or None.
        count: Tokens seen (chunks with text).
        at_first: Of those, the ones seen within `SAME_ARRIVAL_SECONDS` of the first.
    """

    first: float | None = None
    last: float | None = None
    count: int = 0
    at_first: int = 0

    def tick(self, now: float) -> None:
        """Record one token seen at `now` (perf-counter seconds)."""
        if self.first is None:
            self.first = now
        if now - self.first < SAME_ARRIVAL_SECONDS:
            self.at_first += 1
        self.last = now
        self.count += 1

    def seconds_per_token(self) -> float | None:
        """The decode pace in seconds per token, or None when no token came after the first."""
        if self.first is None or self.last is None or self.count <= self.at_first:
            return None
        span = self.last - self.first
        return span / (self.count - self.at_first) if span > 0 else None


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One checked client request, whatever surface it came through.

    The body stays in its surface's shape: a dialect of the same family forwards it nearly as
    is (every field the client sent reaches the model), a dialect of the other family
    translates it (`gateway.upstream.dialects.ollama_request`,
    `gateway.upstream.dialects.openai_request`).

    Attributes:
        surface: The shape of `body`: `ollama` (reference sections 2.1, 3.1, 6.6) or `openai`
            (section 7).
        operation: `generate`, `chat` or `embed`.
        body: The client's checked JSON object; `model` is a non-empty string.
        model: The model the request names (what the key's allow-list was checked against):
            after admission, an alias's target (`GATEWAY_MODEL_ALIASES`).
        stream: The client wants the answer streamed (NDJSON or SSE) rather than one object.
        include_usage: OpenAI streams only: `stream_options.include_usage` was set.
        legacy: Ollama's legacy `/api/embeddings` (`{"prompt"}` in, `{"embedding"}` out).
        max_output_tokens: The client's bound on output tokens (`num_predict`, `max_tokens`),
            or None when it set none; what the TPM reservation uses.
        prompt_bytes: UTF-8 bytes of the prompt (for the TPM estimate): a generation's whole
            body but its non-prompt fields (`gateway.limits.estimate.prompt_bytes`), an embedding's
            input texts.
        prompt_tokens: Prompt tokens the client sent as tokens already (a generate `context`).
        body_bytes: Bytes of the client's body: over `INLINE_PARSE_BYTES` the upstream request
            is built in a worker thread (`gateway.relay.exchange`).
        alias: The name the client asked for when it was an alias (`for_model`), else None:
            what a refusal names, so that a key learns no alias's hidden target.
    """

    surface: Surface
    operation: Operation
    body: dict[str, Any]
    model: str
    stream: bool = True
    include_usage: bool = False
    legacy: bool = False
    max_output_tokens: int | None = None
    prompt_bytes: int = 0
    prompt_tokens: int = 0
    body_bytes: int = 0
    alias: str | None = None

    def for_model(self, model: str) -> GenerationRequest:
        """This request for `model` instead (an alias's target, `GATEWAY_MODEL_ALIASES`).

        `model` and the body's `model` are both rewritten (the body is copied, one level), so
        the upstream, the allow-list and everything measured after see the same name; `alias`
        keeps the name the client asked for.
        """
        asked = self.model if self.alias is None else self.alias
        return replace(self, model=model, body={**self.body, "model": model}, alias=asked)

    def with_output_bound(self, tokens: int) -> GenerationRequest:
        """This request with its answer bounded to `tokens` (what the key's TPM granted).

        `max_output_tokens` is what every dialect sends for an OpenAI-shaped body (under every
        bound name the client used, and `max_tokens` or `num_predict`); an Ollama body is
        forwarded as it is, so its `options.num_predict` is rewritten too (the body and its
        options copied, one level each).
        """
        body = self.body
        if self.surface == "ollama":
            options = body.get("options")
            options = {**options} if isinstance(options, dict) else {}
            body = {**body, "options": {**options, "num_predict": tokens}}
        return replace(self, body=body, max_output_tokens=tokens)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call of a tool the model asked for (reference section 3.1).

    Attributes:
        name: The function's name.
        arguments: The arguments as JSON text (OpenAI's form; Ollama's object is encoded).
        id: The call's id when the upstream gave one.
        index: Its position among the answer's calls.
    """

    name: str
    arguments: str
    id: str | None = None
    index: int = 0


@dataclass(slots=True)
class Stats:
    """The counts and durations an answer ends with, named as Ollama names them (section 2.3).

    Durations are nanoseconds. From an OpenAI-compatible upstream the counts are its `usage`
    and the durations the gateway's own measurements (`gateway.upstream.dialects.openai`). None
    means
    unknown (Ollama omits zero fields).
    """

    prompt_eval_count: int | None = None
    eval_count: int | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_duration: int | None = None
    eval_duration: int | None = None

    def as_ollama(self) -> dict[str, int]:
        """The fields Ollama's final chunk carries, zero and unknown ones left out."""
        return {name: value for name in _STATS if (value := getattr(self, name))}


_STATS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


@dataclass(slots=True)
class Chunk:
    """One piece of an answer, in no client's format.

    A streamed answer is text chunks, then one final chunk (`done`) with the reason and the
    stats; or it ends with one error chunk. A non-streamed upstream answer (embeddings) is a
    single final chunk.

    Attributes:
        text: Generated text (`response`, `message.content`, `delta.content`).
        thinking: Reasoning text (Ollama `thinking`, OpenAI `reasoning_content`/`reasoning`).
        tool_calls: Tool calls the model made in this chunk.
        logprobs: Token log-probabilities in OpenAI's `content` list form, when sent.
        done: The answer's final chunk.
        done_reason: `stop`, `length`, ... (Ollama's names) on the final chunk.
        error: The upstream's error message: this chunk replaces the rest of the answer.
        stats: Counts and durations, on the final chunk.
        embeddings: The vectors of an embedding answer, one per input.
        model: On the final chunk, the model the upstream says answered, when it said.
        native: The upstream's own object when it speaks Ollama's API (kept for fields that
            only Ollama clients know, such as `context`).
        raw: The upstream's own NDJSON line (Ollama), relayed unchanged to an Ollama client of
            the same operation: no re-encoding on the hot path.
    """

    text: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] | None = None
    logprobs: list[Any] | None = None
    done: bool = False
    done_reason: str | None = None
    error: str | None = None
    stats: Stats | None = None
    embeddings: list[Any] | None = None
    model: str | None = None
    native: dict[str, Any] | None = field(default=None, repr=False)
    raw: bytes | None = field(default=None, repr=False)

    @classmethod
    def failure(cls, message: str) -> Chunk:
        """The error chunk that ends an answer (reference section 4.3)."""
        return cls(error=message)

    @property
    def generates(self) -> bool:
        """True when the chunk carries generated output: text, thinking or tool calls.

        Thinking counts as output: those tokens are decoded like any other and are included in
        Ollama's `eval_count` (reference section 9.2 item 6).
        """
        return bool(self.text or self.thinking or self.tool_calls)


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """One finished request: its outcome and numbers, measured once (`gateway.metering.meter`).

    Metrics (`gateway.metering.metrics.Metrics.record`), the access log, usage accounting
    (`gateway.metering.usage`) and the trace spans (`gateway.tracing`) all read this one record,
    so nothing is measured twice. No prompt text, no secrets: `key` is the metrics label (the
    key's name, or `all`), `key_id` the key's public id.

    Attributes:
        route: The route label (`/api/chat`, `/v1/chat/completions`, ...).
        model: The model label (bounded by the catalogue).
        key: The key label.
        upstream: `host:port` of the upstream that answered last, or None if none was tried.
        tried: The upstreams the request went to before its first byte, in failover order
            (each once; retries on the same upstream are not repeated here); empty when none.
        route_reason: Why `upstream` was chosen (`gateway_route_decisions_total`'s reasons),
            or None if none was.
        outcome: `completed`, `client_disconnect`, `upstream_error`, `timeout`, ...
        status: The HTTP status the client got (499 when it left before the first byte).
        duration_s: Arrival to the end, seconds.
        ttft_s: Arrival to the first generated token, seconds; None if none came.
        queue_wait_s: Arrival to the upstream request being sent, seconds; None if never sent.
        tokens_in: Prompt tokens as the upstream counted them (0 when unknown).
        tokens_out: Output tokens (the upstream's count, else the chunks relayed).
        tokens_per_s: Decode rate, tokens per second; None if unknown.
        time_per_output_token_s: Seconds per output token after the first; None if unknown.
        prefill_tokens_per_s: Prompt tokens per second of prefill, when the upstream reports it.
        key_id: The API key's public id (the `<id>` of `gw_<id>_<secret>`); None when unknown.
        requested_model: The model as the key's allow-list checked it (not the bounded label):
            the model that ran, so an alias's target (`GATEWAY_MODEL_ALIASES`), never the
            alias itself; None when unknown.
    """

    route: str
    model: str
    key: str
    upstream: str | None
    outcome: Outcome
    status: int
    duration_s: float
    ttft_s: float | None = None
    queue_wait_s: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_per_s: float | None = None
    time_per_output_token_s: float | None = None
    prefill_tokens_per_s: float | None = None
    key_id: str | None = None
    requested_model: str | None = None
    tried: tuple[str, ...] = ()
    route_reason: str | None = None

    def log_fields(self) -> dict[str, Any]:
        """The fields the access log line carries (docs/operations.md), rounded.

        `tried` only when the request failed over: the upstreams in the order it tried them;
        `route_reason` only when an upstream was chosen.
        """
        fields: dict[str, Any] = {"outcome": self.outcome, "upstream": self.upstream}
        if self.route_reason is not None:
            fields["route_reason"] = self.route_reason
        if len(self.tried) > 1:
            fields["tried"] = list(self.tried)
        return {
            **fields,
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 6),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_per_s": None if self.tokens_per_s is None else round(self.tokens_per_s, 3),
            "duration_s": round(self.duration_s, 6),
        }
