"""Usage accounting over real `gateway serve` processes in front of the emulator.

Clients count what they received (`eval_count`/`prompt_eval_count`, OpenAI `usage`, the
anthropic and openai SDKs' `usage` on the agent surfaces, or the text chunks of a stream that
ended early); after the gateway stopped, the `gateway_usage` table
must hold exactly those numbers, per key and model.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.keys.store import KeyStore
from gateway.metering.counting import UNKNOWN_MODEL, canonical_model
from gateway.metering.report import UsageReport, read_usage
from gateway.testing.stack import ManagedProcess, create_key, gateway_process
from tests.support.stack import Emulator

pytestmark = pytest.mark.processes

MODELS = ("llama3.2", "qwen2.5:7b")
#: The gateway's own timeouts and breaker kept out of the way of the injected faults.
ENV = {
    "GATEWAY_SHUTDOWN_DRAIN": "0.2",
    "GATEWAY_RETRY_ATTEMPTS": "1",
    "GATEWAY_CIRCUIT_FAILURES": "100000",
    "GATEWAY_USAGE_FLUSH_SECONDS": "0.3",
}


@dataclass
class Seen:
    """What one client received: the numbers usage must show for its request."""

    input: int = 0
    output: int = 0
    error: bool = False
    first_token: bool = False


#: The gateway's estimate of the prompt `hi`, what a client that hangs up after its request was
#: sent upstream is charged for its prompt: 2 bytes / 4, rounded up, as a generate `prompt`;
#: 20 bytes / 4 as a chat message (its role, field names and punctuation count too).
PROMPT_ESTIMATE = {"generate": 1, "chat": 5}

Job = Callable[[], tuple[str, str, Seen]]
"""One client request: returns (key id, canonical model, what it saw)."""


def _text(surface: str, event: dict[str, Any]) -> str:
    if surface == "ollama":
        return str(event.get("response") or (event.get("message") or {}).get("content") or "")
    choice = (event.get("choices") or [{}])[0]
    return str(choice.get("text") or (choice.get("delta") or {}).get("content") or "")


def request(
    url: str, key: str, route: str, model: str, *, stream: bool, cut_after: int | None = None
) -> Seen:
    """POST one generation and count what came back; `cut_after` text chunks hangs up."""
    surface = "openai" if "completions" in route else "ollama"
    body: dict[str, Any] = {"model": model, "stream": stream}
    operation = "chat" if route.endswith(("chat", "chat/completions")) else "generate"
    if operation == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    if surface == "openai" and stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=60) as client:
        if not stream:
            answer = client.post(f"{url}{route}", json=body, headers=headers)
            if answer.status_code != 200:
                return Seen(error=True)
            data = answer.json()
            if surface == "ollama":
                seen = Seen(data.get("prompt_eval_count", 0), data.get("eval_count", 0))
            else:
                usage = data["usage"]
                seen = Seen(usage["prompt_tokens"], usage["completion_tokens"])
            seen.first_token = seen.output > 0
            return seen
        with client.stream("POST", f"{url}{route}", json=body, headers=headers) as answer:
            if answer.status_code != 200:
                answer.read()
                return Seen(error=True)
            chunks, final = 0, None
            for line in answer.iter_lines():
                payload = line.removeprefix("data: ").strip() if surface == "openai" else line
                if not payload:
                    continue
                if payload == "[DONE]":
                    return final or Seen(0, chunks, error=True, first_token=chunks > 0)
                event = json.loads(payload)
                if "error" in event:
                    return Seen(0, chunks, error=True, first_token=chunks > 0)
                if _text(surface, event):
                    chunks += 1
                    if chunks == cut_after:  # and hangs up: charged the prompt it sent
                        return Seen(PROMPT_ESTIMATE[operation], chunks, first_token=True)
                if surface == "ollama" and event.get("done"):
                    return Seen(event.get("prompt_eval_count", 0), event["eval_count"], False, True)
                if surface == "openai" and event.get("usage"):
                    usage = event["usage"]
                    final = Seen(usage["prompt_tokens"], usage["completion_tokens"], False, True)
            return Seen(0, chunks, error=True, first_token=chunks > 0)  # ended without its end


ROUTES = ("/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions")


def _jobs(url: str, keys: dict[str, str], *, stream: tuple[bool, ...], **options: Any) -> list[Job]:
    """One request per key, model, route and stream mode."""
    jobs: list[Job] = []
    for key_id, key in keys.items():
        for model in MODELS:
            for route in ROUTES:
                for streamed in stream:

                    def job(
                        key_id: str = key_id,
                        key: str = key,
                        model: str = model,
                        route: str = route,
                        streamed: bool = streamed,
                    ) -> tuple[str, str, Seen]:
                        seen = request(url, key, route, model, stream=streamed, **options)
                        return key_id, canonical_model(model), seen

                    jobs.append(job)
    return jobs


Expected = dict[tuple[str, str], list[int]]


def _run(jobs: list[Job], expected: Expected) -> list[Seen]:
    """Run `jobs` 8 at a time; add what each client saw to `expected`."""
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda job: job(), jobs))
    for key_id, model, seen in results:
        _add(expected, key_id, model, seen)
    return [seen for *_, seen in results]


def _add(expected: Expected, key_id: str, model: str, seen: Seen) -> None:
    row = expected.setdefault((key_id, model), [0, 0, 0, 0, 0])
    for index, value in enumerate((1, seen.error, seen.input, seen.output, seen.first_token)):
        row[index] += int(value)


def _usage(database_url: str) -> UsageReport:
    async def read() -> UsageReport:
        store = KeyStore.from_url(database_url)
        try:
            return await read_usage(store.engine)
        finally:
            await store.close()

    return asyncio.run(read())


def _recorded(report: UsageReport) -> Expected:
    totals: Expected = defaultdict(lambda: [0, 0, 0, 0, 0])
    for row in report.rows:
        t = row.totals
        for index, value in enumerate(
            (t.requests, t.errors, t.input_tokens, t.output_tokens, t.ttft_count)
        ):
            totals[(row.key_id, row.model)][index] += value
    return dict(totals)


def _stop(gateway: ManagedProcess) -> None:
    """SIGTERM and wait for the exit (a graceful stop: the final flush runs)."""
    assert gateway.process is not None
    gateway.process.send_signal(signal.SIGTERM)
    assert gateway.process.wait(60) in (0, -signal.SIGTERM)


def _mixed_load(emulator: Emulator, url: str, keys: dict[str, str], expected: Expected) -> None:
    """Streamed and not, both surfaces, cut short, upstream errors (the emulator's knobs)."""
    config = emulator.config
    config.tokens, config.inter_token = 7, 0.002
    _run(_jobs(url, keys, stream=(True, False)), expected)
    config.fault, config.fault_after = "hang_midstream", 3  # the client hangs up after 3
    for seen in _run(_jobs(url, keys, stream=(True,), cut_after=3), expected):
        assert (seen.output, seen.error) == (3, False)
    config.fault, config.fault_after = "error_midstream", 2
    for seen in _run(_jobs(url, keys, stream=(True, False)), expected):
        assert seen.error
    config.fault = "status_before"
    _run(_jobs(url, keys, stream=(True, False)), expected)
    config.fault = None


def test_usage_equals_what_clients_received_over_a_mixed_load(emulator: Emulator, tmp_path: Path):
    with gateway_process(tmp_path, {"GATEWAY_UPSTREAM_URL": emulator.url, **ENV}) as gateway:
        made = [create_key(gateway.extra_env, name) for name in ("alice", "bob")]
        keys = {str(k["id"]): str(k["key"]) for k in made}
        limited = create_key(gateway.extra_env, "carol", "--models", "llama3.2")
        expected: Expected = {}
        _mixed_load(emulator, gateway.url, keys, expected)
        # Refused after authentication: a model the key may not use, a body that is no JSON.
        headers = {"Authorization": f"Bearer {limited['key']}"}
        refused = httpx.post(
            f"{gateway.url}/api/chat", json={"model": "Qwen2.5:7B", "messages": []}, headers=headers
        )
        assert refused.status_code == 403
        bad = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{", headers=headers)
        assert bad.status_code == 400
        for model in ("qwen2.5:7b", UNKNOWN_MODEL):
            _add(expected, str(limited["id"]), model, Seen(error=True))
        _stop(gateway)
    report = _usage(gateway.env["GATEWAY_DATABASE_URL"])
    assert _recorded(report) == expected
    requests = sum(row[0] for row in expected.values())
    assert report.totals.requests == requests == 2 * 2 * 4 * (2 + 1 + 2 + 2) + 2
    assert report.totals.output_tokens > 0
    assert report.totals.generation_us_sum > 0
    assert {row.key_name for row in report.rows} == {"alice", "bob", "carol"}


def _wait_generations(emulator: Emulator, count: int) -> None:
    """Block until the emulator has seen `count` generations (not probes or model lists)."""
    deadline = time.monotonic() + 60  # generous: a loaded machine is slow, never wrong
    while time.monotonic() < deadline:
        paths = [record.path for record in emulator.state.records]
        if sum(path in ("/api/generate", "/api/chat") for path in paths) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"the emulator did not see {count} generations")


def test_sigterm_mid_load_loses_nothing_acknowledged(emulator: Emulator, tmp_path: Path):
    env = {
        "GATEWAY_UPSTREAM_URL": emulator.url,
        **ENV,
        "GATEWAY_SHUTDOWN_TIMEOUT": "8",
        "GATEWAY_USAGE_FLUSH_SECONDS": "300",  # only the final flush can write anything
    }
    with gateway_process(tmp_path, env) as gateway:
        done, cut = (create_key(gateway.extra_env, name) for name in ("done", "cut"))
        emulator.config.ttft, emulator.config.inter_token = 0.05, 0.05
        emulator.config.tokens = 20  # a second: these finish within the shutdown deadline
        short = _jobs(gateway.url, {str(done["id"]): str(done["key"])}, stream=(True,))
        with ThreadPoolExecutor(len(short) + 4) as pool:
            finished = [pool.submit(job) for job in short]
            _wait_generations(emulator, len(short))
            emulator.config.tokens = 100_000  # these are still running at the deadline
            endless = [
                pool.submit(request, gateway.url, str(cut["key"]), route, "llama3.2", stream=True)
                for route in ROUTES
            ]
            _wait_generations(emulator, len(short) + len(endless))
            assert gateway.process is not None
            gateway.process.send_signal(signal.SIGTERM)
            completed = [future.result() for future in finished]
            ended = [future.result() for future in endless]
        assert gateway.process.wait(60) in (0, -signal.SIGTERM)
    assert all(not seen.error and seen.output == 20 for *_, seen in completed)
    assert all(seen.error for seen in ended)  # ended by the deadline with an error
    rows = _recorded(_usage(gateway.env["GATEWAY_DATABASE_URL"]))
    expected: Expected = {}
    for key_id, model, seen in completed:
        _add(expected, key_id, model, seen)
    assert {k: v for k, v in rows.items() if k[0] == done["id"]} == expected
    [(requests, errors, _, output, _)] = [v for k, v in rows.items() if k[0] == cut["id"]]
    assert (requests, errors) == (len(endless), len(endless))
    assert output >= sum(seen.output for seen in ended)


@pytest.mark.postgres
def test_two_gateways_on_one_postgresql_add_up_exactly(
    emulator: Emulator, tmp_path: Path, postgres_url: str
):
    env = {"GATEWAY_UPSTREAM_URL": emulator.url, "GATEWAY_DATABASE_URL": postgres_url, **ENV}
    emulator.config.tokens, emulator.config.inter_token = 5, 0.002
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with gateway_process(tmp_path / "a", env) as a, gateway_process(tmp_path / "b", env) as b:
        made = [create_key(a.extra_env, name) for name in ("alice", "bob")]
        keys = {str(k["id"]): str(k["key"]) for k in made}
        expected: Expected = {}
        for _ in range(3):  # the same rows, from both replicas, over several flushes
            _run(
                _jobs(a.url, keys, stream=(True, False)) + _jobs(b.url, keys, stream=(True, False)),
                expected,
            )
        _stop(a)
        _stop(b)
    report = _usage(postgres_url)
    assert _recorded(report) == expected
    assert report.totals.requests == 3 * 2 * 2 * 2 * 4 * 2
    assert all(not row.totals.errors for row in report.rows)


def _agent_surface_jobs(url: str, keys: dict[str, str]) -> list[Job]:
    """Each key, each model, `/v1/messages` and `/v1/responses`, streamed and not, through the
    real SDKs; each job returns the usage its client was given."""
    import anthropic
    import openai

    def messages(key_id: str, model: str, stream: bool) -> tuple[str, str, Seen]:
        with anthropic.Anthropic(base_url=url, api_key=keys[key_id], max_retries=0) as client:
            asked: Any = {
                "model": model,
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "hi"}],
            }
            if stream:
                with client.messages.stream(**asked) as events:
                    message = events.get_final_message()
            else:
                message = client.messages.create(**asked)
        usage = message.usage
        seen = Seen(usage.input_tokens, usage.output_tokens, first_token=True)
        return key_id, canonical_model(model), seen

    def responses(key_id: str, model: str, stream: bool) -> tuple[str, str, Seen]:
        with openai.OpenAI(base_url=f"{url}/v1", api_key=keys[key_id], max_retries=0) as client:
            if stream:
                events = list(client.responses.create(model=model, input="hi", stream=True))
                answer = events[-1].response  # type: ignore[union-attr]
            else:
                answer = client.responses.create(model=model, input="hi")
        assert answer.usage is not None
        usage = answer.usage
        seen = Seen(usage.input_tokens, usage.output_tokens, first_token=True)
        return key_id, canonical_model(model), seen

    return [
        lambda f=f, k=k, m=m, s=s: f(k, m, s)  # type: ignore[misc]
        for f in (messages, responses)
        for k in keys
        for m in MODELS
        for s in (True, False)
    ]


