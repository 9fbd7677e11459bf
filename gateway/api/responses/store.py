"""Stored responses (`GATEWAY_RESPONSES_STORE`) in the gateway's database (`ResponseRow`).

What `previous_response_id` and `GET`/`DELETE /v1/responses/{id}` read.

A stored response is its `response` object and the whole input it answered (the earlier turns
included), owned by the key that made it: every read and delete names the key, so another key's
id is "not found" (404), as are expired ones. The retention period and the per-key cap are the
operator's (`GATEWAY_RESPONSES_RETENTION_SECONDS`, `GATEWAY_RESPONSES_MAX_BYTES_PER_KEY`): over
the cap a key's oldest responses are deleted, and one response larger than the cap is not kept.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db.tables import ResponseRow
from gateway.upstream.dialects.json_codec import encode_json
from gateway.wire.json import INLINE_PARSE_BYTES, json_thread_limiter

#: Item id prefixes by item type, for input items that came without an id.
_PREFIXES = {
    "message": "msg_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "custom_tool_call": "ctc_",
    "custom_tool_call_output": "ctco_",
    "reasoning": "rs_",
}


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored response: the input it answered (items with ids) and its `response` object."""

    items: list[dict[str, Any]]
    response: dict[str, Any]

    def conversation(self) -> list[dict[str, Any]]:
        """The next turn's earlier input: this input, then this response's output items."""
        return [*self.items, *self.response.get("output", [])]


def with_ids(items: list[Any]) -> list[Any]:
    """`items` as `input_items` lists them: each with an `id`, a message's content as parts.

    A message given as `{"role", "content": "text"}` becomes `{"type": "message", "role",
    "content": [{"type": "input_text" (assistant: "output_text"), "text"}]}`, as OpenAI lists it.
    """
    result = []
    for item in items:
        if isinstance(item, dict):
            kind = item.get("type", "message" if "role" in item else None)
            if kind == "message" and isinstance(item.get("content"), str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                content = [{"type": part, "text": item["content"]}]
                item = {**item, "type": "message", "content": content}
            if not isinstance(item.get("id"), str):
                prefix = _PREFIXES.get(str(kind), "item_")
                item = {"id": prefix + secrets.token_hex(16), **item}
        result.append(item)
    return result


def _decode(items: str, response: str) -> Stored:
    return Stored(json.loads(items), json.loads(response))


def _encode(items: list[dict[str, Any]], response: dict[str, Any]) -> tuple[bytes, bytes]:
    return encode_json(items), encode_json(response)


class ResponseStore:
    """Reads and writes stored responses, one key's at a time."""

    def __init__(self, engine: AsyncEngine, *, retention_seconds: int, max_bytes: int) -> None:
        """Args: the gateway's database engine, the retention period, the per-key cap in bytes."""
        self._engine = engine
        self._retention = timedelta(seconds=retention_seconds)
        self._max_bytes = max_bytes

    async def load(self, key_id: str, response_id: str) -> Stored | None:
        """The key's unexpired response `response_id`, or None (absent, expired, another key's)."""
        query = select(
            ResponseRow.items, ResponseRow.response, ResponseRow.size.label("size")
        ).where(
            ResponseRow.id == response_id,
            ResponseRow.key_id == key_id,
            ResponseRow.expires_at > datetime.now(UTC),
        )
        async with self._engine.connect() as connection:
            row = (await connection.execute(query)).first()
        if row is None:
            return None
        if row.size <= INLINE_PARSE_BYTES:
            return _decode(row.items, row.response)
        return await anyio.to_thread.run_sync(
            _decode, row.items, row.response, limiter=json_thread_limiter()
        )

    async def save(
        self, key_id: str, response: dict[str, Any], items: list[dict[str, Any]]
    ) -> bool:
        """Keep `response` (its `id` the row's) with the input `items` it answered.

        Deletes every expired response first, then this key's oldest while it holds more than
        the cap. Returns False (nothing kept) when this one alone is larger than the cap.
        """
        # Off the event loop: a stored conversation may be a body's worth (16 MiB: 0.1 s).
        encoded_items, encoded_response = await anyio.to_thread.run_sync(
            _encode, items, response, limiter=json_thread_limiter()
        )
        size = len(encoded_items) + len(encoded_response)
        if size > self._max_bytes:
            return False
        now = datetime.now(UTC)
        async with self._engine.begin() as connection:
            await connection.execute(delete(ResponseRow).where(ResponseRow.expires_at <= now))
            await connection.execute(
                insert(ResponseRow).values(
                    id=response["id"],
                    key_id=key_id,
                    created_at=now,
                    expires_at=now + self._retention,
                    bytes=size,
                    items=encoded_items.decode(),
                    response=encoded_response.decode(),
                )
            )
            held = await connection.scalar(
                select(func.coalesce(func.sum(ResponseRow.size), 0)).where(
                    ResponseRow.key_id == key_id
                )
            )
            excess = int(held or 0) - self._max_bytes
            if excess > 0:
                oldest = await connection.execute(
                    select(ResponseRow.id, ResponseRow.size)
                    .where(ResponseRow.key_id == key_id, ResponseRow.id != response["id"])
                    .order_by(ResponseRow.created_at, ResponseRow.id)
                )
                doomed = []
                for doomed_id, doomed_size in oldest:
                    if excess <= 0:
                        break
                    doomed.append(doomed_id)
                    excess -= doomed_size
                await connection.execute(delete(ResponseRow).where(ResponseRow.id.in_(doomed)))
        return True

    async def delete(self, key_id: str, response_id: str) -> bool:
        """Delete the key's response `response_id`; False when there was none to delete.

        An expired one is deleted too but answers False: it is "not found" for every read
        (`load`), so DELETE must not be the one call that says it still existed.
        """
        mine = (ResponseRow.id == response_id, ResponseRow.key_id == key_id)
        async with self._engine.begin() as connection:
            result = await connection.execute(
                delete(ResponseRow).where(*mine, ResponseRow.expires_at > datetime.now(UTC))
            )
            await connection.execute(delete(ResponseRow).where(*mine))
        return bool(result.rowcount)
