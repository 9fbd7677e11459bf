"""Whether a server has a model loaded, and what loading it there would cost.

Ollama says which models it holds (`/api/ps`, read by the monitor every poll). A model the
gateway was answered for since that read counts as loaded too (it has just been loaded).
Another server (the OpenAI dialect: llama.cpp, vLLM) says nothing: a model counts as loaded
there for `SERVED_TTL` after the gateway was last answered for it, then as unknown.

A load the gateway itself started (it sent a model to a server that did not hold it) counts as
under way until that server answers for the model, or its expected end (`LOAD_GRACE` times the
load's expected seconds) passes: a second request for the model then waits for that load (its
cost is the time left) rather than starting a second one elsewhere while the server's
`/api/ps` does not list the model yet.

A cold load costs the model's size over the server's load rate: the size as some server's
`/api/ps` reports it, the rate learned from Ollama's `load_duration` in final chunks (an
exponential average per server), `DEFAULT_LOAD_RATE` before any.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Protocol

from gateway.upstream.monitor import LoadedModel

#: Seconds a model counts as loaded after an answer, where the server does not say: Ollama's
#: default `keep_alive` (5 minutes); llama.cpp and vLLM keep their one model loaded anyway.
SERVED_TTL = 300.0

#: (server, model) pairs remembered at most: past it, the expired ones go, then the oldest
#: half, so model names a client varies (case, tags) cannot grow the table without bound.
MAX_SERVED = 4096

#: Bytes per second a server loads a model at before one was measured: about what a GGUF of
#: a few GB takes from a local NVMe disk into GPU memory (an order of magnitude, then learned).
DEFAULT_LOAD_RATE = 1e9

#: Seconds a cold load costs when the model's size is unknown anywhere.
DEFAULT_LOAD_SECONDS = 5.0

#: Weight of a new measurement in the learned load rate (an exponential moving average).
RATE_ALPHA = 0.3

#: A `load_duration` shorter than this was no load (the model was already in memory).
MIN_LOAD_SECONDS = 0.05

#: A load under way counts until this many times its expected seconds have passed (a slow
#: disk, a larger model than thought), then as never started.
LOAD_GRACE = 2.0


class Holder(Protocol):
    """What residency reads of a server (`gateway.upstream.pool.Upstream` is one)."""

    @property
    def name(self) -> str:
        """`host:port`."""
        ...

    @property
    def loaded(self) -> Sequence[LoadedModel] | None:
        """Its loaded models as its last `/api/ps` said; None: unknown."""
        ...

    @property
    def loaded_at(self) -> float:
        """`time.monotonic()` of that `/api/ps` answer."""
        ...


def _tagged(model: str) -> str:
    """`model` with Ollama's implicit `:latest` tag when it names none."""
    return model if ":" in model.rsplit("/", 1)[-1] else f"{model}:latest"


#: What Ollama fills in a name that leaves them out (`types/model/name.go`, `ParseName`): the
#: default host and namespace, so `registry.ollama.ai/library/llama3.2` is `llama3.2`.
_DEFAULT_PREFIXES = ("registry.ollama.ai/", "library/")


@functools.lru_cache(maxsize=1024)
def slot_key(model: str) -> str:
    """The name a server's requests, loads and loaded models of `model` are known under.

    As Ollama resolves names: surrounding spaces, a scheme, its default host and namespace
    left out, its implicit `:latest` added and the case folded, so `llama3.2`, ` Llama3.2`,
    `library/llama3.2` and `registry.ollama.ai/library/llama3.2:latest` are one model: a
    client's spelling must not make a full server look free, or a warm one cold (counting
    two different models together could only make a server look busier, the safe side).
    Cached (a few names in use, looked up several times per request; bounded, as a client
    may vary the name without end).
    """
    name = model.strip().casefold()
    for scheme in ("https://", "http://"):
        name = name.removeprefix(scheme)
    for prefix in _DEFAULT_PREFIXES:
        name = name.removeprefix(prefix)
    return _tagged(name)


