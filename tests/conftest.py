"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.keys.store import KeyStore
from gateway.settings import Settings
from gateway.testing.emulator import EmulatorConfig, EmulatorState, create_emulator_app
from gateway.testing.server import LoopbackServer


@pytest.fixture
def anyio_backend() -> str:
    """Run `@pytest.mark.anyio` tests on asyncio only (the gateway's event loop)."""
    return "asyncio"


# --- gateway + emulator over real loopback sockets ------------------------------------------


@dataclass
class Emulator:
    """A running Ollama emulator: its base URL and its state (config and records)."""

    url: str
    state: EmulatorState

    @property
    def config(self) -> EmulatorConfig:
        return self.state.config


@dataclass
class Gateway:
    """A running gateway: base URL, a valid key, the settings it runs with."""

    url: str
    key: str
    key_id: str
    settings: Settings
    database_url: str

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def metrics_text(self) -> str:
        return httpx.get(f"{self.url}/metrics").text

    def create_key(self, name: str, **kwargs: Any) -> tuple[str, str]:
        """Create another key in the gateway's store; returns (id, full key)."""
        return asyncio.run(_create_key(self.database_url, name, **kwargs))

    def revoke(self, key_id: str) -> None:
        asyncio.run(_revoke(self.database_url, key_id))


async def _create_key(database_url: str, name: str, **kwargs: Any) -> tuple[str, str]:
    store = KeyStore.from_url(database_url)
    try:
        await store.create_schema()
        record, key = await store.create_key(name, **kwargs)
        return record.id, key
    finally:
        await store.close()


async def _revoke(database_url: str, key_id: str) -> None:
    store = KeyStore.from_url(database_url)
    try:
        await store.revoke(key_id)
    finally:
        await store.close()


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """An Ollama emulator on a loopback port, fresh for each test."""
    app = create_emulator_app(EmulatorConfig())
    with LoopbackServer(app) as server:
        yield Emulator(server.url, app.state.emulator)


@pytest.fixture
def make_gateway(tmp_path: Path, emulator: Emulator) -> Iterator[Callable[..., Gateway]]:
    """Start gateways in front of the emulator; keyword arguments override settings."""
    servers: list[LoopbackServer] = []

    def make(**overrides: Any) -> Gateway:
        database_url = f"sqlite+aiosqlite:///{tmp_path}/keys-{len(servers)}.db"
        values: dict[str, Any] = {
            "upstream_url": emulator.url,
            "database_url": database_url,
            "first_byte_timeout": 10.0,
            "idle_timeout": 10.0,
        }
        values.update(overrides)
        settings = Settings(**values)
        key_id, key = asyncio.run(_create_key(database_url, "test-key"))
        server = LoopbackServer(create_app(settings))
        server.__enter__()
        servers.append(server)
        return Gateway(server.url, key, key_id, settings, database_url)

    yield make
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    """A gateway with default settings in front of the emulator (Ollama dialect)."""
    return make_gateway()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum the samples of `name` in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total
