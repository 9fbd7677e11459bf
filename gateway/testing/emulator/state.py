"""What the Ollama emulator is told and what it saw: its knobs, its records, their shared state.

Owns `EmulatorConfig` (the knobs tests change between requests), `ReceivedRequest` (one request as
the emulator saw it), `EmulatorState` (both, shared between the server and test threads, plus
what the model management routes changed: installed models and uploaded blobs; and the models'
slots and loads, `Capacity`), the fault and outcome vocabularies, and how a handler finds its
request's record and config snapshot.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from gateway.testing.emulator.capacity import Capacity

if TYPE_CHECKING:
    from starlette.requests import Request

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
Outcome = Literal["completed", "client_disconnect", "fault"]

FAULTS: frozenset[str] = frozenset(get_args(Fault))
RECORD_KEY = "gateway.emulator.record"
"""The ASGI scope key under which the front door files each request's `ReceivedRequest`."""


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
        prompt_eval_count: Reported prompt tokens (0 is omitted, §9.2).
        load_duration_ns: The warm part of `load_duration`, carved from the prefill (0 is
            omitted); a cold load (`cold_load`) adds to it.
        embedding_dimensions: Length of the embedding vectors (§6.6, §7.4).
        context_length: The loaded context (`/api/ps`); an embedding input of more words
            is truncated, or refused with `truncate: false` (§6.6).
        tool_call: Answer a chat request that offers `tools` (both faces) with a call to the
            first tool instead of text (§3.2, §7.1).
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
    prompt_eval_count: int = 12
    load_duration_ns: int = 1_000_000
    embedding_dimensions: int = 8
    context_length: int = 4096
    tool_call: bool = False
    tool_arguments: dict[str, Any] | None = None
    registry: list[str] | None = None
    parallel: int = 0
    batch_slowdown: float = 0.0
    max_queue: int | None = None
    cold_load: float = 0.0
    llamacpp_timings: bool = False


@dataclass(eq=False)
class ReceivedRequest:
    """One request as the emulator saw it. Written by the server thread, read by tests.

    The record ends just after the last byte is handed to the server, so a client can see the
    end first: call `wait_ended` before reading `outcome` or `ended_at`.

    Attributes:
        method: HTTP method.
        path: URL path without the query.
        headers: Lower-case names; repeated headers joined with ", ".
        body: The decoded JSON body, or None (no body, or not JSON).
        started_at: `time.monotonic()` at arrival.
        first_byte_at: When the status line and headers went out, or None.
        ended_at: When the exchange ended, or None while it runs.
        tokens_sent: Tokens produced (streamed, or held for a `stream: false` body).
        outcome: `completed` (whatever the status), `client_disconnect` (the client left before
            the end) or `fault` (an injected fault ended it); None while it runs.
        status: The response status, or None before the headers.
    """

    method: str
    path: str
    headers: dict[str, str]
    body: Any = None
    started_at: float = field(default_factory=time.monotonic)
    first_byte_at: float | None = None
    ended_at: float | None = None
    tokens_sent: int = 0
    outcome: Outcome | None = None
    status: int | None = None
    _ended: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def wait_ended(self, timeout: float) -> bool:
        """Block until the exchange ended or the disconnect was noticed; False on timeout."""
        return self._ended.wait(timeout)

    def finish(self, outcome: Outcome) -> None:
        """Mark the end once; an outcome set earlier (e.g. `fault`) wins."""
        if self._ended.is_set():
            return
        if self.outcome is None:
            self.outcome = outcome
        self.ended_at = time.monotonic()
        self._ended.set()


class EmulatorState:
    """The live config plus every request seen, shared between the server and test threads.

    The model management routes (§6.7) edit `config.models`, the emulator's model store, by
    replacing the list, so a request's config snapshot never changes under it. `blobs` holds
    the digests uploaded with `POST /api/blobs/:digest`. `capacity` holds each model's slots,
    queue and load (`gateway.testing.emulator.capacity`); only the server's event loop uses it.
    """

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.booted_at = time.time()
        self.blobs: set[str] = set()
        self.capacity = Capacity()
        self._modified: dict[str, float] = {}
        self._arrived = threading.Condition()
        self._records: list[ReceivedRequest] = []
        self._ids = itertools.count()

    def install(self, name: str) -> None:
        """Add a model (pulled, copied or created), or refresh its `modified_at`."""
        self._modified[name.lower()] = time.time()
        models = self.config.models
        if all(model.lower() != name.lower() for model in models):
            self.config.models = [*models, name]

    def uninstall(self, name: str) -> None:
        """Remove a model (`DELETE /api/delete`); `name` is as `config.models` spells it."""
        self.config.models = [model for model in self.config.models if model != name]

    def modified_at(self, name: str) -> float:
        """When a model was installed: its install time, or the emulator's boot time."""
        return self._modified.get(name.lower(), self.booted_at)

    @property
    def records(self) -> list[ReceivedRequest]:
        """A snapshot of the requests seen so far, oldest first."""
        with self._arrived:
            return list(self._records)

    def add(self, record: ReceivedRequest) -> None:
        """Append a new request and wake `wait_for_requests`."""
        with self._arrived:
            self._records.append(record)
            self._arrived.notify_all()

    def wait_for_requests(self, count: int, timeout: float) -> bool:
        """Block until at least `count` requests arrived; False on timeout."""
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self._records) >= count, timeout)

    def clear(self) -> None:
        """Forget the requests seen (long benchmarks call this to bound memory)."""
        with self._arrived:
            self._records.clear()

    def next_id(self) -> int:
        """Return a per-app sequence number for `/v1` ids."""
        return next(self._ids)


def request_context(request: Request) -> tuple[EmulatorState, EmulatorConfig, ReceivedRequest]:
    """Return the state, a snapshot of the config taken now, and this request's record."""
    state: EmulatorState = request.app.state.emulator
    return state, dataclasses.replace(state.config), request.scope[RECORD_KEY]
