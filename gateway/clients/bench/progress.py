"""The live progress line of one load level: what is known, and nothing that is not.

While a level runs, `gateway bench run` rewrites one line on stderr (a terminal only; a pipe
gets the finished points' lines, `runner.point_line`). It shows the requests counted so far,
their rate, the failures and the time elapsed; the planned total only when there is one
(`--requests N`: `88/120 requests`) and, in duration mode, the planned seconds instead
(`12 s of 30 s`). An unknown total is never printed as 0 (`88/0 requests` read as a bug).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.clients.bench.tables import plural, safe


class LevelProgress:
    """Formats the progress of one level; call it as the driver's `Progress` callback.

    Args:
        model: The model (escaped when shown: it came from the command line or the server).
        label: The level as the reader knows it (`concurrency 4`, `rate 2 req/s`).
        duration: The level's planned seconds (duration mode), else None.
        say: Where each line goes (a text starting with a carriage return, updated in place).
        clock: Seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        model: str,
        label: str,
        *,
        duration: float | None,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Start the level's clock now."""
        self._model = safe(model, 80)
        self._label = label
        self._duration = duration
        self._say = say
        self._clock = clock
        self._start = clock()

    def line(self, done: int, total: int, failed: int, *, sent: int | None = None) -> str:
        """The progress text (without the carriage return).

        Args:
            done: Counted requests finished (failed ones included).
            total: Counted requests planned; 0 when unknown (duration mode).
            failed: Counted requests that failed.
            sent: Counted arrivals sent (a rate shape): the rate shown is then the rate sent,
                the one the level asks for and the result line reports, not the completions'.

        Returns:
            E.g. `m: concurrency 4  88 requests, 3.1/s  0 failed  28 s of 30 s`, or for a rate
            `m: rate 2 req/s  58 requests, sent 2.0 req/s  0 failed  30 s of 30 s, draining 3`
            once the planned seconds are over and answers are still awaited.
        """
        elapsed = max(self._clock() - self._start, 0.0)
        counted = f"{done}/{total} requests" if total > 0 else plural(done, "request")
        if sent is None:
            rate = f"{done / elapsed:.1f}/s" if elapsed > 0 else "-/s"
        else:
            window = elapsed if self._duration is None else min(elapsed, self._duration)
            rate = f"sent {sent / window:.1f} req/s" if window > 0 else "sent - req/s"
        errors = f"{failed} failed" + (f" ({failed / done:.0%})" if failed and done else "")
        if self._duration is not None and elapsed > self._duration:
            # Arrivals stop at the planned end; what follows is answers still in flight.
            clock = f"{self._duration:g} s of {self._duration:g} s, draining"
            if sent is not None:
                clock += f" {max(sent - done, 0)}"
        else:
            clock = f"{elapsed:.0f} s" + (
                f" of {self._duration:g} s" if self._duration is not None else ""
            )
        return f"  {self._model}: {self._label}  {counted}, {rate}  {errors}  {clock}"

    def __call__(self, done: int, total: int, failed: int, *, sent: int | None = None) -> None:
        """The driver's `Progress`: update the line in place."""
        self._say("\r" + self.line(done, total, failed, sent=sent))


def level_label(shape: str, level: float) -> str:
    """A level as the reader knows it: `concurrency 4` or `rate 2 req/s`."""
    return f"concurrency {level:g}" if shape == "concurrency" else f"rate {level:g} req/s"
