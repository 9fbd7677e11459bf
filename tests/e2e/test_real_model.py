"""End to end: a real model server (llama-cpp-python, Gemma 3 270M), a real `gateway serve`
process in front of it (openai dialect), real clients: httpx, the openai SDK, the ollama client.

Skipped when llama-cpp-python is not installed, except under CI (`CI=true`), where a missing
model server is a failure: `scripts/bootstrap` installs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.testing.stack import (
    MODEL_ALIAS,
    ManagedProcess,
    create_key,
    gateway_process,
    model_server,
)
from tests.e2e import require_model_server
from tests.support.metrics import metric_value

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

require_model_server()

# Greedy decoding with a fixed seed: the model's default temperature (0.8) sometimes ends an
# answer at once, and an empty answer has no eval_count (Ollama omits a zero count).
DETERMINISTIC = {"temperature": 0, "seed": 1}

# A raw completion the model goes on with for many tokens: a question ("Name three colors.")
# was sometimes answered with one "\n" and an end (seen in CI), and a stream of one token
# shows nothing about streaming.
COUNTING = "Count to fifty: 1, 2, 3, 4, 5, 6, 7,"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagedProcess, str]]:
    """The model server and a gateway process in front of it; yields (gateway, key)."""
    workdir = tmp_path_factory.mktemp("e2e")
    with model_server(workdir) as model:
        env = {"GATEWAY_UPSTREAM_URL": model.url, "GATEWAY_UPSTREAM_DIALECT": "openai"}
        with gateway_process(workdir, env) as gateway:
            key = create_key(gateway.extra_env, "e2e")
            yield gateway, str(key["key"])


def _assert_counted(content: object, eval_count: int | None, limit: int) -> None:
    """A chat answer and its count agree: text with 1..limit tokens, or none with no count.

    Even greedy, Gemma 3 270M sometimes ends 'Say hello.' at once (which one depends on the
    server's cache state, seen in CI): that is the model's answer, and Ollama omits a zero
    `eval_count`. What the gateway must get right is that the two agree.
    """
    assert isinstance(content, str)
    if content:
        assert eval_count is not None
        assert 0 < eval_count <= limit
    else:
        assert not eval_count


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_streamed_answer_arrives_token_by_token(stack):
    gateway, key = stack
    body = {
        "model": MODEL_ALIAS,
        "prompt": COUNTING,
        "raw": True,
        "options": {"num_predict": 24, **DETERMINISTIC},
    }
    arrivals, lines = [], []
    start = time.perf_counter()
    with httpx.stream(
        "POST", f"{gateway.url}/v1/generate", json=body, headers=_headers(key), timeout=120
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        for line in response.iter_lines():
            if line:
                arrivals.append(time.perf_counter() - start)
                lines.append(json.loads(line))
    content = [line for line in lines if not line["done"]]
    assert len(content) >= 5
    assert "".join(line["response"] for line in content).strip()
    final = lines[-1]
    assert final["done"] is True
    assert final["done_reason"] in ("stop", "length")
    assert final["eval_count"] == len(content)
    assert final["eval_duration"] > 0
    # Incremental: the first token arrives well before the last one.
    assert arrivals[-1] - arrivals[0] > 0.05


def test_non_streamed_chat_answer(stack):
    gateway, key = stack
    body = {
        "model": MODEL_ALIAS,
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": False,
        "options": {"num_predict": 16, **DETERMINISTIC},
    }
    response = httpx.post(f"{gateway.url}/v1/chat", json=body, headers=_headers(key), timeout=120)
    assert response.status_code == 200
    result = response.json()
    assert result["done"] is True
    assert result["message"]["role"] == "assistant"
    _assert_counted(result["message"]["content"], result.get("eval_count"), 16)


def test_rejected_key(stack):
    gateway, _ = stack
    body = {"model": MODEL_ALIAS, "prompt": "hi"}
    response = httpx.post(
        f"{gateway.url}/v1/generate", json=body, headers=_headers("gw_000000000000_bad"), timeout=30
    )
    assert response.status_code == 401
    assert "error" in response.json()


def test_metrics_moved(stack):
    gateway, key = stack
    body = {"model": MODEL_ALIAS, "prompt": "Hi", "options": {"num_predict": 8, **DETERMINISTIC}}
    bad = httpx.post(f"{gateway.url}/v1/generate", json=body, headers=_headers("gw_x"), timeout=9)
    assert bad.status_code == 401
    httpx.post(f"{gateway.url}/v1/generate", json=body, headers=_headers(key), timeout=120)
    text = httpx.get(f"{gateway.url}/metrics").text
    model = {"model": MODEL_ALIAS}
    assert metric_value(text, "gateway_time_to_first_token_seconds_count", **model) >= 1
    assert metric_value(text, "gateway_output_tokens_per_second_count", **model) >= 1
    assert metric_value(text, "gateway_output_tokens_total", **model) >= 8
    assert metric_value(text, "gateway_requests_total", outcome="rejected_auth") >= 1
    assert metric_value(text, "gateway_requests_total", outcome="completed") >= 1


def test_models_and_readiness(stack):
    gateway, key = stack
    models = httpx.get(f"{gateway.url}/v1/models", headers=_headers(key)).json()
    assert [m["id"] for m in models["data"]] == [MODEL_ALIAS]
    assert httpx.get(f"{gateway.url}/readyz").json()["status"] == "ready"


def test_the_demo_runs_and_leaves_nothing_behind(tmp_path: Path):
    """The README's main job, as a user runs it (without the install step)."""
    before = _servers()
    result = subprocess.run(
        [sys.executable, "-m", "gateway.testing.demo", "--max-tokens", "24"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "TTFT" in result.stdout
    assert "decode tokens/s" in result.stdout
    assert "nothing is left running" in result.stdout
    assert "model server ready" in result.stdout
    assert _servers() - before == set()


def _servers() -> set[tuple[str, str]]:
    """(pid, command line) of model servers and gateways run by this checkout's Python.

    Read from /proc; only this interpreter's processes count, so a test run of another
    checkout on the same machine is not mistaken for a leak.
    """
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if not command.startswith(sys.executable):
            continue
        if "llama_cpp.server" in command or "-m gateway serve" in command:
            found.add((cmdline.parent.name, command))
    return found


def test_the_openai_sdk_streams_from_the_real_model(stack):
    """The openai SDK, unchanged but for its base URL and key, streams a real chat answer."""
    import openai

    gateway, key = stack
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0) as client:
        events = list(
            client.chat.completions.create(
                model=MODEL_ALIAS,
                messages=[{"role": "user", "content": "Name three colors."}],
                max_tokens=24,
                temperature=0,
                seed=1,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        texts = [e.choices[0].delta.content or "" for e in events if e.choices]
        assert len([t for t in texts if t]) >= 5  # token by token, not one blob
        assert "".join(texts).strip()
        usage = events[-1].usage
        assert usage is not None
        assert 0 < usage.completion_tokens <= 24
        # llama-cpp-python's stream carries no usage: the gateway counts the chunks it relayed,
        # and cannot know the prompt's tokens (0, not a guess).
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        completion = client.completions.create(
            model=MODEL_ALIAS,
            prompt="Question: What is 2+2?\nAnswer:",
            max_tokens=8,
            temperature=0,
            seed=1,
        )
        assert completion.usage is not None
        assert 0 < completion.usage.completion_tokens <= 8
    bad_key = "gw_000000000000_bad"
    with (
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=bad_key, max_retries=0) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.models.list()


def test_the_openai_sdk_responses_api_with_the_real_model(stack):
    """`client.responses.create` through the gateway to llama.cpp, which has no Responses API:
    translated onto its chat completions, streamed back as Responses events token by token."""
    import openai

    gateway, key = stack
    question = [{"role": "user", "content": "Name three colors."}]
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0) as client:
        events = list(
            client.responses.create(
                model=MODEL_ALIAS, input=question, max_output_tokens=24, temperature=0, stream=True
            )
        )
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert len([d for d in deltas if d]) >= 5  # token by token, not one blob
        final = events[-1]
        assert final.type in ("response.completed", "response.incomplete")
        assert final.response.output_text == "".join(deltas)
        usage = final.response.usage
        assert usage is not None
        assert 0 < usage.output_tokens <= 24
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens
        answer = client.responses.create(
            model=MODEL_ALIAS, input="Say hello.", max_output_tokens=8, temperature=0
        )
        assert answer.status in ("completed", "incomplete")
        assert answer.usage is not None
        _assert_counted(answer.output_text, answer.usage.output_tokens or None, 8)
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert metric_value(metrics, "gateway_requests_total", route="/v1/responses") == 2


def test_the_anthropic_sdk_messages_api_with_the_real_model(stack):
    """`client.messages.stream` through the gateway to llama.cpp, translated onto its chat
    completions and streamed back as Anthropic events token by token; then one message."""
    import anthropic

    gateway, key = stack
    # This SDK's methods no longer take `temperature`; the API does (greedy, as the other tests).
    question = [{"role": "user", "content": "Name three colors."}]
    with anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0) as client:
        with client.messages.stream(
            model=MODEL_ALIAS, messages=question, max_tokens=24, extra_body={"temperature": 0}
        ) as stream:
            deltas = list(stream.text_stream)
            message = stream.get_final_message()
        assert len([d for d in deltas if d]) >= 5  # token by token, not one blob
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert [block.type for block in message.content] == ["text"]
        assert message.content[0].text == "".join(deltas)  # type: ignore[union-attr]
        assert 0 < message.usage.output_tokens <= 24
        answer = client.messages.create(
            model=MODEL_ALIAS,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            extra_body={"temperature": 0},
        )
        text = "".join(b.text for b in answer.content if b.type == "text")
        _assert_counted(text, answer.usage.output_tokens or None, 8)
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(
                base_url=gateway.url, api_key="gw_000000000000_bad", max_retries=0
            ).messages.create(model=MODEL_ALIAS, messages=question, max_tokens=8)
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert (
        metric_value(metrics, "gateway_requests_total", route="/v1/messages", outcome="completed")
        == 2
    )


def test_the_ollama_client_streams_from_the_real_model(stack):
    """The ollama client at Ollama's own paths (OLLAMA_HOST=gateway), in front of llama.cpp."""
    import ollama

    gateway, key = stack
    with ollama.Client(host=gateway.url, headers=_headers(key)) as client:
        parts = list(
            client.generate(
                model=MODEL_ALIAS,
                prompt=COUNTING,
                raw=True,
                options={"num_predict": 16, **DETERMINISTIC},
                stream=True,
            )
        )
        tokens = [p for p in parts if not p.done]
        assert len(tokens) >= 5
        final = parts[-1]
        assert final.done
        assert final.eval_count == len(tokens)  # one chunk per token, counted as relayed
        assert 0 < final.eval_count <= 16
        assert final.eval_duration
        chat = client.chat(
            model=MODEL_ALIAS,
            messages=[{"role": "user", "content": "Say hello."}],
            options={"num_predict": 8, **DETERMINISTIC},
        )
        assert chat.message.role == "assistant"
        _assert_counted(chat.message.content, chat.eval_count, 8)


def test_a_batch_runs_against_the_real_model_with_the_openai_sdk(stack):
    """llama-cpp-python refuses an X-Request-ID that is not a UUID: every batch line failed
    with an empty 400 until the upstream id became one (a client's own id did the same)."""
    import io

    import openai

    gateway, key = stack
    body = {"model": MODEL_ALIAS, "max_tokens": 8, **DETERMINISTIC}
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**body, "messages": [{"role": "user", "content": question}]},
        }
        for i, question in enumerate(["Say hello.", "Name a colour."])
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0) as client:
        file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 300
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            assert time.monotonic() < deadline, batch
            time.sleep(0.5)
            batch = client.batches.retrieve(batch.id)
        assert batch.status == "completed"
        assert batch.request_counts is not None
        assert batch.request_counts.completed == 2, batch.error_file_id
        assert batch.output_file_id is not None
        output = [
            json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()
        ]
    assert sorted(item["custom_id"] for item in output) == ["q0", "q1"]
    for item in output:
        assert item["response"]["status_code"] == 200
        # The model's own answer (greedy decoding may end it at once: that is the model's).
        [choice] = item["response"]["body"]["choices"]
        assert isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] in ("stop", "length")
    # An interactive request with the client's own non-UUID id is answered too.
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={**body, "messages": [{"role": "user", "content": "Say hi."}]},
        headers={**_headers(key), "X-Request-ID": "req-123"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"] == "req-123"
