"""Telling a dead target from a busy one, so a run stops instead of hammering it.

`DownWatch` sees every answered request of a run (the driver calls it beside its key check);
when requests have failed without an answer from the server (connection refused or reset, a
timeout, a gateway's 502 or 504 for its upstream) `failures` times in a row, with no success,
for `after` seconds, it raises `TargetLost`. Failures a live server chose (a 429 or 503 with
`Retry-After`, a 4xx, a broken answer with status 200) never count: those are load or bugs, and
the error-rate limit (`--max-error-rate`) reports them. A run that ends (its duration or count
reached) in such a streak, too short for `after`, is checked once more (`DownWatch.at_end`): one
request to the target's root, and a target that no longer accepts connections is gone too. The
driver attaches the cut-short measurement, `shapes.measure_point` the partial point, and the
runner saves the run as partial (docs/benchmarking.md "Exit status").
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.stats import escape_error

#: Statuses a server (or a gateway for its upstream) answers when it cannot reach the model:
#: no status at all (nothing answered), 502 Bad Gateway, 504 Gateway Timeout (RFC 9110, 15.6).
DOWN_STATUSES = (None, 502, 504)
#: Default seconds of nothing but such failures before the run stops (`--down-after`).
DOWN_AFTER = 10.0
#: Failures in a row (with no success) needed besides the seconds: one slow timeout is no outage.
DOWN_FAILURES = 3


class TargetLost(RuntimeError):
    """The target stopped answering mid-run; the run stops with what it measured.

    Attributes:
        measurement: The cut-short run (`shapes.Measurement`), set by the driver.
        point: The partial point (`shapes.measure_point`), set when a repeat was measured.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.measurement: Any = None
        self.point: dict[str, Any] | None = None


class DownWatch:
    """Raises `TargetLost` once a run's requests only fail without an answer (module docstring).

    Args:
        after: Seconds since the last success (or since the watch began) of failures only.
        failures: Such failures in a row needed too.
        started: `perf_counter` seconds the watch began (its first request's send).
    """

    def __init__(
        self, after: float = DOWN_AFTER, failures: int = DOWN_FAILURES, started: float = 0.0
    ) -> None:
        if not after > 0 or failures < 1:
            raise ValueError(f"a down watch needs after > 0 and failures >= 1, got {after}")
        self.after = after
        self.failures = failures
        self.last_ok = started
        self.down = 0
        self.example = ""

    def __call__(self, record: RequestRecord) -> None:
        """See one finished request (warm-up too: a dead server is dead in the warm-up).

        Raises:
            TargetLost: the target stopped answering.
        """
        if record.ok:
            self.last_ok, self.down = max(self.last_ok, record.end), 0
            return
        if record.status not in DOWN_STATUSES:
            return
        if self.down == 0:
            self.last_ok = max(self.last_ok, record.start)
        self.down += 1
        self.example = record.error or f"HTTP {record.status}"
        silent = record.end - self.last_ok
        if self.down >= self.failures and silent >= self.after:
            raise TargetLost(
                f"the target stopped answering: {self.down} requests in a row failed without an"
                f" answer over {silent:.0f} s (last: {escape_error(self.example, 120)})"
            )

    async def at_end(self, url: str, measurement: Any, wait: float = 5.0) -> None:
        """At the end of a run: when it ended in a streak of failures, is the target still there?

        One GET of the target's root (any HTTP answer, even a 404, is a live server); nothing is
        sent when the run did not end in `failures` failures without an answer.

        Raises:
            TargetLost: the streak, and the target refuses connections (or does not answer
                within `wait` seconds); its `measurement` is `measurement`.
        """
        if self.down < self.failures:
            return
        try:
            async with asyncio.timeout(wait), httpx.AsyncClient(timeout=wait) as client:
                await client.get(url.rstrip("/") + "/")
        except (httpx.TransportError, TimeoutError) as exc:
            lost = TargetLost(
                f"the target stopped answering: the run ended with {self.down} requests in a row"
                f" failed without an answer (last: {escape_error(self.example, 120)}) and the"
                f" target no longer answers ({type(exc).__name__})"
            )
            lost.measurement = measurement
            raise lost from None
