"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Run `@pytest.mark.anyio` tests on asyncio only (the gateway's event loop)."""
    return "asyncio"
