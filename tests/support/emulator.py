"""The emulator as its own tests configure it."""

from __future__ import annotations

from gateway.testing.emulator.app import EmulatorConfig


def fast_config(**changes: object) -> EmulatorConfig:
    """A config with a short TTFT and pace and 6 tokens; `changes` override any field."""
    return EmulatorConfig(**{"ttft": 0.01, "inter_token": 0.002, "tokens": 6, **changes})