class Residency:
    """What the gateway knows of where each model is loaded, and the servers' load rates."""

    def __init__(self) -> None:
        self._served: dict[tuple[str, str], float] = {}
        self._rates: dict[str, float] = {}
        # (server, model) -> (monotonic start, expected seconds) of loads the gateway started.
        self._loading: dict[tuple[str, str], tuple[float, float]] = {}
        self._sizes: dict[str, int] = {}

    def state(self, server: Holder, model: str, now: float | None = None) -> bool | None:
        """True: `model` is loaded on `server`; False: it is not; None: unknown."""
        now = time.monotonic() if now is None else now
        key = slot_key(model)  # as Ollama matches names: `ALPHA` is `alpha:latest`
        served = self._served.get((server.name, key))
        loaded = server.loaded
        if loaded is not None:
            if any(slot_key(entry.model) == key for entry in loaded):
                return True
            return served is not None and served >= server.loaded_at
        if served is not None and now - served < SERVED_TTL:
            return True
        return None

    def loading(self, server: str, model: str, now: float | None = None) -> float | None:
        """Seconds left of a load of `model` the gateway started on `server`; None: none.

        0.0 once the expected end has passed (the load is late, still counted as under way
        until `LOAD_GRACE` times its expected seconds).
        """
        key = (server, slot_key(model))
        entry = self._loading.get(key)
        if entry is None:
            return None
        now = time.monotonic() if now is None else now
        start, seconds = entry
        if now - start > LOAD_GRACE * seconds:
            del self._loading[key]
            return None
        return max(0.0, start + seconds - now)

    def started(self, server: str, model: str, seconds: float, now: float | None = None) -> None:
        """The gateway sent `model` to `server`, which must load it: `seconds` expected.

        Bounded as `served` is: past `MAX_SERVED` entries, those past their grace go first,
        then the oldest half.
        """
        now = time.monotonic() if now is None else now
        self._loading[(server, slot_key(model))] = (now, seconds)
        if len(self._loading) > MAX_SERVED:
            live = {k: (t, s) for k, (t, s) in self._loading.items() if now - t <= LOAD_GRACE * s}
            if len(live) > MAX_SERVED // 2:
                live = dict(sorted(live.items(), key=lambda item: item[1][0])[-(MAX_SERVED // 2) :])
            self._loading = live

    def served(self, server: str, model: str, now: float | None = None) -> None:
        """`server` answered for `model` (its first chunk came): it has it loaded now."""
        now = time.monotonic() if now is None else now
        key = slot_key(model)
        self._served[(server, key)] = now
        self._loading.pop((server, key), None)
        if len(self._served) > MAX_SERVED:
            fresh = {k: t for k, t in self._served.items() if now - t < SERVED_TTL}
            if len(fresh) > MAX_SERVED // 2:
                newest = sorted(fresh.items(), key=lambda item: item[1])[-(MAX_SERVED // 2) :]
                fresh = dict(newest)
            self._served = fresh

    def failed(self, server: str, model: str) -> None:
        """A request for `model` failed on `server` before its answer: no load is under way."""
        self._loading.pop((server, slot_key(model)), None)

    def forget(self, server: str) -> None:
        """`server` restarted or failed: what it was answered for no longer says anything."""
        for key in [key for key in self._served if key[0] == server]:
            del self._served[key]
        for key in [key for key in self._loading if key[0] == server]:
            del self._loading[key]

    def size(self, servers: Sequence[Holder], model: str) -> int | None:
        """The model's size in bytes as some server's `/api/ps` reports it, or None.

        The last size read is remembered (for the names `served` remembers at most), so a
        model that no server holds any more still has one.
        """
        key = slot_key(model)
        for server in servers:
            for entry in server.loaded or ():
                if slot_key(entry.model) == key:
                    if len(self._sizes) < MAX_SERVED or key in self._sizes:
                        self._sizes[key] = entry.size
                    return entry.size
        return self._sizes.get(key)

    def learn(self, server: str, size: int | None, load_ns: int | None) -> None:
        """Fold one measured load (`size` bytes in `load_ns` nanoseconds) into `server`'s rate."""
        if not size or not load_ns or load_ns < MIN_LOAD_SECONDS * 1e9:
            return
        rate = size / (load_ns / 1e9)
        known = self._rates.get(server)
        self._rates[server] = rate if known is None else known + RATE_ALPHA * (rate - known)

    def rate(self, server: str) -> float:
        """`server`'s load rate in bytes per second (learned, else `DEFAULT_LOAD_RATE`)."""
        return self._rates.get(server, DEFAULT_LOAD_RATE)

    def load_seconds(self, server: str, size: int | None) -> float:
        """Seconds a cold load of a `size`-byte model would take on `server`."""
        return DEFAULT_LOAD_SECONDS if size is None else size / self.rate(server)
