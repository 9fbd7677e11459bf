"""Model aliases over a real gateway, in front of the emulator in both upstream dialects.

`GATEWAY_MODEL_ALIASES` is applied at admission, before the allow-list: the upstream receives
the target, the allow-list is checked on it, the metrics count it, and the model lists show
the exact aliases a key may use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx
import openai
import pytest

from gateway.keys.store import KeyStore
from gateway.metering.report import read_usage
from tests.support.batch import FAST, chat_line, upload_lines, wait_batch
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

#: A model the emulator serves, and the aliases that run it.
TARGET = "qwen2.5:7b"
ALIASES = {"claude-*": TARGET, "gpt-5-codex": TARGET, "ghost": "missing:1b"}

MESSAGES = [{"role": "user", "content": "hi"}]
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/api/chat", {"messages": MESSAGES, "stream": False}),
    ("/api/generate", {"prompt": "hi", "stream": False}),
    ("/api/embed", {"input": "hi"}),
    ("/api/embeddings", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": MESSAGES}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/embeddings", {"input": "hi"}),
    ("/v1/messages", {"messages": MESSAGES, "max_tokens": 100}),
    ("/v1/responses", {"input": "hi"}),
]


@pytest.fixture(params=["ollama", "openai"])
def gw(request: pytest.FixtureRequest, make_gateway, emulator: Emulator) -> Gateway:
    emulator.config.ttft = emulator.config.inter_token = 0.001
    return make_gateway(upstream_dialect=request.param, model_aliases=ALIASES)


def _post(gw: Gateway, path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    return httpx.post(f"{gw.url}{path}", json=body, headers=gw.headers(key), timeout=30)


def _sent_models(emulator: Emulator) -> list[Any]:
    return [r.body.get("model") for r in emulator.state.records if isinstance(r.body, dict)]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[path for path, _ in ROUTES])
def test_the_upstream_receives_the_target_and_the_metrics_count_it(
    gw: Gateway, emulator: Emulator, path: str, body: dict[str, Any]
) -> None:
    answer = _post(gw, path, {"model": "claude-sonnet-4-5-20250929", **body})
    assert answer.status_code == 200, answer.text
    assert _sent_models(emulator) == [TARGET]
    text = gw.metrics_text()
    assert metric_value(text, "gateway_requests_total", route=path, model=TARGET) == 1
    assert "claude-sonnet" not in text


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
def test_the_allow_list_is_checked_on_the_target(
    gw: Gateway, emulator: Emulator, path: str
) -> None:
    body = {"model": "gpt-5-codex", "messages": MESSAGES, "stream": False}
    _, target_only = gw.create_key("target", models=[TARGET])
    _, alias_only = gw.create_key("alias", models=["gpt-5-codex"])
    _, other = gw.create_key("other", models=["llama3.2"])
    assert _post(gw, path, body, target_only).status_code == 200
    for key in (alias_only, other):
        refused = _post(gw, path, body, key)
        assert refused.status_code == 403
        # Named as the client asked: a key learns no alias's target it may not use.
        assert "'gpt-5-codex'" in refused.text, refused.text
        assert TARGET not in refused.text
    assert _sent_models(emulator) == [TARGET]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_batch_line_is_checked_and_runs_as_the_target(make_gateway, emulator: Emulator) -> None:
    """Checked at upload and run as the target, like an interactive request."""
    gw = make_gateway(model_aliases=ALIASES, **FAST)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    _, alias_only = gw.create_key("alias-only", models=["claude-x"])
    for key in (alias_only, gw.key):
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0) as client:
            file_id = upload_lines(client, [chat_line("a", model="claude-x")])
            created = client.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            batch = wait_batch(client, created.id)
        if key == alias_only:
            assert batch.status == "failed"
            assert batch.errors is not None
            assert [e.code for e in batch.errors.data or []] == ["model_not_allowed"]
            [error] = batch.errors.data or []
            assert error.message is not None
            assert "'claude-x'" in error.message
            assert TARGET not in error.message
        else:
            assert batch.status == "completed", batch
            assert batch.request_counts is not None
            assert batch.request_counts.completed == 1
    assert _sent_models(emulator) == [TARGET]


def test_model_lists_show_the_exact_aliases_a_key_may_use(gw: Gateway) -> None:
    _, fenced = gw.create_key("fenced", models=["llama3.2"])
    openai_ids = [m["id"] for m in _get(gw, "/v1/models").json()["data"]]
    assert "gpt-5-codex" in openai_ids
    assert "ghost" not in openai_ids  # its target is served by no upstream
    assert not any("*" in name for name in openai_ids)  # a pattern has no name to list
    tags = {m["name"]: m for m in _get(gw, "/api/tags").json()["models"]}
    assert tags["gpt-5-codex"]["model"] == "gpt-5-codex"
    assert tags["gpt-5-codex"]["size"] == tags[TARGET]["size"]  # the target's details
    assert "ghost" not in tags
    # A key that may not use the target sees no alias of it.
    assert "gpt-5-codex" not in [m["id"] for m in _get(gw, "/v1/models", fenced).json()["data"]]
    assert "gpt-5-codex" not in [m["name"] for m in _get(gw, "/api/tags", fenced).json()["models"]]


def test_an_alias_is_found_by_name_exact_or_pattern(gw: Gateway) -> None:
    _, fenced = gw.create_key("fenced", models=["llama3.2"])
    for name in ("gpt-5-codex", "claude-opus-4-1"):
        found = _get(gw, f"/v1/models/{name}")
        assert found.status_code == 200, found.text
        assert found.json()["id"] == name
        assert _get(gw, f"/v1/models/{name}", fenced).status_code == 404
    assert _get(gw, "/v1/models/ghost").status_code == 404
    shown = httpx.post(
        f"{gw.url}/api/show", json={"model": "claude-opus-4-1"}, headers=gw.headers(), timeout=30
    )
    assert shown.status_code == 200, shown.text
    hidden = httpx.post(
        f"{gw.url}/api/show", json={"model": "gpt-5-codex"}, headers=gw.headers(fenced), timeout=30
    )
    assert hidden.status_code == 404
    assert hidden.json() == {"error": "model 'gpt-5-codex:latest' not found"}  # not the target


def _get(gw: Gateway, path: str, key: str | None = None) -> httpx.Response:
    return httpx.get(f"{gw.url}{path}", headers=gw.headers(key), timeout=30)


def test_usage_and_the_access_log_record_the_model_that_ran(
    make_gateway, emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    """The client's alias is recorded nowhere: usage rows and the log's `model` name the target
    (docs/keys.md#model-aliases), so what a key is charged for is what its allow-list checked."""
    gw = make_gateway(model_aliases=ALIASES, usage_flush_seconds=0.2)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    # For the whole test: the access line is written after the client has the answer's end.
    caplog.set_level(logging.INFO, logger="gateway.access")
    body = {"model": "claude-haiku-4-5", "messages": MESSAGES}
    assert _post(gw, "/v1/chat/completions", body).status_code == 200

    async def models() -> list[str]:
        store = KeyStore.from_url(gw.database_url)
        try:
            return [row.model for row in (await read_usage(store.engine, key_id=gw.key_id)).rows]
        finally:
            await store.close()

    deadline = time.monotonic() + 30
    while not (rows := asyncio.run(models())):
        assert time.monotonic() < deadline, "usage never recorded the request"
        time.sleep(0.1)
    assert rows == [TARGET]

    def models_logged() -> list[str]:
        logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.access"]
        return [line["model"] for line in logged if line["route"] == "/v1/chat/completions"]

    while not models_logged() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert models_logged() == [TARGET]


def test_count_tokens_checks_the_allow_list_on_the_target(gw: Gateway) -> None:
    """Claude Code counts tokens under its own model names too."""
    body = {"model": "claude-sonnet-4-5", "messages": MESSAGES}
    _, target_only = gw.create_key("target", models=[TARGET])
    _, alias_only = gw.create_key("alias", models=["claude-sonnet-4-5"])
    counted = _post(gw, "/v1/messages/count_tokens", body, target_only)
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] > 0
    refused = _post(gw, "/v1/messages/count_tokens", body, alias_only)
    assert refused.status_code == 403
    assert "'claude-sonnet-4-5'" in refused.text, refused.text
    assert TARGET not in refused.text
