"""Stored responses (`GATEWAY_RESPONSES_STORE=true`) through the `openai` SDK, both dialects.

A conversation continued by `previous_response_id` (the upstream gets every earlier turn),
`responses.retrieve`, `input_items.list` and `delete`, ownership (another key's ids are 404),
`store: false`, the retention period and the per-key cap.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
import pytest
from sqlalchemy import func, select, update

from gateway.db.engine import open_engine
from gateway.db.tables import ResponseRow
from tests.support.client import MODEL_ALIAS as MODEL
from tests.support.client import opened
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.clients

TEXT = "".join(f"tok{i} " for i in range(16))  # what the emulator generates by default
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(params=["ollama", "openai"])
def gw(request: pytest.FixtureRequest, make_gateway: Callable[..., Gateway]) -> Gateway:
    """A gateway that stores responses, in front of the emulator, once per dialect."""
    return make_gateway(upstream_dialect=request.param, responses_store=True)


def _openai(gw: Gateway, key: str | None = None) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key or gw.key, max_retries=0)
    return opened.enter_context(client)


def _sent(emulator: Emulator) -> list[tuple[str, str]]:
    """The roles and texts of the messages the upstream received last."""
    return [
        (m["role"], m.get("content") or "") for m in emulator.state.records[-1].body["messages"]
    ]


def _rows(gw: Gateway, change: Any = None) -> int:
    """The stored rows (after running `change` on the database, when given)."""

    async def run() -> int:
        engine = open_engine(gw.database_url)
        try:
            async with engine.begin() as connection:
                if change is not None:
                    await connection.execute(change)
                return int(
                    await connection.scalar(select(func.count()).select_from(ResponseRow)) or 0
                )
        finally:
            await engine.dispose()

    return asyncio.run(run())


def test_a_three_turn_conversation_by_previous_response_id(gw: Gateway, emulator: Emulator) -> None:
    client = _openai(gw)
    first = client.responses.create(model=MODEL, input="one", instructions="be brief")
    assert first.store is True
    second = client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert _sent(emulator) == [("user", "one"), ("assistant", TEXT), ("user", "two")]
    events = list(
        client.responses.create(
            model=MODEL, input="three", previous_response_id=second.id, stream=True
        )
    )
    final = events[-1]
    assert final.type == "response.completed"
    # Instructions are not carried over (OpenAI's rule): only the turns are.
    assert _sent(emulator) == [
        ("user", "one"),
        ("assistant", TEXT),
        ("user", "two"),
        ("assistant", TEXT),
        ("user", "three"),
    ]
    # Stored before the stream's last bytes: retrievable the moment the client has it.
    kept = client.responses.retrieve(final.response.id)
    assert kept.output_text == TEXT
    assert kept.usage is not None
    assert kept.usage.output_tokens == 16
    items = client.responses.input_items.list(final.response.id, order="asc")
    texts = [
        item.content[0].text if item.type == "message" else None  # type: ignore[union-attr]
        for item in items.data
    ]
    assert texts == ["one", TEXT, "two", TEXT, "three"]
    assert all(item.id for item in items.data)
    newest = client.responses.input_items.list(final.response.id, limit=2)
    assert [i.id for i in newest.data] == [i.id for i in items.data][::-1][:2]
    assert newest.has_more is True
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_requests_total", route="/v1/responses") == 3


def test_a_tool_result_continues_a_stored_tool_call(gw: Gateway, emulator: Emulator) -> None:
    emulator.config.tool_call = True
    emulator.config.tool_arguments = {"city": "Oslo"}
    client = _openai(gw)
    first = client.responses.create(model=MODEL, input="weather?", tools=[WEATHER])
    [call] = first.output
    assert call.type == "function_call"
    emulator.config.tool_call = False
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}],
        tools=[WEATHER],
    )
    assert answer.output_text == TEXT
    user, assistant, tool = emulator.state.records[-1].body["messages"]
    assert user["content"] == "weather?"
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    assert (tool["role"], tool["content"]) == ("tool", "rain")


def test_responses_are_the_keys_own(gw: Gateway) -> None:
    mine = _openai(gw).responses.create(model=MODEL, input="secret")
    _, other_key = gw.create_key("other")
    other = _openai(gw, other_key)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError, match="Previous response"):
        other.responses.create(model=MODEL, input="x", previous_response_id=mine.id)
    assert _openai(gw).responses.retrieve(mine.id).id == mine.id  # still there for its owner


def test_deletion_and_store_false(gw: Gateway) -> None:
    client = _openai(gw)
    kept = client.responses.create(model=MODEL, input="hi")
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id=kept.id)
    unkept = client.responses.create(model=MODEL, input="hi", store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    assert _rows(gw) == 0


def test_expired_responses_are_gone_and_then_deleted(gw: Gateway) -> None:
    client = _openai(gw)
    old = client.responses.create(model=MODEL, input="hi")
    past = datetime.now(UTC) - timedelta(seconds=1)
    assert _rows(gw, update(ResponseRow).values(expires_at=past)) == 1  # as if 30 days passed
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(old.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id=old.id)
    with pytest.raises(openai.NotFoundError):  # expired is gone for DELETE too (docs/api.md)
        client.responses.delete(old.id)
    new = client.responses.create(model=MODEL, input="hi")
    assert _rows(gw) == 1  # storing the new one deleted the expired one
    assert client.responses.retrieve(new.id).id == new.id


def test_the_per_key_cap_drops_the_oldest(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    gw = make_gateway(responses_store=True, responses_max_bytes_per_key=6000)
    client = _openai(gw)
    ids = [client.responses.create(model=MODEL, input=f"turn {i}").id for i in range(8)]
    assert client.responses.retrieve(ids[-1]).id == ids[-1]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    kept = _rows(gw)
    assert 1 < kept < 8
    huge = client.responses.create(model=MODEL, input="x" * 10_000)
    assert huge.output_text == TEXT  # answered, but too large to keep
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(huge.id)
    assert _rows(gw) == kept


def test_with_the_store_off_nothing_is_kept(make_gateway: Callable[..., Gateway]) -> None:
    gw = make_gateway()
    client = _openai(gw)
    response = client.responses.create(model=MODEL, input="hi", store=True)
    assert response.store is False
    with pytest.raises(openai.NotFoundError, match="GATEWAY_RESPONSES_STORE"):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="x", previous_response_id=response.id)
    assert _rows(gw) == 0
    assert json.loads(response.model_dump_json())["store"] is False


@pytest.mark.postgres
def test_stored_responses_on_postgresql(
    postgres_url: str, make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    # postgres_url first: its schema is dropped after the gateway stopped.
    gw = make_gateway(
        responses_store=True, responses_max_bytes_per_key=6000, database_url=postgres_url
    )
    client = _openai(gw)
    first = client.responses.create(model=MODEL, input="one")
    second = client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    assert _sent(emulator) == [("user", "one"), ("assistant", TEXT), ("user", "two")]
    items = client.responses.input_items.list(second.id, order="asc", after=None)
    later = client.responses.input_items.list(second.id, order="asc", after=items.data[0].id)
    assert [i.id for i in later.data] == [i.id for i in items.data][1:]
    _, other_key = gw.create_key("other")
    with pytest.raises(openai.NotFoundError):
        _openai(gw, other_key).responses.retrieve(second.id)
    ids = [client.responses.create(model=MODEL, input=f"turn {i}").id for i in range(8)]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)  # the oldest went first
    client.responses.delete(ids[-1])
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[-1])
