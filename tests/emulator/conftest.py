"""Fixtures of the emulator's tests: one emulator per module, reset for each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from gateway.testing.emulator.app import EmulatorState, create_emulator_app
from gateway.testing.server import LoopbackServer
from tests.support.emulator import fast_config


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[LoopbackServer, EmulatorState]]:
    app = create_emulator_app()
    with LoopbackServer(app) as server:
        yield server, app.state.emulator


@pytest.fixture
def state(served: tuple[LoopbackServer, EmulatorState]) -> EmulatorState:
    """The module's emulator, reset to a fast config, no records and no blobs.

    The emulator test modules share these three fixtures.
    """
    emulator = served[1]
    emulator.config = fast_config()
    emulator.clear()
    emulator.blobs.clear()
    return emulator


@pytest.fixture
async def client(
    served: tuple[LoopbackServer, EmulatorState], state: EmulatorState
) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served[0].url, timeout=5) as client:
        yield client
