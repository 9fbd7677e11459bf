"""The relay over real sockets: client -> gateway (uvicorn) -> Ollama emulator (uvicorn)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import httpx
import pytest

from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway


def _lines(response: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


GENERATION_PATHS = ("/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions")


def _generations(emulator: Emulator) -> list:
    """The generation requests the emulator received (not model-list or probe calls)."""
    return [r for r in emulator.state.records if r.path in GENERATION_PATHS]


def _post(gw: Gateway, path: str, body: dict, **kwargs) -> httpx.Response:
    kwargs.setdefault("headers", gw.headers())
    kwargs.setdefault("timeout", 30)
    return httpx.post(f"{gw.url}{path}", json=body, **kwargs)


def test_generate_streams_ollama_ndjson_with_final_metrics(gateway: Gateway, emulator: Emulator):
    emulator.config.tokens = 8
    response = _post(gateway, "/v1/generate", {"model": "llama3.2", "prompt": "hi"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.headers["x-request-id"]
    lines = _lines(response)
    assert len(lines) == 9
    assert all(not line["done"] for line in lines[:-1])
    final = lines[-1]
    assert final["done"] is True
    assert final["done_reason"] == "stop"
    assert final["eval_count"] == 8
    assert final["eval_duration"] > 0
    assert "".join(line["response"] for line in lines[:-1]).strip()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_stream_is_relayed_as_each_line_arrives(gateway: Gateway, emulator: Emulator):
    """F-01: 20 tokens 250 ms apart reach the client spread out, the first within ~300 ms."""
    emulator.config.tokens = 20
    emulator.config.ttft = 0.05
    emulator.config.inter_token = 0.25
    arrivals = []
    start = time.perf_counter()
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/chat",
        json={"model": "qwen2.5:7b", "messages": [{"role": "user", "content": "hi"}]},
        headers=gateway.headers(),
        timeout=30,
    ) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        assert response.headers.get("transfer-encoding") == "chunked"
        for line in response.iter_lines():
            if line:
                arrivals.append(time.perf_counter() - start)
    assert len(arrivals) == 21
    assert arrivals[0] < 0.3
    assert arrivals[-1] - arrivals[0] >= 4.0


def test_non_streaming_generate_returns_one_aggregated_object(gateway: Gateway, emulator: Emulator):
    emulator.config.tokens = 5
    response = _post(gateway, "/v1/generate", {"model": "llama3.2", "prompt": "x", "stream": False})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["done"] is True
    assert body["eval_count"] == 5
    assert body["response"].split() == [f"tok{i}" for i in range(5)] or body["response"].strip()
    assert "prompt_eval_count" in body


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_non_streaming_chat_aggregates_message_content(gateway: Gateway, emulator: Emulator):
    emulator.config.tokens = 4
    body = {"model": "llama3.2", "messages": [{"role": "user", "content": "x"}], "stream": False}
    result = _post(gateway, "/v1/chat", body).json()
    assert result["message"]["role"] == "assistant"
    assert result["message"]["content"].strip()
    assert result["eval_count"] == 4


def test_thinking_chunks_are_relayed_and_counted(gateway: Gateway, emulator: Emulator):
    emulator.config.tokens = 3
    emulator.config.thinking_tokens = 2
    lines = _lines(_post(gateway, "/v1/generate", {"model": "llama3.2", "prompt": "x"}))
    assert [bool(line.get("thinking")) for line in lines[:2]] == [True, True]
    metrics = gateway.metrics_text()
    assert metric_value(metrics, "gateway_time_to_first_token_seconds_count") == 1


@pytest.mark.parametrize(
    "header",
    [
        {"Authorization": "Bearer gw_000000000000_nope"},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"X-API-Key": "gw_abcdefabcdef_wrong"},
        {},
    ],
)
def test_bad_or_missing_keys_get_401_with_bearer_challenge(
    gateway: Gateway, emulator: Emulator, header
):
    response = _post(gateway, "/v1/generate", {"model": "llama3.2", "prompt": "x"}, headers=header)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert isinstance(response.json()["error"], str)
    assert _generations(emulator) == []


def test_x_api_key_header_is_accepted(gateway: Gateway):
    response = _post(
        gateway,
        "/v1/generate",
        {"model": "llama3.2", "prompt": "x", "stream": False},
        headers={"X-API-Key": gateway.key},
    )
    assert response.status_code == 200


def test_revoked_key_is_rejected_at_once_without_the_key_cache(make_gateway):
    gateway = make_gateway(key_cache_seconds=0)
    key_id, key = gateway.create_key("short-lived")
    body = {"model": "llama3.2", "prompt": "x", "stream": False}
    assert _post(gateway, "/v1/generate", body, headers=gateway.headers(key)).status_code == 200
    gateway.revoke(key_id)
    response = _post(gateway, "/v1/generate", body, headers=gateway.headers(key))
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_revocation_reaches_every_replica_within_the_key_cache_bound(make_gateway):
    # F-27: two replicas share one key store; a key revoked there is refused by both within
    # GATEWAY_KEY_CACHE_SECONDS, though both had it cached.
    bound = 0.5
    first = make_gateway(key_cache_seconds=bound)
    second = make_gateway(key_cache_seconds=bound, database_url=first.database_url)
    body = {"model": "llama3.2", "prompt": "x", "stream": False}
    for replica in (first, second):
        assert _post(replica, "/v1/generate", body, headers=first.headers()).status_code == 200
    first.revoke(first.key_id)
    time.sleep(bound + 0.05)
    for replica in (first, second):
        response = _post(replica, "/v1/generate", body, headers=first.headers())
        assert response.status_code == 401
        assert "revoked" in response.json()["error"]


def test_expired_key_is_rejected(gateway: Gateway):
    from datetime import UTC, datetime, timedelta

    _, key = gateway.create_key("old", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    body = {"model": "llama3.2", "prompt": "x", "stream": False}
    response = _post(gateway, "/v1/generate", body, headers=gateway.headers(key))
    assert response.status_code == 401
    assert "expired" in response.json()["error"]


def test_model_outside_the_allow_list_gets_403(gateway: Gateway, emulator: Emulator):
    _, key = gateway.create_key("restricted", models=["qwen2.5:7b"])
    body = {"model": "llama3.2", "prompt": "x", "stream": False}
    response = _post(gateway, "/v1/generate", body, headers=gateway.headers(key))
    assert response.status_code == 403
    assert "llama3.2" in response.json()["error"]
    allowed = _post(
        gateway, "/v1/generate", {**body, "model": "qwen2.5:7b"}, headers=gateway.headers(key)
    )
    assert allowed.status_code == 200
    assert len(_generations(emulator)) == 1


def test_models_lists_only_what_the_key_may_use(gateway: Gateway):
    everything = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers()).json()
    assert everything["object"] == "list"
    assert {m["id"] for m in everything["data"]} == {"llama3.2:latest", "qwen2.5:7b"}
    assert all(m["object"] == "model" for m in everything["data"])
    _, key = gateway.create_key("one-model", models=["llama3.2"])
    limited = httpx.get(f"{gateway.url}/v1/models", headers=gateway.headers(key)).json()
    assert [m["id"] for m in limited["data"]] == ["llama3.2:latest"]


def test_credentials_and_origin_never_reach_the_upstream(gateway: Gateway, emulator: Emulator):
    """F-30 and F-34: only a local Host and no client credential reach Ollama."""
    headers = {
        **gateway.headers(),
        "X-API-Key": gateway.key,
        "Cookie": "session=secret",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "Origin": "https://evil.example.com",
        "Host": "gateway.public.example.com",
    }
    body = {"model": "llama3.2", "prompt": "x", "stream": False}
    response = _post(gateway, "/v1/generate", body, headers=headers)
    assert response.status_code == 200
    [record] = _generations(emulator)
    for name in ("authorization", "x-api-key", "cookie", "proxy-authorization", "origin"):
        assert name not in record.headers
    assert record.headers["host"] == emulator.url.removeprefix("http://")
    assert gateway.key not in json.dumps(record.headers)


def test_configured_upstream_credential_is_sent(make_gateway, emulator: Emulator):
    gw = make_gateway(upstream_api_key="upstream-secret")
    _post(gw, "/v1/generate", {"model": "llama3.2", "prompt": "x", "stream": False})
    # The generation reached the emulator: `all` over no records would pass on nothing.
    assert [r.path for r in emulator.state.records if r.path == "/api/generate"]
    assert all(
        r.headers["authorization"] == "Bearer upstream-secret" for r in emulator.state.records
    )


def test_upstream_host_gate_403_becomes_a_clear_502(make_gateway, emulator: Emulator):
    gw = make_gateway(upstream_host_header="gateway.example.com")
    response = _post(gw, "/v1/generate", {"model": "llama3.2", "prompt": "x"})
    assert response.status_code == 502
    assert "refused" in response.json()["error"]


def test_unknown_model_404_passes_through(gateway: Gateway):
    response = _post(gateway, "/v1/generate", {"model": "nope:1b", "prompt": "x"})
    assert response.status_code == 404
    assert response.json() == {"error": "model 'nope:1b' not found"}


@pytest.mark.parametrize(
    ("fault", "status", "retry_after"),
    [("status_before", 502, False), ("busy", 503, True)],
)
def test_upstream_error_before_first_byte_gets_a_real_status(
    gateway: Gateway, emulator: Emulator, fault, status, retry_after
):
    emulator.config.fault = fault
    response = _post(gateway, "/v1/generate", {"model": "llama3.2", "prompt": "x"})
    assert response.status_code == status
    assert isinstance(response.json()["error"], str)
    assert ("retry-after" in response.headers) is retry_after


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize(
    "fault", ["error_midstream", "drop_midstream", "eof_without_done", "malformed"]
)
def test_failure_after_first_byte_ends_with_one_error_line(
    gateway: Gateway, emulator: Emulator, fault
):
    """F-04: the lines sent so far, then one `{"error": ...}` line, no `done`, no replay."""
    emulator.config.fault = fault
    emulator.config.fault_after = 5
    response = _post(gateway, "/v1/generate", {"model": "llama3.2", "prompt": "x"})
    assert response.status_code == 200
    lines = _lines(response)
    assert len(lines) == 6
    assert all("response" in line and not line["done"] for line in lines[:5])
    assert set(lines[-1]) == {"error"}
    assert not any(line.get("done") for line in lines)
    assert len(_generations(emulator)) == 1
    metrics = gateway.metrics_text()
    assert metric_value(metrics, "gateway_requests_total", outcome="upstream_error") == 1
    assert metric_value(metrics, "gateway_output_tokens_total") == 5


def test_failure_mid_answer_without_streaming_gets_502(gateway: Gateway, emulator: Emulator):
    emulator.config.fault = "drop_midstream"
    response = _post(gateway, "/v1/generate", {"model": "llama3.2", "prompt": "x", "stream": False})
    assert response.status_code == 502
    assert "error" in response.json()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_upstream_down_gets_502(make_gateway):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gw = make_gateway(upstream_url=f"http://127.0.0.1:{port}")
    response = _post(gw, "/v1/generate", {"model": "llama3.2", "prompt": "x"})
    assert response.status_code == 502
    assert response.json() == {"error": "upstream is unreachable"}
    assert httpx.get(f"{gw.url}/readyz").status_code == 503
    assert httpx.get(f"{gw.url}/healthz").status_code == 200


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_silent_upstream_gets_504_after_the_first_byte_timeout(make_gateway, emulator: Emulator):
    """F-07: a hang before headers gives 504 after the first-byte timeout; upstream closed."""
    gw = make_gateway(first_byte_timeout=1.0)
    emulator.config.fault = "hang_before"
    start = time.perf_counter()
    response = _post(gw, "/v1/generate", {"model": "llama3.2", "prompt": "x"})
    elapsed = time.perf_counter() - start
    assert response.status_code == 504
    assert 0.9 < elapsed < 3
    [record] = _generations(emulator)
    assert record.wait_ended(2.0)
    assert record.outcome == "client_disconnect"


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_idle_timeout_mid_stream_ends_with_an_error_line(make_gateway, emulator: Emulator):
    gw = make_gateway(idle_timeout=0.5)
    emulator.config.fault = "hang_midstream"
    emulator.config.fault_after = 3
    start = time.perf_counter()
    lines = _lines(_post(gw, "/v1/generate", {"model": "llama3.2", "prompt": "x"}))
    # The relay's own deadline ends it, well before the transport's read-timeout backstop
    # (the larger of the first-byte and idle timeouts: 10 s here).
    assert time.perf_counter() - start < 5
    assert len(lines) == 4
    assert "0.5" in lines[-1]["error"]
    assert metric_value(gw.metrics_text(), "gateway_requests_total", outcome="timeout") == 1


def _wait_in_flight_zero(gw: Gateway) -> float:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        value = metric_value(gw.metrics_text(), "gateway_requests_in_flight")
        if value == 0:
            return value
        time.sleep(0.05)
    return value


def test_client_leaving_mid_stream_closes_the_upstream_request(
    gateway: Gateway, emulator: Emulator
):
    """F-13 (c)."""
    emulator.config.tokens = 200
    emulator.config.inter_token = 0.05
    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/generate",
        json={"model": "llama3.2", "prompt": "x"},
        headers=gateway.headers(),
        timeout=10,
    ) as response:
        for _ in response.iter_lines():
            # while it streams, the answer holds one pooled upstream connection
            held = metric_value(gateway.metrics_text(), "gateway_upstream_connections_in_use")
            break
    assert held == 1
    [record] = _generations(emulator)
    assert record.wait_ended(1.0)
    assert record.outcome == "client_disconnect"
    assert _wait_in_flight_zero(gateway) == 0
    metrics = gateway.metrics_text()
    assert metric_value(metrics, "gateway_requests_total", outcome="client_disconnect") == 1
    assert metric_value(metrics, "gateway_upstream_connections_in_use") == 0  # given back


def test_client_leaving_with_a_request_pipelined_behind_its_stream_closes_the_upstream_request(
    gateway: Gateway, emulator: Emulator
):
    """uvicorn tells only the connection's latest request that its client left: the stream
    ahead of a pipelined request must learn it too (the door tells every request's cycle)."""
    emulator.config.tokens = 2000
    emulator.config.inter_token = 0.05  # 100 s of answer: only the client's leaving ends it
    body = json.dumps({"model": "llama3.2", "prompt": "x"}).encode()
    head = (
        f"POST /api/generate HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {gateway.key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as client:
        client.sendall(head + body + head + body)  # the second waits behind the first's stream
        received = b""
        while b'"response"' not in received:
            received += client.recv(65536)
    [record, *_] = _generations(emulator)
    assert record.wait_ended(10.0)
    assert record.outcome == "client_disconnect"
    assert _wait_in_flight_zero(gateway) == 0
    metrics = gateway.metrics_text()
    assert metric_value(metrics, "gateway_requests_total", outcome="client_disconnect") == 1
    assert metric_value(metrics, "gateway_upstream_connections_in_use") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("stream", [True, False])
def test_client_leaving_before_the_first_byte_closes_the_upstream_request(
    gateway: Gateway, emulator: Emulator, stream
):
    """F-13 (a) and (b): the client times out while the upstream is still silent."""
    emulator.config.ttft = 30
    with pytest.raises(httpx.ReadTimeout):
        _post(
            gateway,
            "/v1/generate",
            {"model": "llama3.2", "prompt": "x", "stream": stream},
            timeout=0.5,
        )
    [record] = _generations(emulator)
    assert record.wait_ended(1.5)
    assert record.outcome == "client_disconnect"
    assert _wait_in_flight_zero(gateway) == 0


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b'{"model": "llama3.2", "prompt": "x"', 400),
        (b"", 400),
        (b"\xff\xfe{}", 400),
        (b'{"model": "llama3.2", "prompt": NaN}', 400),
        (b"[" * 100_000 + b"]" * 100_000, 400),
        (b'["model"]', 422),
        (b'{"prompt": "x"}', 422),
        (b'{"model": 7, "prompt": "x"}', 422),
        (b'{"model": "llama3.2", "stream": "yes"}', 422),
        (b'{"model": "llama3.2", "options": []}', 422),
    ],
)
def test_malformed_bodies_get_a_clear_error_and_no_upstream_call(
    gateway: Gateway, emulator: Emulator, content, status
):
    """F-36."""
    response = httpx.post(
        f"{gateway.url}/v1/generate",
        content=content,
        headers={**gateway.headers(), "content-type": "application/json"},
    )
    assert response.status_code == status
    assert isinstance(response.json()["error"], str)
    assert _generations(emulator) == []


