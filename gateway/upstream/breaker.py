"""A circuit breaker per upstream: passive ejection after repeated failures, a half-open trial.

closed --(GATEWAY_CIRCUIT_FAILURES consecutive counted failures)--> open
open --(GATEWAY_CIRCUIT_COOLDOWN seconds)--> half-open: one trial request is let through
half-open --(the trial succeeds)--> closed; --(it fails)--> open again.
The pattern is Nygard's "Circuit Breaker" (Release It!, 2nd ed., section 5.2).

Which failures count (docs/operations.md, "Whose fault is a failure"): a failure that is the
upstream's alone (refused, reset, silent, a malformed stream) counts from any single request. A
failure whose cause may be the request (an upstream 500 or error line: its text may come from
the prompt) counts only once requests of at least `BLAME_KEYS` distinct API keys failed that way
within `BLAME_WINDOW` seconds, so one key holder cannot eject an upstream for every other key.
"""

from __future__ import annotations

import time
from enum import IntEnum


class CircuitState(IntEnum):
    """The breaker's state; the value is what `gateway_upstream_circuit_state` exports."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


#: Distinct keys whose requests must see an ambiguous failure before such failures count.
BLAME_KEYS = 2
#: Seconds an ambiguous failure of a key is remembered for `BLAME_KEYS`.
BLAME_WINDOW = 60.0


class CircuitBreaker:
    """Counts consecutive failures of one upstream and decides whether it may be used.

    Args:
        failures: Consecutive counted failures that open the circuit.
        cooldown: Seconds the circuit stays open before a trial request.
    """

    def __init__(self, failures: int, cooldown: float) -> None:
        self._threshold = failures
        self._cooldown = cooldown
        self._failures = 0
        self._opened_at = 0.0
        self._trial_running = False
        # Key -> monotonic time of its last ambiguous failure, since the last success or opening.
        self._blamed: dict[str, float] = {}
        self.state = CircuitState.CLOSED

    def available(self) -> bool:
        """Whether a request could be sent now (no state change)."""
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.OPEN:
            return time.monotonic() - self._opened_at >= self._cooldown
        return not self._trial_running

    def recovery_rank(self) -> tuple[CircuitState, float]:
        """Sort key for panic mode: the circuit nearest to closing first.

        Closed before half-open (its trial got past the cooldown) before open; among open
        ones, the one opened longest ago (`time.monotonic()` of its opening).
        """
        return self.state, self._opened_at

    def acquire(self) -> bool:
        """Take permission to send one request; False when it must go elsewhere.

        An open circuit past its cooldown lets one trial through (half-open).
        """
        if not self.available():
            return False
        if self.state is not CircuitState.CLOSED:
            self.state = CircuitState.HALF_OPEN
            self._trial_running = True
        return True

    def record_success(self) -> None:
        """The upstream answered: close the circuit."""
        self._failures = 0
        self._trial_running = False
        self._blamed.clear()
        self.state = CircuitState.CLOSED

    def record_neutral(self) -> None:
        """A request ended with no verdict on the upstream (the client left, a busy answer).

        A half-open circuit's trial slot is given back, so the next request becomes the trial:
        otherwise a trial that proves nothing would keep the circuit half-open, refusing every
        request, for as long as the process runs.
        """
        self._trial_running = False

    def record_failure(self, key: str | None = None) -> None:
        """The upstream failed: count it; open the circuit at the threshold or after a trial.

        Args:
            key: The API key (its id) whose request failed, when the failure may be the
                request's fault (an upstream 500 or error line): counted only once `BLAME_KEYS`
                distinct keys failed so within `BLAME_WINDOW` seconds. None for a failure that
                is the upstream's alone, counted at once.
        """
        self._trial_running = False
        if key is not None and not self._blame(key):
            return  # one key's failures alone; a half-open circuit takes the next trial
        self._failures += 1
        if self.state is CircuitState.HALF_OPEN or self._failures >= self._threshold:
            self.state = CircuitState.OPEN
            self._opened_at = time.monotonic()
            self._blamed.clear()  # after the cooldown, keys must show it again

    def _blame(self, key: str) -> bool:
        """Remember `key`'s ambiguous failure; whether enough distinct keys saw one."""
        now = time.monotonic()
        self._blamed = {k: t for k, t in self._blamed.items() if now - t < BLAME_WINDOW}
        self._blamed[key] = now
        return len(self._blamed) >= BLAME_KEYS
