"""This process's live view: the requests in flight now, and the answers of the last minute.

What the admin API's `GET /admin/v1/live` reads (docs/admin.md, "Live view"). It is per
process, like the in-memory parts of `Metrics`: with several replicas (or `gateway serve
--workers N`) each one knows its own requests only; Prometheus adds them all up.

The request path pays two set operations and one tuple per request, no lock (everything runs
on the event loop) and no I/O: `RequestMeter` adds itself to `LiveBoard.running` when it is
built and takes itself out when it finishes (`finished`) or is dropped (`dropped`); `finished`
also appends one tuple to a ring of at most `RING_SIZE` entries. Every sum is made when the
admin API asks (`in_flight`, `recent`), over the requests in flight and the ring's entries of
the last `WINDOW_SECONDS`.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.neutral import RequestSummary

#: Seconds of finished answers `recent` sums.
WINDOW_SECONDS = 60.0
#: Most finished answers kept: at more than `RING_SIZE / WINDOW_SECONDS` (about 130) answers a
#: second the ring holds less than a minute, and `Recent.truncated` says so.
RING_SIZE = 8192

#: Outcomes that count as errors besides any 5xx status: an answer that broke after its 200.
_FAILED = frozenset({"upstream_error", "timeout", "error"})


class Running(Protocol):
    """A request in flight as the board sees it (`gateway.metering.meter.RequestMeter`)."""

    @property
    def key_id(self) -> str | None:
        """The API key's public id."""
        ...

    @property
    def model(self) -> str:
        """The `model` label (bounded by the catalog)."""
        ...


@dataclass(frozen=True, slots=True)
class InFlight:
    """The requests in flight in this process now.

    Attributes:
        total: Requests admitted and not yet finished (queued for a slot included).
        by_key: Requests per API key id.
        by_model: Requests per `model` label.
    """

    total: int
    by_key: Counter[str]
    by_model: Counter[str]


@dataclass(frozen=True, slots=True)
class ModelStats:
    """The finished answers of one model in the window (fields as `Recent`'s)."""

    model: str
    requests: int
    errors: int
    ttft_mean_s: float | None
    decode_tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class Recent:
    """The answers finished in the last `window_seconds`.

    Attributes:
        window_seconds: The window's length.
        requests: Answers finished in it (generations and embeddings, whatever their outcome).
        errors: Of those, the ones that ended with a 5xx or broke after their status (outcome
            `upstream_error`, `timeout` or `error`).
        output_tokens: Output tokens of those answers.
        ttft_mean_s: Mean time to first token over the answers that had one; None if none.
        ttft_p50_s: Its median.
        decode_tokens_per_s: Output tokens after the first over the seconds after the first
            token, summed over the answers (so a long answer weighs by its length); None when
            no answer had two tokens and a measured rate.
        truncated: The ring overflowed within the window: the sums cover only its newest
            `RING_SIZE` answers.
        by_model: The same per `model` label, most requests first.
    """

    window_seconds: float
    requests: int
    errors: int
    output_tokens: int
    ttft_mean_s: float | None
    ttft_p50_s: float | None
    decode_tokens_per_s: float | None
    truncated: bool
    by_model: list[ModelStats]


# One finished answer: (monotonic seconds, model label, key id, ok, TTFT s or None, output
# tokens, decode tokens after the first, decode seconds after the first token).
_Entry = tuple[float, str, str | None, bool, float | None, int, int, float]


class LiveBoard:
    """The requests in flight and a ring of the latest finished answers (module docstring).

    Args:
        window: Seconds of answers `recent` sums.
        size: Most answers the ring keeps.
        clock: Monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        window: float = WINDOW_SECONDS,
        size: int = RING_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.running: set[Running] = set()
        self._ring: deque[_Entry] = deque(maxlen=size)
        self._clock = clock

    def finished(self, request: Running, summary: RequestSummary) -> None:
        """`request` ended: it is in flight no more, and its answer joins the ring."""
        self.running.discard(request)
        rate, tokens = summary.tokens_per_s, summary.tokens_out
        decoded = tokens - 1 if rate and tokens > 1 else 0
        self._ring.append(
            (
                self._clock(),
                summary.model,
                summary.key_id,
                summary.status < 500 and summary.outcome not in _FAILED,
                summary.ttft_s,
                tokens,
                decoded,
                decoded / rate if decoded and rate else 0.0,
            )
        )

    def dropped(self, request: Running) -> None:
        """`request` ended without an answer to count (a batch line put back): forget it."""
        self.running.discard(request)

    def in_flight(self) -> InFlight:
        """Count the requests in flight now, per key and per model."""
        running = self.running  # read in one go: nothing here awaits, so nothing changes it
        return InFlight(
            total=len(running),
            by_key=Counter(r.key_id for r in running if r.key_id is not None),
            by_model=Counter(r.model for r in running),
        )

    def recent(self) -> Recent:
        """Sum the answers finished in the last `window` seconds."""
        since = self._clock() - self.window
        entries: list[_Entry] = []
        for entry in reversed(self._ring):  # newest first: stop at the first one too old
            if entry[0] < since:
                break
            entries.append(entry)
        truncated = len(entries) == self._ring.maxlen
        models: dict[str, list[_Entry]] = {}
        for entry in entries:
            models.setdefault(entry[1], []).append(entry)
        by_model = []
        for model, group in models.items():
            errors, ttft_mean, _, rate = _sums(group)
            by_model.append(ModelStats(model, len(group), errors, ttft_mean, rate))
        by_model.sort(key=lambda stats: (-stats.requests, stats.model))
        errors, ttft_mean, ttft_p50, rate = _sums(entries)
        return Recent(
            window_seconds=self.window,
            requests=len(entries),
            errors=errors,
            output_tokens=sum(entry[5] for entry in entries),
            ttft_mean_s=ttft_mean,
            ttft_p50_s=ttft_p50,
            decode_tokens_per_s=rate,
            truncated=truncated,
            by_model=by_model,
        )


def _sums(entries: list[_Entry]) -> tuple[int, float | None, float | None, float | None]:
    """(errors, mean TTFT, median TTFT, decode tokens/s) of `entries`."""
    ttfts = [entry[4] for entry in entries if entry[4] is not None]
    decoded = sum(entry[6] for entry in entries)
    seconds = sum(entry[7] for entry in entries)
    return (
        sum(1 for entry in entries if not entry[3]),
        statistics.fmean(ttfts) if ttfts else None,
        statistics.median(ttfts) if ttfts else None,
        decoded / seconds if seconds > 0 else None,
    )