def test_oversized_body_gets_413(make_gateway, emulator: Emulator):
    gw = make_gateway(max_body_bytes=2048)
    body = {"model": "llama3.2", "prompt": "x" * 4096}
    response = _post(gw, "/v1/generate", body)
    assert response.status_code == 413
    assert "error" in response.json()
    assert _generations(emulator) == []


def test_unknown_route_gets_404_in_ollama_shape(gateway: Gateway):
    response = httpx.get(f"{gateway.url}/v1/nothing", headers=gateway.headers())
    assert response.status_code == 404
    assert "error" in response.json()


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_metrics_record_ttft_and_decode_rate(gateway: Gateway, emulator: Emulator):
    emulator.config.tokens = 10
    emulator.config.ttft = 0.2
    emulator.config.inter_token = 0.02
    _post(gateway, "/v1/generate", {"model": "llama3.2", "prompt": "x"})
    text = gateway.metrics_text()
    count = metric_value(text, "gateway_time_to_first_token_seconds_count", model="llama3.2:latest")
    ttft_sum = metric_value(
        text, "gateway_time_to_first_token_seconds_sum", model="llama3.2:latest"
    )
    assert count == 1
    assert 0.19 < ttft_sum < 0.3
    rate_sum = metric_value(text, "gateway_output_tokens_per_second_sum", model="llama3.2:latest")
    assert 40 < rate_sum < 60  # 10 tokens over ~0.2 s of decode, as the emulator reports
    assert metric_value(text, "gateway_output_tokens_total", key="test-key") == 10
    assert metric_value(text, "gateway_requests_total", outcome="completed") == 1


