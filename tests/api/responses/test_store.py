"""`ResponseStore` (`gateway.api.responses.store`) against SQLite: its JSON work off the loop.

A stored conversation may be a body's worth (16 MiB of JSON: 0.1 s to encode, 0.04 s to
decode); saving and loading it on the event loop stalled every other request meanwhile, as
parsing a large body did before it moved to a worker thread (`gateway.wire.json`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.api.responses import store as store_module
from gateway.api.responses.store import ResponseStore
from gateway.db.engine import open_engine
from gateway.keys.store import KeyStore

pytestmark = pytest.mark.anyio


async def test_a_large_conversation_is_encoded_and_decoded_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/store.db"
    keys = KeyStore.from_url(url)
    await keys.create_schema()
    await keys.close()
    engine = open_engine(url)
    threads: list[str] = []

    def noting(function: Any) -> Any:
        def run(*args: Any) -> Any:
            on_loop = threading.current_thread() is threading.main_thread()
            threads.append("loop" if on_loop else "worker")
            return function(*args)

        return run

    monkeypatch.setattr(store_module, "_encode", noting(store_module._encode))
    monkeypatch.setattr(store_module, "_decode", noting(store_module._decode))
    store = ResponseStore(engine, retention_seconds=60, max_bytes=64 * 2**20)
    items = [
        {"id": f"msg_{i}", "type": "message", "role": "user", "content": "x" * 1000}
        for i in range(2000)
    ]
    try:
        assert await store.save("key", {"id": "resp_1", "output": []}, items)
        loaded = await store.load("key", "resp_1")
    finally:
        await engine.dispose()
    assert loaded is not None
    assert loaded.items == items
    assert threads == ["worker", "worker"]