@pytest.mark.clients
def test_usage_is_exact_on_the_agent_surfaces(emulator: Emulator, tmp_path: Path) -> None:
    """The anthropic and openai SDKs' `usage` on `/v1/messages` and `/v1/responses` (the
    upstream's counts) is what the usage table holds per key and model, in both dialects."""
    emulator.config.tokens, emulator.config.inter_token = 7, 0.002
    expected: Expected = {}
    for dialect in ("ollama", "openai"):
        env = {"GATEWAY_UPSTREAM_URL": emulator.url, "GATEWAY_UPSTREAM_DIALECT": dialect, **ENV}
        (tmp_path / dialect).mkdir()
        with gateway_process(tmp_path / dialect, env) as gateway:
            made = [create_key(gateway.extra_env, name) for name in ("alice", "bob")]
            keys = {str(k["id"]): str(k["key"]) for k in made}
            expected = {}
            seen = _run(_agent_surface_jobs(gateway.url, keys), expected)
            assert all(s.output == 7 and s.input > 0 for s in seen)
            _stop(gateway)
        report = _usage(gateway.env["GATEWAY_DATABASE_URL"])
        assert _recorded(report) == expected
        assert report.totals.requests == 2 * 2 * 2 * 2


def test_made_up_model_names_make_one_other_row_per_key_and_day(
    emulator: Emulator, tmp_path: Path
) -> None:
    with gateway_process(tmp_path, {"GATEWAY_UPSTREAM_URL": emulator.url, **ENV}) as gateway:
        made = create_key(gateway.extra_env, "mallory")
        headers = {"Authorization": f"Bearer {made['key']}"}
        statuses = set()
        with httpx.Client(timeout=30, headers=headers) as client:
            for n in range(40):  # each name once: before the fix, 40 rows
                body = {"model": f"made-up-{n}", "prompt": "hi", "stream": False}
                statuses.add(client.post(f"{gateway.url}/api/generate", json=body).status_code)
                hi = [{"role": "user", "content": "hi"}]
                chat = {"model": f"Made-Up-{n}:x", "messages": hi, "stream": False}
                statuses.add(
                    client.post(f"{gateway.url}/v1/chat/completions", json=chat).status_code
                )
            real = client.post(
                f"{gateway.url}/api/generate",
                json={"model": "llama3.2", "prompt": "hi", "stream": False},
            )
            assert real.status_code == 200, real.text
        _stop(gateway)
    assert all(status >= 400 for status in statuses), statuses
    report = _usage(gateway.env["GATEWAY_DATABASE_URL"])
    rows = {row.model: row.totals for row in report.rows if row.key_id == made["id"]}
    assert set(rows) == {"other", "llama3.2:latest"}  # the real model stays exact
    assert (rows["other"].requests, rows["other"].errors) == (80, 80)
