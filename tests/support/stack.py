"""A running gateway and emulator as a test sees them, and keys in a gateway's store."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.keys.store import KeyStore
from gateway.settings import Settings
from gateway.testing.emulator.app import EmulatorConfig, EmulatorState


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
        return asyncio.run(store_key(self.database_url, name, **kwargs))

    def revoke(self, key_id: str) -> None:
        asyncio.run(revoke_key(self.database_url, key_id))


async def store_key(database_url: str, name: str, **kwargs: Any) -> tuple[str, str]:
    """Create a key named `name` in the store at `database_url` (schema made if missing).

    Returns (id, full key); `kwargs` go to `KeyStore.create_key` (limits, models, ...).
    """
    store = KeyStore.from_url(database_url)
    try:
        await store.create_schema()
        record, key = await store.create_key(name, **kwargs)
        return record.id, key
    finally:
        await store.close()


async def revoke_key(database_url: str, key_id: str) -> None:
    """Revoke the key `key_id` in the store at `database_url`."""
    store = KeyStore.from_url(database_url)
    try:
        await store.revoke(key_id)
    finally:
        await store.close()
