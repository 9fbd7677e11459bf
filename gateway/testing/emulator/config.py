"""The Ollama emulator's knobs: `EmulatorConfig`, and the faults it can inject.

Below everything else of the emulator: its capacity, catalog and content read the knobs, and its
state holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Fault = Literal[
    "status_before",
    "busy",
    "not_found",
    "error_midstream",
    "hang_before",
    "hang_midstream",
    "drop_midstream",
    "eof_without_done",
    "malformed",
]

FAULTS: frozenset[str] = frozenset(get_args(Fault))


@dataclass
class EmulatorConfig:
    """The emulator's knobs. Mutable: tests change them between requests.

    Each request takes a snapshot when it arrives, so a change never affects one in flight.
    A generation's time line is: a cold load (`cold_load`, only for a model's first request
    after start or unload), a wait for a slot (`parallel`, FIFO), prefill (`ttft`), then one
    gap per token (`inter_token`, stretched by `batch_slowdown` while other generations of the
    model run), so TTFT = load + queue wait + `ttft`. The defaults (`parallel` 0, `cold_load`
    0, `batch_slowdown` 0) leave only `ttft` and `inter_token`. The reported durations are
    measured from the real delays: `load_duration` is the cold load waited plus
    `load_duration_ns` (capped at the measured prefill, which it is carved from, as a warm
    runner's lookup); `prompt_eval_duration` the rest of the prefill (the queue wait is in no
    counter but `total_duration`, as in Ollama); `eval_duration` from the first chunk to the
    final one, the decode time actually spent; `total_duration` from arrival to the end.
    Capacity semantics live in `gateway.testing.emulator.capacity`; embeddings ignore them.

    Attributes:
        models: Installed model names; any other model gets 404 (§4.2).
        ttft: Seconds of prefill: from the slot (arrival, without a load or queue wait) to
            the first chunk, and to the headers (§1).
        inter_token: Seconds between chunks for a generation running alone (see
            `batch_slowdown`).
        tokens: Content tokens per answer (`"tok0 "`, `"tok1 "`, ...). A JSON `format` answer
            is cut into this many pieces; a tool call arrives after this many tokens.
        thinking_tokens: Thinking-only chunks sent before the content (§2.3).
        empty_first_chunk: Send one chunk with empty text first.
        fault: None, or one of these (`FAULTS`). Before any byte: `status_before`
            (`fault_status` with `fault_message`), `busy` (503 and the busy text), `not_found`
            (404 for any model), `hang_before` (never answer; only the client leaving ends
            it). After `fault_after` tokens, at the time the next chunk was due:
            `error_midstream` (one error line, then the end; status stays 200, §4.3/§4.4),
            `hang_midstream` (send nothing more, keep the connection open),
            `drop_midstream` (close the TCP connection mid-body), `eof_without_done` (end the
            body cleanly with no final chunk), `malformed` (one line that is not JSON, then
            the end). Without streaming, `error_midstream` answers `fault_status` (§2.4) and
            `eof_without_done` answers `done: false` without metrics.
        fault_after: Tokens sent before a mid-stream fault.
        fault_status: Status of `status_before`, and of `error_midstream` without streaming.
        fault_message: Error text of `status_before` and `error_midstream`.
        version: What `/api/version` reports.
        host_gate: 403 with an empty body for a non-local `Host` (§6.8).
        origin_gate: 403 with an empty body for a disallowed `Origin` (§6.8).
        omit_usage: Never send `usage` on `/v1`, like servers without `include_usage`.
        prompt_eval_count: Reported prompt tokens (0 is omitted, §9.2): a constant, 12 by
            default, or None to count the prompt's words (`engine.prompt_tokens`).
        load_duration_ns: The warm part of `load_duration`, carved from the prefill (0 is
            omitted); a cold load (`cold_load`) adds to it.
        embedding_dimensions: Length of the embedding vectors (§6.6, §7.4).
        context_length: The loaded context (`/api/ps`); an embedding input of more words
            is truncated, or refused with `truncate: false` (§6.6).
        tool_call: Answer a chat request that offers `tools` (both faces) with a call to the
            first tool (or `tool_name`) instead of text (§3.2, §7.1); a conversation that ends
            with a tool's result is answered with text.
        tool_name: The tool to call when it is offered (an agent offers many); None, or a
            name not offered, calls the first.
        tool_arguments: The call's arguments; None derives them from the tool's `parameters`
            schema (each property gets a fixed value of its type).
        registry: The models `/api/pull` (and `/api/create` from a missing model) can fetch;
            None lets every name be pulled. Others fail mid-stream (§6.7).
        parallel: Generations a model runs at once, like `OLLAMA_NUM_PARALLEL`; the rest wait
            in a FIFO queue. 0 is unlimited.
        batch_slowdown: k in the per-token gap `inter_token * (1 + k * (b - 1))`, where b is
            the model's generations holding a slot (in prefill or decode) as a token goes out,
            like a GPU whose step time grows with the batch. 0 keeps `inter_token` flat.
        max_queue: Requests that may wait for a slot, like `OLLAMA_MAX_QUEUE`; one more is
            answered 503 with Ollama's busy text at once. None is unbounded.
        cold_load: Seconds a model's first generation after start, or after an unload
            (`keep_alive: 0`), waits for the load, reported in its `load_duration` and part of
            its TTFT; requests arriving during the load wait for the same load. `/api/ps` then
            lists only loaded models. 0 (the default) means every model is loaded at start.
        llamacpp_timings: On `/v1`, add llama.cpp server's `timings` object (`prompt_n`,
            `prompt_ms`, ..., `predicted_per_second`) to the last chunk before `[DONE]` and
            to the `stream: false` body.
        model_size: GB of memory each model takes once loaded (weights and KV cache), unless
            `model_sizes` names it; `/api/ps` reports it as `size` and `size_vram`.
        model_sizes: GB per model name (canonical `name:tag`, any case), overriding
            `model_size`.
        memory: GB the loaded models may take together; a load past it evicts the least
            recently used idle model, or waits for one to be idle (`capacity`); a model larger
            than this is refused with Ollama's 500. None: no limit.
        load_rate: GB/s a model loads at: a cold load takes its size / `load_rate` (instead of
            `cold_load`), reported in `load_duration`. 0: `cold_load` applies.
        keep_alive: Seconds an idle model stays loaded (Ollama's default 5m) in residency
            mode; `/api/ps` reports the end as `expires_at`. Negative: forever.
        preload: Models loaded at start; with it (or `memory` or `load_rate`) the emulator
            tracks residency: any other model is not loaded until asked for.
        prefill_rate: Prompt tokens/s of prefill. When above 0, prompts are tokenised
            (`gateway.testing.emulator.prefix`; `prompt_eval_count` is the token count, not
            the knob), and TTFT = queue wait + load + `ttft` + uncached prompt tokens /
            `prefill_rate`. 0: prefill is `ttft` alone, as before.
        cache_tokens: Tokens each model's prefix (KV) cache holds on this server, LRU;
            0 caches nothing. Needs `prefill_rate` above 0 to matter.
        prefill_shared: `prefill_rate` is the server's, shared by the generations (of any
            model) prefilling at once, as one GPU's compute is: two prompts prefilled together
            take twice as long each (llama.cpp puts every slot's prompt tokens in one `n_batch`
            step). False: each prefills at the full rate.
    """

    models: list[str] = field(default_factory=lambda: ["llama3.2:latest", "qwen2.5:7b"])
    ttft: float = 0.05
    inter_token: float = 0.01
    tokens: int = 16
    thinking_tokens: int = 0
    empty_first_chunk: bool = False
    fault: Fault | None = None
    fault_after: int = 5
    fault_status: int = 500
    fault_message: str = "an error was encountered while running the model"
    version: str = "0.33.0"
    host_gate: bool = True
    origin_gate: bool = True
    omit_usage: bool = False
    prompt_eval_count: int | None = 12
    load_duration_ns: int = 1_000_000
    embedding_dimensions: int = 8
    context_length: int = 4096
    tool_call: bool = False
    tool_name: str | None = None
    tool_arguments: dict[str, Any] | None = None
    registry: list[str] | None = None
    parallel: int = 0
    batch_slowdown: float = 0.0
    max_queue: int | None = None
    cold_load: float = 0.0
    llamacpp_timings: bool = False
    model_size: float = 0.0
    model_sizes: dict[str, float] = field(default_factory=dict)
    memory: float | None = None
    load_rate: float = 0.0
    keep_alive: float = 300.0
    preload: list[str] | None = None
    prefill_rate: float = 0.0
    cache_tokens: int = 0
    prefill_shared: bool = False

    @property
    def resident(self) -> bool:
        """Residency is tracked: `memory`, `load_rate` or `preload` is set."""
        return self.memory is not None or self.load_rate > 0 or self.preload is not None

    def size_of(self, model: str) -> float:
        """The model's size in GB (`model_sizes`, else `model_size`)."""
        wanted = _tagged(model)
        for name, size in self.model_sizes.items():
            if _tagged(name) == wanted:
                return size
        return self.model_size

    def load_seconds(self, model: str) -> float:
        """Seconds a cold load of the model takes: size / `load_rate`, else `cold_load`."""
        if self.load_rate > 0:
            return self.size_of(model) / self.load_rate
        return self.cold_load


def _tagged(name: str) -> str:
    """`name:tag` in lower case, `latest` by default (`catalog.canonical`, which imports this)."""
    name = name.lower()
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
