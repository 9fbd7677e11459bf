"""Fixtures of the real-client tests: a gateway per upstream dialect, clients closed after each."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.client import DIALECTS, opened
from tests.support.stack import Gateway


@pytest.fixture(params=DIALECTS)
def gw(request: pytest.FixtureRequest, make_gateway: Callable[..., Gateway]) -> Gateway:
    """A gateway in front of the emulator, once per upstream dialect."""
    return make_gateway(upstream_dialect=request.param)


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Close every client a test opened (`tests.support.client.opened`)."""
    yield
    opened.close()
