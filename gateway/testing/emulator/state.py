"""What the Ollama emulator is told and what it saw: its knobs, its records, their shared state.

Owns `ReceivedRequest` (one request as the emulator saw it), `EmulatorState` (the knobs,
`gateway.testing.emulator.config.EmulatorConfig`, and the records, shared between the server and
test threads, plus what the model management routes changed: installed models and uploaded
blobs; and the models' slots and loads, `Capacity`), the outcome vocabulary, and how a handler
finds its request's record and config snapshot.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gateway.testing.emulator.capacity import Capacity
from gateway.testing.emulator.config import EmulatorConfig

if TYPE_CHECKING:
    from starlette.requests import Request

Outcome = Literal["completed", "client_disconnect", "fault"]

RECORD_KEY = "gateway.emulator.record"
"""The ASGI scope key under which the front door files each request's `ReceivedRequest`."""


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
        self.capacity.preload(config)
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

    def reset(self) -> None:
        """Start over: no records, fresh runners (empty caches, zero counters), the preloads."""
        self.clear()
        self.capacity = Capacity()
        self.capacity.preload(self.config)

    def next_id(self) -> int:
        """Return a per-app sequence number for `/v1` ids."""
        return next(self._ids)


def request_context(request: Request) -> tuple[EmulatorState, EmulatorConfig, ReceivedRequest]:
    """Return the state, a snapshot of the config taken now, and this request's record."""
    state: EmulatorState = request.app.state.emulator
    return state, dataclasses.replace(state.config), request.scope[RECORD_KEY]
