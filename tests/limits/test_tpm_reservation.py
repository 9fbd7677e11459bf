"""TPM reservations and RPM before the body, over real sockets (issue 11, class 5).

A request reserves its expected tokens (`num_predict`, else `GATEWAY_TPM_RESERVE_TOKENS`, plus
its prompt's bytes / 4) when it is admitted and settles them when it ends, so parallel requests
cannot all pass one "tokens left" check. RPM and in-flight are decided before the body is read,
and a refusal after that gives the in-flight slot back.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.api.openai.schema import parse_chat
from gateway.auth.principal import Principal
from gateway.errors import RateLimitedError
from gateway.limits.estimate import TokenEstimate
from gateway.limits.estimate import estimate_tokens as _estimate_request
from gateway.limits.limiter import KeyLimiter
from gateway.limits.storage import build_storage
from gateway.metering.metrics import Metrics
from gateway.policies import LimitPolicy
from gateway.settings import Settings
from tests.limits.test_ratelimit import _generations, _redis_up
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.servers import REDIS_URL
from tests.support.stack import Emulator, Gateway

#: A prompt of 4 bytes: estimated at one token.
PROMPT = "tiny"


def estimate_tokens(body: dict[str, Any], default_output: int) -> TokenEstimate:
    """The estimate of an Ollama body, parsed as the gateway parses it."""
    import json

    from gateway.api.ollama.schema import parse_generation
    from gateway.settings import Settings

    operation = "chat" if "messages" in body else "generate"
    raw = json.dumps({"model": "m", **body}).encode()
    return _estimate_request(parse_generation(raw, operation, Settings()), default_output)


def _generate(
    gw: Gateway, num_predict: int | None = None, key: str | None = None
) -> httpx.Response:
    body: dict[str, object] = {"model": MODEL, "prompt": PROMPT, "stream": False}
    if num_predict is not None:
        body["options"] = {"num_predict": num_predict}
    return httpx.post(f"{gw.url}/v1/generate", json=body, headers=gw.headers(key), timeout=60)


def _burst(gateways: list[Gateway], key: str, n: int, num_predict: int) -> list[httpx.Response]:
    """`n` requests at once, spread over `gateways` in turn."""
    with ThreadPoolExecutor(n) as pool:
        futures = [
            pool.submit(_generate, gateways[i % len(gateways)], num_predict, key) for i in range(n)
        ]
        return [f.result() for f in futures]


def _served_tokens(responses: list[httpx.Response]) -> int:
    return sum(
        r.json().get("prompt_eval_count", 0) + r.json()["eval_count"]
        for r in responses
        if r.status_code == 200
    )


def _assert_bounded(emulator: Emulator, responses: list[httpx.Response], tpm: int) -> None:
    """50 x num_predict 10 on TPM 50: each reserves 11 tokens, so 4 fit (44 <= 50)."""
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}
    admitted = statuses.count(200)
    assert 1 <= admitted <= 5
    assert _served_tokens(responses) <= tpm + 11  # the limit plus one request's worth
    assert len(_generations(emulator)) == admitted
    refused = next(r for r in responses if r.status_code == 429)
    assert "tokens per minute" in refused.json()["error"]
    assert int(refused.headers["retry-after"]) >= 1


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_parallel_requests_share_the_tpm_window_instead_of_overshooting(
    make_gateway, emulator: Emulator
):
    """Before: 50 parallel requests on a TPM 50 key were admitted 31 times for 868 tokens."""
    gw = make_gateway(default_tpm=50)
    emulator.config.inter_token = 0.02  # 10 tokens in ~0.2 s: the burst overlaps
    emulator.config.prompt_eval_count = 1
    _assert_bounded(emulator, _burst([gw], gw.key, 50, num_predict=10), tpm=50)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.skipif(not _redis_up(), reason="Redis is not running on 127.0.0.1:6379")
def test_two_gateways_on_one_redis_share_the_reservations(make_gateway, emulator: Emulator):
    """The same burst spread over two gateways sharing one Redis and one key store."""
    shared = {
        "default_tpm": 50,
        "rate_limit_storage": REDIS_URL,
        "rate_limit_key_prefix": f"test-{uuid.uuid4().hex}",
        "rate_limit_timeout": 5.0,  # 50 new Redis connections at once on a small CI box
    }
    a = make_gateway(**shared)
    b = make_gateway(**shared, database_url=a.database_url)
    emulator.config.inter_token = 0.02
    emulator.config.prompt_eval_count = 1
    _assert_bounded(emulator, _burst([a, b], a.key, 50, num_predict=10), tpm=50)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_reservation_holds_while_running_and_is_refunded_when_it_ends(
    make_gateway, emulator: Emulator
):
    """TPM 100; num_predict 60 reserves 61. A parallel second one does not fit; after the
    first ends having used 6 tokens, the refund lets the next 61 in."""
    gw = make_gateway(default_tpm=100)
    emulator.config.tokens = 5
    emulator.config.inter_token = 0.2  # ~1 s: the second request arrives while it runs
    emulator.config.prompt_eval_count = 1
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_generate, gw, 60)
        deadline = time.monotonic() + 10
        while not _generations(emulator):  # upstream, so admitted: its reservation is made
            assert time.monotonic() < deadline, "the first request never reached the upstream"
            time.sleep(0.01)
        refused = _generate(gw, 60)
        assert running.result().status_code == 200
    assert refused.status_code == 429
    assert "needs about 61" in refused.json()["error"]
    assert refused.headers["x-ratelimit-tokens-remaining"] == "39"
    emulator.config.inter_token = 0.001
    after = _generate(gw, 60)
    assert after.status_code == 200
    assert after.headers["x-ratelimit-tokens-remaining"] == str(100 - 6)
    # ...and that one settled too: 6 + 6 used, so the window has 88 left.
    assert _generate(gw, 1).headers["x-ratelimit-tokens-remaining"] == "88"


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/generate", {"prompt": PROMPT, "options": {"num_predict": 500}}),
        ("/api/chat", {"messages": [{"role": "user", "content": PROMPT}]}),  # no bound at all
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32000},
        ),
    ],
    ids=["num_predict", "no-bound", "max_tokens"],
)
def test_a_bound_above_the_whole_tpm_is_served_with_the_bound_a_window_holds(
    make_gateway, emulator: Emulator, dialect: str, path: str, body: dict[str, Any]
):
    """Before: a bound above the key's TPM was a 413 for good, so Claude Code (`max_tokens:
    32000` on every turn) could never use a key under 32,000 TPM. Now it is served, and the
    upstream is told the bound the gateway checked: at most the TPM less the prompt (a request
    with no bound is given that one too), so no answer outgrows the window (docs/keys.md)."""
    gw = make_gateway(default_tpm=50, upstream_dialect=dialect)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    for _ in range(2):  # the second one with the key's answer history
        served = httpx.post(
            f"{gw.url}{path}",
            json={"model": MODEL, "stream": False, **body},
            headers=gw.headers(),
            timeout=60,
        )
        assert served.status_code == 200, served.text
    sent = [r.body for r in emulator.state.records if r.method == "POST"]
    assert len(sent) == 2
    for upstream_body in sent:
        bound = (
            upstream_body["options"]["num_predict"]
            if dialect == "ollama"
            else upstream_body["max_tokens"]
        )
        assert 40 <= bound < 50, upstream_body  # 50 less the prompt's few tokens


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("dialect", ["ollama", "openai"])
def test_fifty_agents_declaring_32000_share_the_window_and_spend_at_most_twice_the_tpm(
    make_gateway, emulator: Emulator, dialect: str
):
    """TPM 600, `max_tokens: 32000` (Claude Code's, on every turn). The key's answers were 10
    tokens long; then the model turns verbose (200 tokens an answer) and 50 such requests come
    at once. Each reserves its prompt + 10, so several are admitted together (before: all 413
    for good); what they may generate past their reservation is the key's headroom, 600 in
    all, so the tokens the upstream really served stay within twice the TPM (with the client's
    bound sent as is, the ~36 admitted would have made 200 tokens each)."""
    tpm = 600
    gw = make_gateway(default_tpm=tpm, upstream_dialect=dialect)
    config = emulator.config
    config.ttft = config.inter_token = 0.001
    config.tokens, config.prompt_eval_count = 10, 1
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32000}
    prompt = _estimate_request(parse_chat(json.dumps(body).encode(), Settings()), 256).prompt

    def send(_: int = 0) -> httpx.Response:
        return httpx.post(
            f"{gw.url}/v1/chat/completions", json=body, headers=gw.headers(), timeout=120
        )

    assert send().status_code == 200  # the key's history: 10-token answers
    config.tokens, config.inter_token = 200, 0.01  # ~2 s an answer: the burst overlaps
    with ThreadPoolExecutor(50) as pool:
        responses = list(pool.map(send, range(50)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= 3, statuses
    refused = next(r for r in responses if r.status_code == 429)
    assert "tokens per minute" in refused.json()["error"]["message"]
    served = [r for r in emulator.state.records if r.method == "POST"]
    assert len(served) == 1 + statuses.count(200)
    spent = sum(r.tokens_sent + prompt for r in served)  # what the window was charged
    assert spent <= 2 * tpm, spent
    assert any(
        r.json()["choices"][0]["finish_reason"] == "length"
        for r in responses
        if r.status_code == 200
    )  # some answers were bounded by what the key's window could still grant


def _abandon_body(gw: Gateway) -> None:
    """Send a request's headers and half its body, then close the connection."""
    address = urlsplit(gw.url)
    with socket.create_connection((address.hostname, address.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/generate HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {gw.key}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"model": "llama'
        )


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_rpm_is_spent_before_the_body_and_refusals_after_it_leak_no_slot(
    make_gateway, emulator: Emulator
):
    """rpm 5, one in flight: a junk body, a forbidden model, a TPM refusal and an abandoned
    body each cost an RPM hit and give their in-flight slot back; the fifth request is served
    and the sixth is refused by RPM."""
    gw = make_gateway(default_rpm=5, default_max_concurrent=1, default_tpm=1000)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    _, fenced = gw.create_key("fenced", models=["qwen2.5:7b"], rpm=5, max_concurrent=1)
    junk = httpx.post(f"{gw.url}/v1/generate", content=b"{nope", headers=gw.headers())
    assert junk.status_code == 400
    too_long = {"model": MODEL, "prompt": "x" * 8000}  # ~2,000 tokens: never fits 1,000 TPM
    tpm_refusal = httpx.post(f"{gw.url}/api/generate", json=too_long, headers=gw.headers())
    assert tpm_refusal.status_code == 413  # TPM, after the RPM hit
    _abandon_body(gw)
    deadline = time.monotonic() + 10
    while not metric_value(
        gw.metrics_text(), "gateway_requests_total", outcome="client_disconnect"
    ):
        assert time.monotonic() < deadline, "the abandoned request was never seen to end"
        time.sleep(0.02)
    forbidden = _generate(gw, key=fenced)
    assert forbidden.status_code == 403
    assert [_generate(gw, key=fenced).status_code for _ in range(4)] == [403] * 4
    served = _generate(gw)  # the in-flight slot came back every time
    assert served.status_code == 200
    # junk, TPM refusal, abandoned body, served: 4 hits; one more is allowed, then 429.
    assert served.headers["x-ratelimit-remaining"] == "1"
    assert _generate(gw).status_code == 200
    last = _generate(gw)
    assert last.status_code == 429
    assert "requests per minute" in last.json()["error"]


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_reservation_the_storage_cannot_make_follows_the_fail_policy(
    make_gateway, emulator: Emulator, fail_open: bool
):
    """Redis down: open serves without a reservation, closed answers 503; neither hangs."""
    gw = make_gateway(
        default_tpm=100,
        rate_limit_storage="redis://127.0.0.1:1/0",
        rate_limit_timeout=0.3,
        rate_limit_fail_open=fail_open,
    )
    emulator.config.ttft = emulator.config.inter_token = 0.001
    statuses = [_generate(gw, num_predict=10).status_code for _ in range(2)]
    assert statuses == ([200, 200] if fail_open else [503, 503])
    assert metric_value(gw.metrics_text(), "gateway_rate_limit_storage_errors_total") >= 2


def test_estimates_read_num_predict_and_the_prompt():
    assert estimate_tokens({"prompt": "x" * 40, "options": {"num_predict": 7}}, 256).total == 17
    for options in ({}, {"num_predict": -1}, {"num_predict": -2}, {"num_predict": True}, None):
        estimate = estimate_tokens({"prompt": "", "options": options}, 256)
        assert (estimate.output, estimate.asked) == (256, False)
    chat = {
        "messages": [{"role": "user", "content": "é" * 8}, {"role": "x", "images": ["A" * 999]}]
    }
    # 16 UTF-8 bytes of content, the messages' other text and punctuation (25 bytes): 41 bytes.
    # Images are not counted.
    assert estimate_tokens(chat, 0).prompt == 11
    assert estimate_tokens({"context": [1, 2, 3], "prompt": "abcd"}, 0).prompt == 4


@pytest.mark.anyio
async def test_a_refund_never_credits_a_window_that_did_not_hold_the_reservation():
    settings = Settings(upstream_url="http://127.0.0.1:1")
    storage = build_storage(LimitPolicy.of(settings))
    limiter = KeyLimiter(storage, LimitPolicy.of(settings), Metrics())
    principal = Principal("k1", "app", None, tpm=100)
    first = await limiter.admit(principal)
    await limiter.reserve(first, estimate_tokens({"options": {"num_predict": 40}}, 256))
    # As if a minute had passed: the first reservation's window ended, a new one begins.
    await storage.clear("LIMITER/tpm/k1/100/1/minute")
    first.window_ends -= 60
    second = await limiter.admit(principal)
    await limiter.reserve(second, estimate_tokens({"options": {"num_predict": 70}}, 256))
    await limiter.release(first, 5)  # used 5 of 40: the 35 were the old window's
    third = await limiter.admit(principal)
    with pytest.raises(RateLimitedError, match="needs about 31"):
        await limiter.reserve(third, estimate_tokens({"options": {"num_predict": 31}}, 256))
    await limiter.release(second, 70)
    await limiter.release(second, 70)  # a second release settles nothing
    await limiter.reserve(third, estimate_tokens({"options": {"num_predict": 30}}, 256))


# --- the prompt counts: bounded by the key's TPM, charged when the client hangs up (issue 29) --

#: A prompt of 4,000 bytes: estimated at 1,000 tokens.
BIG = "word " * 800


def _tokens_left(gw: Gateway, key: str | None = None) -> int:
    """What the key's TPM window has left, as a 1-token request is told before it reserves."""
    probe = _generate(gw, num_predict=1, key=key)
    assert probe.status_code == 200, probe.text
    return int(probe.headers["x-ratelimit-tokens-remaining"])


def _until_disconnects(gw: Gateway, count: int) -> None:
    """Wait until the gateway has finished `count` requests whose client left."""
    deadline = time.monotonic() + 30  # generous: a loaded machine is slow, never wrong
    while (
        metric_value(gw.metrics_text(), "gateway_requests_total", outcome="client_disconnect")
        < count
    ):
        assert time.monotonic() < deadline, "the gateway never saw the client leave"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("path", "body", "openai_shaped"),
    [
        ("/api/generate", {"prompt": "x" * 8000}, False),
        ("/api/chat", {"messages": [{"role": "user", "content": "x" * 8000}]}, False),
        ("/api/generate", {"prompt": "hi", "context": list(range(2001))}, False),
        ("/api/embed", {"input": ["x" * 4000] * 2}, False),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 8000}]}, True),
        ("/v1/completions", {"prompt": "x" * 8000}, True),
        ("/v1/embeddings", {"input": "x" * 8000}, True),
    ],
)
def test_a_prompt_larger_than_the_whole_tpm_is_refused_for_good(
    make_gateway, emulator: Emulator, path: str, body: dict[str, Any], openai_shaped: bool
):
    """Before: the reservation was capped at the TPM, so one 2,000,000-token prompt passed
    each minute on a 1,000-token key. Now it is a 413 in the client's format, not a 429 that
    clients retry: no window can ever hold it."""
    _assert_refused_for_good(make_gateway(default_tpm=1000), emulator, path, body, openai_shaped)


def _assert_refused_for_good(
    gw: Gateway, emulator: Emulator, path: str, body: dict[str, Any], openai_shaped: bool
) -> None:
    """`body` is a 413 on `gw` (a 1,000-TPM key) that reaches no upstream and charges nothing."""
    refused = httpx.post(
        f"{gw.url}{path}", json={"model": MODEL, **body}, headers=gw.headers(), timeout=60
    )
    assert refused.status_code == 413
    error = refused.json()["error"]
    if openai_shaped:
        assert error["type"] == "invalid_request_error"
        message = error["message"]
    else:
        message = error
    assert "1000 tokens per minute" in message
    assert "prompt" in message
    assert "can never be admitted" in message
    assert "retry-after" not in refused.headers
    assert [r for r in emulator.state.records if r.method == "POST"] == []
    assert metric_value(gw.metrics_text(), "gateway_rate_limited_total", kind="tpm") == 1
    # The refusal charged nothing: the whole window is left.
    emulator.config.ttft = emulator.config.inter_token = 0.001
    assert _tokens_left(gw) == 1000


#: 8,000 bytes: about 2,000 tokens, twice a 1,000-TPM key's whole window.
TEXT = "x" * 8000
USER = {"role": "user", "content": "hi"}


def _tool(description: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """One function tool in the shape both surfaces take (reference section 3.1)."""
    schema = parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": "f", "description": description, **schema}}


@pytest.mark.parametrize(
    ("path", "body", "openai_shaped"),
    [
        ("/api/chat", {"messages": [USER], "tools": [_tool(TEXT)]}, False),
        (  # a tool parameter's name: keys count too
            "/api/chat",
            {"messages": [USER], "tools": [_tool("", {"properties": {TEXT: {"type": "string"}}})]},
            False,
        ),
        (
            "/api/chat",
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"arguments": {"a": TEXT}}}]},
                    USER,
                ]
            },
            False,
        ),
        ("/api/chat", {"messages": [{"role": "assistant", "thinking": TEXT}, USER]}, False),
        ("/api/chat", {"messages": [{"role": "tool", "tool_name": TEXT, "content": "1"}]}, False),
        ("/api/chat", {"messages": [USER], "format": {"description": TEXT}}, False),
        ("/api/generate", {"prompt": "hi", "format": {"type": "object", "title": TEXT}}, False),
        ("/api/generate", {"prompt": "hi", "a_field_added_tomorrow": [TEXT]}, False),
        ("/v1/chat/completions", {"messages": [USER], "tools": [_tool(TEXT)]}, True),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"arguments": TEXT}}
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "1"},
                ]
            },
            True,
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [USER],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"description": TEXT}},
                },
            },
            True,
        ),
        ("/v1/chat/completions", {"messages": [{**USER, "name": TEXT}]}, True),
        ("/v1/chat/completions", {"messages": [USER], "functions": [{"name": TEXT}]}, True),
        ("/v1/completions", {"prompt": "hi", "a_field_added_tomorrow": {"x": TEXT}}, True),
    ],
    ids=[
        "ollama-tools",
        "ollama-tool-parameter-name",
        "ollama-tool-call-arguments",
        "ollama-thinking",
        "ollama-tool-name",
        "ollama-chat-format",
        "ollama-generate-format",
        "ollama-new-field",
        "openai-tools",
        "openai-tool-call-arguments",
        "openai-response-format",
        "openai-message-name",
        "openai-functions",
        "openai-new-field",
    ],
)
@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_every_field_the_model_prefills_counts_in_the_prompt_bound(
    make_gateway, emulator: Emulator, path: str, body: dict[str, Any], openai_shaped: bool
):
    """Before: only `prompt`, `system`, `suffix`, `template` and messages' `content` were
    counted, so 2,000 tokens (or 250,000) of tools, tool calls, thinking, a format schema or a
    name passed a 1,000-TPM key reserving a few tokens; the upstream renders them all into the
    prompt it prefills. Now every field counts but the few that are not prompt text."""
    _assert_refused_for_good(make_gateway(default_tpm=1000), emulator, path, body, openai_shaped)


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
def test_concurrent_huge_tool_lists_are_all_refused(make_gateway, emulator: Emulator, path: str):
    """Before: 10 concurrent requests with ~250,000 tokens of tool descriptions each reserved
    a few tokens, and all 10 were served on a 1,000-TPM key. Now each alone exceeds it: 413."""
    gw = make_gateway(default_tpm=1000)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    body = {"model": MODEL, "messages": [USER], "tools": [_tool("word " * 200_000)]}

    def send(_: int) -> httpx.Response:
        return httpx.post(f"{gw.url}{path}", json=body, headers=gw.headers(), timeout=120)

    with ThreadPoolExecutor(10) as pool:
        statuses = [r.status_code for r in pool.map(send, range(10))]
    assert statuses == [413] * 10
    assert _generations(emulator) == []


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_concurrent_tool_lists_share_the_window(make_gateway, emulator: Emulator):
    """TPM 1,000; 10 concurrent chats each carrying ~600 tokens of tools and `num_predict`
    10: each reserves ~620 tokens, so at most one is admitted (before: ~11 each, all 10)."""
    gw = make_gateway(default_tpm=1000)
    emulator.config.tokens, emulator.config.inter_token = 10, 0.05  # ~0.5 s: they overlap
    emulator.config.prompt_eval_count = 1  # the upstream counts low: the estimate still holds
    tools = [_tool("word " * 120) for _ in range(4)]  # 4 x 600 bytes: ~600 tokens
    body = {"model": MODEL, "messages": [USER], "tools": tools, "stream": False}
    body["options"] = {"num_predict": 10}

    def send(_: int) -> httpx.Response:
        return httpx.post(f"{gw.url}/api/chat", json=body, headers=gw.headers(), timeout=60)

    with ThreadPoolExecutor(10) as pool:
        responses = list(pool.map(send, range(10)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) <= 1, statuses
    assert len(_generations(emulator)) == statuses.count(200)
    refused = next(r for r in responses if r.status_code == 429)
    assert "tokens per minute" in refused.json()["error"]


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
def test_a_modest_tool_list_and_images_are_still_served(
    make_gateway, emulator: Emulator, path: str
):
    """Counting every field does not refuse ordinary requests: three tools with their
    schemas, and images (not counted: 12,000 bytes of base64 would be 3,000 tokens), pass a
    1,000-TPM key and reach the upstream as sent."""
    gw = make_gateway(default_tpm=1000)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    emulator.config.tokens = 5
    emulator.config.prompt_eval_count = 1
    parameters = {
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        }
    }
    tools = [_tool(f"Look up the {what} of a city.", parameters) for what in ("weather", "time")]
    tools.append(_tool("Convert an amount between two currencies.", parameters))
    image = "aGVsbG8g" * 1500  # 12,000 bytes of base64
    if path == "/api/chat":
        message: dict[str, Any] = {**USER, "images": [image]}
        bound: dict[str, Any] = {"options": {"num_predict": 10}}
    else:
        url = {"url": f"data:image/png;base64,{image}"}
        parts = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": url}]
        message = {"role": "user", "content": parts}
        bound = {"max_tokens": 10}
    body = {"model": MODEL, "messages": [message], "tools": tools, "stream": False, **bound}
    answer = httpx.post(f"{gw.url}{path}", json=body, headers=gw.headers(), timeout=60)
    assert answer.status_code == 200, answer.text
    sent = _generations(emulator) or [
        r for r in emulator.state.records if r.path == "/v1/chat/completions"
    ]
    assert len(sent) == 1
    assert [t["function"]["description"] for t in sent[0].body["tools"]] == [
        t["function"]["description"] for t in tools
    ]
    # Settled at its estimate (the upstream counts 1 prompt token) plus 5 output tokens: the
    # tools counted (~700 bytes / 4), the images not.
    charged = 1000 - _tokens_left(gw)
    assert 100 <= charged < 400, charged


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/generate", {"prompt": BIG, "options": {"num_predict": 10}}),
        ("/api/embed", {"input": [BIG]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": BIG}]}),
    ],
)
def test_large_prompts_count_in_the_window_whatever_the_upstream_reports(
    make_gateway, emulator: Emulator, path: str, body: dict[str, Any]
):
    """TPM 1,500; a 1,000-token prompt the upstream reports as 12 tokens. Before: the
    reservation was refunded down to the upstream's count, so the same prompt passed again at
    once, without end. Now the prompt counts at least at its estimate: the second is a 429."""
    gw = make_gateway(default_tpm=1500)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    emulator.config.tokens = 10
    emulator.config.prompt_eval_count = 12

    def send() -> httpx.Response:
        return httpx.post(
            f"{gw.url}{path}",
            json={"model": MODEL, "stream": False, **body},
            headers=gw.headers(),
            timeout=60,
        )

    assert send().status_code == 200
    again = send()
    assert again.status_code == 429, again.text
    left = int(again.headers["x-ratelimit-tokens-remaining"])
    assert left <= 1500 - 1000


def _hang_up_streaming(gw: Gateway, path: str, body: dict[str, Any], lines: int) -> None:
    """Stream `body`, read `lines` non-empty lines, then close the connection."""
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{gw.url}{path}", json=body, headers=gw.headers()) as answer,
    ):
        assert answer.status_code == 200
        seen = 0
        for line in answer.iter_lines():
            seen += bool(line.strip())
            if seen >= lines:
                return


def _hang_up_waiting(gw: Gateway, path: str, body: dict[str, Any]) -> None:
    """Send `body` and give up after 1 s, before any byte of the answer came."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gw.url}{path}",
            json=body,
            headers=gw.headers(),
            timeout=httpx.Timeout(10, read=1.0),
        )


def _usage_input_tokens(gw: Gateway) -> int:
    """The key's input tokens in `gateway_usage`, once a flush wrote the disconnected one."""
    import asyncio

    from gateway.keys.store import KeyStore
    from gateway.metering.report import read_usage

    async def read() -> int:
        store = KeyStore.from_url(gw.database_url)
        try:
            return (await read_usage(store.engine, key_id=gw.key_id)).totals.input_tokens
        finally:
            await store.close()

    deadline = time.monotonic() + 30
    while not (tokens := asyncio.run(read())):
        assert time.monotonic() < deadline, "usage never recorded the request's prompt"
        time.sleep(0.1)
    return tokens


@pytest.mark.parametrize(
    "how",
    ["stream-ollama", "stream-openai", "before-first-byte", "non-streamed-mid-answer"],
)
@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_client_that_hangs_up_is_charged_the_prompt_the_upstream_took(
    make_gateway, emulator: Emulator, how: str
):
    """Before: a client that left before the final line was charged no prompt, in TPM or in
    usage (the count comes with the final line). The upstream had the prompt and ran its
    prefill: the key is charged its estimate (1,000 tokens), plus the tokens relayed."""
    gw = make_gateway(default_tpm=5000, usage_flush_seconds=0.2)
    config = emulator.config
    config.tokens, config.inter_token, config.prompt_eval_count = 500, 0.02, 12
    ollama = {"model": MODEL, "prompt": BIG}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": BIG}], "stream": True}
    if how == "stream-ollama":
        _hang_up_streaming(gw, "/api/generate", ollama, lines=3)
    elif how == "stream-openai":
        _hang_up_streaming(gw, "/v1/chat/completions", chat, lines=3)
    elif how == "before-first-byte":
        config.ttft = 5.0  # a long prefill: the client gives up during it
        _hang_up_waiting(gw, "/api/generate", ollama)
    else:
        _hang_up_waiting(gw, "/api/generate", {**ollama, "stream": False})
    _until_disconnects(gw, 1)
    assert len(_generations(emulator)) == 1  # it was sent upstream
    config.ttft = config.inter_token = 0.001
    config.tokens = 1
    charged = 5000 - _tokens_left(gw)
    assert 1000 <= charged <= 1000 + 500
    text = gw.metrics_text()
    assert metric_value(text, "gateway_input_tokens_total") >= 1000
    assert _usage_input_tokens(gw) >= 1000


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_client_that_leaves_before_its_request_is_sent_is_charged_nothing(
    make_gateway, emulator: Emulator
):
    """Waiting for an upstream slot, the prompt reached no upstream: nothing is charged."""
    gw = make_gateway(
        default_tpm=5000,
        upstream_max_concurrent=1,
        upstream_queue_size=4,
        upstream_queue_timeout=30,
    )
    emulator.config.tokens, emulator.config.inter_token = 200, 0.02  # ~4 s holding the slot
    emulator.config.prompt_eval_count = 1
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_generate, gw, 200)
        deadline = time.monotonic() + 10
        while not _generations(emulator):
            assert time.monotonic() < deadline, "the first request never reached the upstream"
            time.sleep(0.01)
        _hang_up_waiting(gw, "/api/generate", {"model": MODEL, "prompt": BIG})
        _until_disconnects(gw, 1)
        assert holder.result().status_code == 200
    assert len(_generations(emulator)) == 1
    emulator.config.inter_token = 0.001
    # The holder's 1 + 200 tokens are charged; the one that left in the queue nothing.
    assert _tokens_left(gw) == 5000 - 1 - 200
