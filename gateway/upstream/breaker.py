"""A circuit breaker per upstream: passive ejection after repeated failures, a half-open trial.

closed --(GATEWAY_CIRCUIT_FAILURES consecutive failures)--> open
open --(GATEWAY_CIRCUIT_COOLDOWN seconds)--> half-open: one trial request is let through
half-open --(the trial succeeds)--> closed; --(it fails)--> open again.
The pattern is Nygard's "Circuit Breaker" (Release It!, 2nd ed., section 5.2).
"""

from __future__ import annotations

import time
from enum import IntEnum


class CircuitState(IntEnum):
    """The breaker's state; the value is what `gateway_upstream_circuit_state` exports."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Counts consecutive failures of one upstream and decides whether it may be used.

    Args:
        failures: Consecutive failures that open the circuit.
        cooldown: Seconds the circuit stays open before a trial request.
    """

    def __init__(self, failures: int, cooldown: float) -> None:
        self._threshold = failures
        self._cooldown = cooldown
        self._failures = 0
        self._opened_at = 0.0
        self._trial_running = False
        self.state = CircuitState.CLOSED

    def available(self) -> bool:
        """Whether a request could be sent now (no state change)."""
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.OPEN:
            return time.monotonic() - self._opened_at >= self._cooldown
        return not self._trial_running

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
        self.state = CircuitState.CLOSED

    def record_failure(self) -> None:
        """The upstream failed: count it; open the circuit at the threshold or after a trial."""
        self._failures += 1
        self._trial_running = False
        if self.state is CircuitState.HALF_OPEN or self._failures >= self._threshold:
            self.state = CircuitState.OPEN
            self._opened_at = time.monotonic()