def test_unknown_models_share_one_metrics_label(gateway: Gateway):
    for i in range(5):
        _post(gateway, "/v1/generate", {"model": f"junk-{i}", "prompt": "x"})
    text = gateway.metrics_text()
    assert "junk-" not in text
    assert metric_value(text, "gateway_requests_total", model="other") == 5


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_rejected_requests_are_counted_with_bounded_labels(gateway: Gateway):
    """F-18: bad keys, junk paths and bad bodies add a bounded set of series, no secrets."""
    for i in range(20):
        httpx.post(f"{gateway.url}/v1/generate", headers={"Authorization": f"Bearer gw_{i}_s"})
        httpx.get(f"{gateway.url}/v1/junk-{i}", headers=gateway.headers())
        _post(gateway, "/v1/generate", {"model": f"m{i}", "stream": "x"})
    text = gateway.metrics_text()
    assert metric_value(text, "gateway_requests_total", outcome="rejected_auth") == 20
    assert metric_value(text, "gateway_requests_total", outcome="bad_request") == 20
    assert metric_value(text, "gateway_requests_total", outcome="not_found") == 20
    series = [line for line in text.splitlines() if line.startswith("gateway_requests_total")]
    assert len(series) == 3
    assert "junk" not in text
    assert gateway.key not in text


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("dialect", ["ollama", "openai"])
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("chunked", [False, True])
def test_upstream_connections_are_reused(
    make_gateway, emulator: Emulator, dialect, stream, chunked
):
    """The body is read to its end after the final chunk, so the connection is kept; also
    when the whole answer comes in the first read and the chunked body's end comes later."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    def answer(body: str, media_type: str) -> Response:
        if not chunked:
            return Response(body, media_type=media_type)

        async def pieces():
            yield body.encode()
            await asyncio.sleep(0.05)  # the terminating chunk comes in a later read

        return StreamingResponse(pieces(), media_type=media_type)

    from gateway.testing.server import LoopbackServer

    ports: list[int] = []

    async def generate(request):
        ports.append(request.client.port)
        if dialect == "ollama":
            lines = [{"response": "a", "done": False}, {"response": "", "done": True}]
            body = "".join(json.dumps(line) + "\n" for line in lines)
            return answer(body, "application/x-ndjson")
        events = [{"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]}, "[DONE]"]
        body = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)
        return answer(body, "text/event-stream")

    async def listing(_):
        return JSONResponse({"models": [], "data": []})

    path = "/api/generate" if dialect == "ollama" else "/v1/chat/completions"
    app = Starlette(
        routes=[
            Route(path, generate, methods=["POST"]),
            Route("/api/tags", listing),
            Route("/v1/models", listing),
            Route("/api/version", listing),
        ]
    )
    with LoopbackServer(app) as upstream:
        gw = make_gateway(upstream_url=upstream.url, upstream_dialect=dialect)
        for _ in range(5):
            response = _post(gw, "/v1/generate", {"model": "m", "prompt": "x", "stream": stream})
            assert response.status_code == 200
    assert len(ports) == 5
    assert len(set(ports)) == 1, ports


@pytest.mark.slow  # seconds on 2 cores (--durations of the fast tier)
def test_a_client_that_stops_reading_loses_its_stream_after_the_idle_timeout(
    make_gateway: Callable[..., Gateway], emulator: Emulator
):
    """Backpressure: flow control holds the relay's write; after GATEWAY_IDLE_TIMEOUT the
    stream is closed and its slot, connection and in-flight count are given back."""
    # The emulator makes each token as it sends it (it used to build the whole answer before
    # the first byte: 2,000,000 tokens took over 10 s on a loaded machine, an upstream timeout
    # instead of a client one). 300,000 lines (about 30 MB) fill every socket buffer between
    # the gateway and a client reading nothing.
    gw = make_gateway(idle_timeout=1.0, upstream_max_concurrent=1)
    emulator.config.tokens = 300_000
    emulator.config.inter_token = 0
    sink = socket.socket()
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sink.connect(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])))
    body = b'{"model": "llama3.2", "prompt": "x"}'
    sink.sendall(
        b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {gw.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )  # and never read
    try:
        deadline = time.monotonic() + 15  # generous: a loaded machine is slow, never wrong
        while not _generations(emulator) and time.monotonic() < deadline:
            time.sleep(0.05)
        [record] = _generations(emulator)
        assert record.wait_ended(30)  # the upstream request was closed
        assert record.outcome == "client_disconnect"
        assert _wait_in_flight_zero(gw) == 0
        metrics = gw.metrics_text()
        assert metric_value(metrics, "gateway_upstream_slots_in_use") == 0
        assert metric_value(metrics, "gateway_requests_total", outcome="client_disconnect") == 1
        # The slot is free again: another client is served.
        emulator.config.tokens = 3
        answer = _post(gw, "/v1/generate", {"model": "llama3.2", "prompt": "x", "stream": False})
        assert answer.status_code == 200
    finally:
        sink.close()
