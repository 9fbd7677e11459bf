"""OpenTelemetry traces (gateway.tracing): spans of a real gateway in front of the emulator.

The gateway runs in-process (`make_gateway`), so its spans go to the SDK's
`InMemorySpanExporter` through the real `BatchSpanProcessor` (its delay shortened to 10 ms);
one test exports over OTLP/HTTP to an in-process receiver that decodes the protobuf request.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GEN_AI
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as GEN_AI_METRICS
from opentelemetry.semconv.attributes import error_attributes as ERROR
from opentelemetry.semconv.attributes import http_attributes as HTTP
from opentelemetry.semconv.attributes import network_attributes as NETWORK
from opentelemetry.semconv.attributes import server_attributes as SERVER
from opentelemetry.semconv.attributes import url_attributes as URL
from opentelemetry.trace import SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.app import create_app
from gateway.context import RequestContext
from gateway.settings import Settings
from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from gateway.tracing import spans as tracing_spans
from gateway.tracing.middleware import end_server
from gateway.tracing.provider import open_tracing, tracing_endpoint
from tests.support.client import MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway, store_key

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
PROMPT = "the secret prompt text"


@pytest.fixture(autouse=True)
def _fast_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # The BatchSpanProcessor reads its delay when the app builds it: spans arrive in ~10 ms.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)


def wait_spans(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    deadline = time.monotonic() + 5
    while len(spans := exporter.get_finished_spans()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(spans) == count, [span.name for span in spans]
    return list(spans)


def by_kind(spans: list[ReadableSpan], kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in spans if span.kind == kind]


def all_values(spans: list[ReadableSpan]) -> str:
    return repr([(dict(span.attributes or {}), span.name, span.events) for span in spans])


CHAT = GEN_AI.GenAiOperationNameValues.CHAT.value
CASES = [
    ("/api/chat", {"messages": [{"role": "user", "content": PROMPT}]}, CHAT, "/api/chat"),
    (
        "/api/generate",
        {"prompt": PROMPT},
        GEN_AI.GenAiOperationNameValues.TEXT_COMPLETION.value,
        "/api/generate",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": PROMPT}], "stream": True},
        CHAT,
        "/v1/chat/completions",
    ),
]


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize(("path", "body", "operation", "route"), CASES)
def test_request_span_follows_the_http_and_genai_conventions(
    make_gateway: Callable[..., Gateway],
    emulator: Emulator,
    path: str,
    body: dict[str, object],
    operation: str,
    route: str,
) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter)
    body = {"model": MODEL, "temperature": 0.25, "max_tokens": 64, **body}
    if path.startswith("/api"):
        body = {"model": MODEL, "options": {"temperature": 0.25, "num_predict": 64}, **body}
        del body["temperature"], body["max_tokens"]
    headers = {**gateway.headers(), "traceparent": TRACEPARENT}
    response = httpx.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=10)
    assert response.status_code == 200
    metrics = gateway.metrics_text()

    spans = wait_spans(exporter, 2)
    (server,) = by_kind(spans, SpanKind.SERVER)
    (client,) = by_kind(spans, SpanKind.CLIENT)
    # The client's trace goes on: same trace id, the SERVER span is the child of its span.
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert server.parent is not None
    assert f"{server.parent.span_id:016x}" == PARENT_ID
    assert client.context.trace_id == server.context.trace_id
    assert client.parent is not None
    assert client.parent.span_id == server.context.span_id

    assert server.name == f"POST {route}"
    assert server.status.status_code == StatusCode.UNSET
    # Names from the conventions' own package (HTTP stable, GenAI incubating), not our strings.
    assert dict(server.attributes or {}) == {
        HTTP.HTTP_REQUEST_METHOD: "POST",
        URL.URL_PATH: path,
        URL.URL_SCHEME: "http",
        NETWORK.NETWORK_PROTOCOL_VERSION: "1.1",
        HTTP.HTTP_ROUTE: route,
        HTTP.HTTP_RESPONSE_STATUS_CODE: 200,
        "gateway.request_id": response.headers["x-request-id"],
        "gateway.key_id": gateway.key_id,
        "gateway.outcome": "completed",
    }

    assert client.name == f"{operation} {MODEL}"
    attributes = dict(client.attributes or {})
    ttft = attributes.pop(GEN_AI_METRICS.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)
    tpot = attributes.pop(GEN_AI_METRICS.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN)
    ttfc = attributes.pop(GEN_AI.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK)
    assert attributes == {
        GEN_AI.GEN_AI_OPERATION_NAME: operation,
        GEN_AI.GEN_AI_PROVIDER_NAME: "ollama",
        GEN_AI.GEN_AI_REQUEST_MODEL: MODEL,
        GEN_AI.GEN_AI_REQUEST_MAX_TOKENS: 64,
        GEN_AI.GEN_AI_REQUEST_TEMPERATURE: 0.25,
        SERVER.SERVER_ADDRESS: "127.0.0.1",
        SERVER.SERVER_PORT: int(emulator.url.rsplit(":", 1)[1]),
        "gateway.route.reason": "only",  # one upstream: no choice to make
        GEN_AI.GEN_AI_USAGE_INPUT_TOKENS: emulator.config.prompt_eval_count,
        GEN_AI.GEN_AI_USAGE_OUTPUT_TOKENS: emulator.config.tokens,
        GEN_AI.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
        GEN_AI.GEN_AI_RESPONSE_MODEL: MODEL,
    }
    # The same numbers as the metrics: each histogram holds this one request.
    assert metric_value(metrics, "gateway_input_tokens_total") == emulator.config.prompt_eval_count
    assert metric_value(metrics, "gateway_output_tokens_total") == emulator.config.tokens
    assert metric_value(metrics, "gateway_time_to_first_token_seconds_count") == 1
    assert ttft == pytest.approx(
        metric_value(metrics, "gateway_time_to_first_token_seconds_sum"), abs=1e-9
    )
    assert emulator.config.ttft <= ttft < 1.0
    assert tpot == pytest.approx(
        metric_value(metrics, "gateway_time_per_output_token_seconds_sum"), abs=1e-9
    )
    # The upstream call's own TTFT: from sending it, so the gateway's queue wait is left out.
    queue_wait = metric_value(metrics, "gateway_queue_wait_seconds_sum")
    assert ttfc == pytest.approx(ttft - queue_wait, abs=1e-9)
    assert emulator.config.ttft <= ttfc < ttft
    assert client.status.status_code == StatusCode.UNSET
    assert PROMPT not in all_values(spans)

    # The upstream hears the CLIENT span as its parent, in the same trace.
    (received,) = [r for r in emulator.state.records if r.method == "POST"]
    assert received.headers["traceparent"] == (f"00-{TRACE_ID}-{client.context.span_id:016x}-01")


def test_a_request_without_traceparent_starts_a_trace(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter)
    body = {"model": MODEL, "prompt": "hi", "stream": False}
    headers = {**gateway.headers(), "traceparent": "00-not-a-valid-header-01"}
    assert httpx.post(f"{gateway.url}/api/generate", json=body, headers=headers).status_code == 200
    server, client = sorted(wait_spans(exporter, 2), key=lambda span: span.kind.value)
    assert server.kind == SpanKind.SERVER
    assert server.parent is None  # a malformed traceparent is ignored, not trusted
    assert client.parent is not None
    assert client.parent.span_id == server.context.span_id
    (received,) = [r for r in emulator.state.records if r.method == "POST"]
    assert received.headers["traceparent"].split("-")[1] == f"{server.context.trace_id:032x}"


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_client_cannot_turn_its_trace_off_or_fork_it(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    """A `-00` (not sampled) traceparent is still traced (the gateway samples what it
    serves); two traceparent lines are no parent; repeated tracestate lines are one list."""
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter)
    body = {"model": MODEL, "prompt": "hi", "stream": False}
    unsampled = {**gateway.headers(), "traceparent": TRACEPARENT[:-2] + "00"}
    assert httpx.post(f"{gateway.url}/api/generate", json=body, headers=unsampled).is_success
    server = by_kind(wait_spans(exporter, 2), SpanKind.SERVER)[0]
    assert f"{server.context.trace_id:032x}" == TRACE_ID  # still the client's trace
    exporter.clear()
    other = "00-" + "e" * 32 + "-" + "1" * 16 + "-01"
    headers = [
        *gateway.headers().items(),
        ("traceparent", TRACEPARENT),
        ("traceparent", other),
        ("tracestate", "a=1"),
        ("tracestate", "b=2"),
    ]
    assert httpx.post(f"{gateway.url}/api/generate", json=body, headers=headers).is_success
    server = by_kind(wait_spans(exporter, 2), SpanKind.SERVER)[0]
    assert server.parent is None  # neither of the two is trusted
    assert f"{server.context.trace_id:032x}" not in (TRACE_ID, "e" * 32)
    exporter.clear()
    headers = [*headers[:-3], ("tracestate", "a=1"), ("tracestate", "b=2")]
    assert httpx.post(f"{gateway.url}/api/generate", json=body, headers=headers).is_success
    server = by_kind(wait_spans(exporter, 2), SpanKind.SERVER)[0]
    assert server.context.trace_state.to_header() == "a=1,b=2"


def test_a_long_path_is_cut_in_the_span(make_gateway: Callable[..., Gateway]) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter)
    httpx.get(f"{gateway.url}/v1/{'x' * 3000}", headers=gateway.headers())
    (server,) = wait_spans(exporter, 1)
    assert server.attributes is not None
    assert len(str(server.attributes["url.path"])) == 1024


def test_an_upstream_500_marks_both_spans_as_errors(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter, retry_attempts=1)
    emulator.config.fault = "status_before"
    emulator.config.fault_status = 500
    body = {"model": MODEL, "prompt": "hi"}
    response = httpx.post(f"{gateway.url}/api/generate", json=body, headers=gateway.headers())
    assert response.status_code >= 500

    spans = wait_spans(exporter, 2)
    (server,) = by_kind(spans, SpanKind.SERVER)
    (client,) = by_kind(spans, SpanKind.CLIENT)
    assert client.status.status_code == StatusCode.ERROR
    assert client.attributes is not None
    assert client.attributes["error.type"] == "upstream_error"
    assert client.attributes["http.response.status_code"] == 500
    assert "gen_ai.usage.output_tokens" not in client.attributes
    assert server.status.status_code == StatusCode.ERROR
    assert server.attributes is not None
    assert server.attributes["error.type"] == str(response.status_code)
    assert server.attributes["http.response.status_code"] == response.status_code


def test_a_stream_broken_midway_ends_the_client_span_with_its_tokens(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter)
    emulator.config.fault = "error_midstream"
    body = {"model": MODEL, "prompt": "hi"}
    response = httpx.post(f"{gateway.url}/api/generate", json=body, headers=gateway.headers())
    assert response.status_code == 200  # the status went out with the first token
    (client,) = by_kind(wait_spans(exporter, 2), SpanKind.CLIENT)
    assert client.status.status_code == StatusCode.ERROR
    assert client.attributes is not None
    assert client.attributes["error.type"] == "upstream_error"
    assert client.attributes["gen_ai.usage.output_tokens"] == emulator.config.fault_after
    assert "gen_ai.server.time_to_first_token" in client.attributes


@pytest.mark.parametrize("stream", [False, True])
def test_content_capture_puts_the_prompt_and_answer_on_the_client_span(
    make_gateway: Callable[..., Gateway], emulator: Emulator, stream: bool
) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter, otel_capture_content=True)
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": stream}
    assert httpx.post(f"{gateway.url}/api/chat", json=body, headers=gateway.headers()).is_success
    (client,) = by_kind(wait_spans(exporter, 2), SpanKind.CLIENT)
    assert client.attributes is not None
    assert client.attributes["gen_ai.input.messages"] == (
        '[{"role": "user", "parts": [{"type": "text", "content": "the secret prompt text"}]}]'
    )
    answer = "".join(f"tok{i} " for i in range(emulator.config.tokens))
    assert json.loads(str(client.attributes[GEN_AI.GEN_AI_OUTPUT_MESSAGES])) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": answer}],
            "finish_reason": "stop",
        }
    ]


def test_probes_and_metrics_have_no_spans(make_gateway: Callable[..., Gateway]) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter)
    for path in ("/metrics", "/healthz", "/readyz"):
        httpx.get(f"{gateway.url}{path}")
    assert httpx.get(f"{gateway.url}/api/tags", headers=gateway.headers()).is_success
    (span,) = wait_spans(exporter, 1)
    assert span.name == "GET /api/tags"


def test_tracing_off_forwards_no_traceparent(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    gateway = make_gateway()
    headers = {**gateway.headers(), "traceparent": TRACEPARENT}
    body = {"model": MODEL, "prompt": "hi", "stream": False}
    assert httpx.post(f"{gateway.url}/api/generate", json=body, headers=headers).is_success
    (received,) = [r for r in emulator.state.records if r.method == "POST"]
    assert "traceparent" not in received.headers


@pytest.mark.processes
def test_tracing_off_imports_no_sdk() -> None:
    # A process of its own: other tests here import the SDK.
    code = (
        "import sys; from gateway.app import create_app; from gateway.settings import Settings;"
        "create_app(Settings()); "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.sdk')], 'sdk'"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    result = subprocess.run(  # noqa: S603 - our own interpreter and code
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("setting", "environ", "expected"),
    [
        (None, {}, None),
        ("http://collector:4318", {}, "http://collector:4318/v1/traces"),
        ("http://collector:4318/", {}, "http://collector:4318/v1/traces"),
        ("http://c:4318/v1/traces", {}, "http://c:4318/v1/traces"),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ""),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ""),
        ("http://c:4318", {"OTEL_SDK_DISABLED": "true"}, None),
        ("http://c:4318", {"OTEL_TRACES_EXPORTER": "none"}, None),
        ("http://c:4318", {"OTEL_SDK_DISABLED": "false"}, "http://c:4318/v1/traces"),
    ],
)
def test_tracing_is_on_only_with_an_endpoint(
    setting: str | None, environ: dict[str, str], expected: str | None
) -> None:
    settings = Settings(otel_exporter_otlp_endpoint=setting)
    assert tracing_endpoint(settings, environ) == expected
    if expected is None:
        assert open_tracing(settings, environ) is None


def test_spans_reach_an_otlp_http_collector(
    make_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    received: list[ExportTraceServiceRequest] = []

    async def export(request: Request) -> Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.body())
        received.append(message)
        return Response(b"", media_type="application/x-protobuf")

    collector = Starlette(routes=[Route("/v1/traces", export, methods=["POST"])])
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    with LoopbackServer(collector) as server:
        gateway = make_gateway(otel_exporter_otlp_endpoint=server.url)
        body = {"model": MODEL, "prompt": "hi", "stream": False}
        response = httpx.post(f"{gateway.url}/api/generate", json=body, headers=gateway.headers())
        assert response.is_success
        deadline = time.monotonic() + 5
        while sum(_count(m) for m in received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    spans = [
        (span.name, span.kind, resource.resource)
        for message in received
        for resource in message.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    assert sorted(name for name, _, _ in spans) == [
        "POST /api/generate",
        f"text_completion {MODEL}",
    ]
    resource = {a.key: a.value.string_value for a in spans[0][2].attributes}
    assert resource["service.name"] == "llm-gateway"
    assert resource["deployment.environment"] == "test"


def _count(message: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for r in message.resource_spans for scope in r.scope_spans)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_collector_that_is_down_holds_the_shutdown_only_briefly(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing_spans, "SHUTDOWN_SECONDS", 0.5)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    database_url = f"sqlite+aiosqlite:///{tmp_path}/keys.db"
    _, key = asyncio.run(store_key(database_url, "test-key"))
    settings = Settings(
        upstream_url=emulator.url,
        database_url=database_url,
        otel_exporter_otlp_endpoint=f"http://127.0.0.1:{port}",
    )
    server = LoopbackServer(create_app(settings))
    server.start()
    try:
        body = {"model": MODEL, "prompt": "hi", "stream": False}
        headers = {"Authorization": f"Bearer {key}"}
        assert httpx.post(f"{server.url}/api/generate", json=body, headers=headers).is_success
    finally:
        started = time.monotonic()
        server.stop()
    assert time.monotonic() - started < 0.5 + 1.5


def test_an_openai_dialect_upstream_is_the_openai_provider(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter, upstream_dialect="openai")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{gateway.url}/api/chat", json=body, headers=gateway.headers()).is_success
    (client,) = by_kind(wait_spans(exporter, 2), SpanKind.CLIENT)
    assert client.attributes is not None
    assert (
        client.attributes[GEN_AI.GEN_AI_PROVIDER_NAME]
        == GEN_AI.GenAiProviderNameValues.OPENAI.value
    )
    assert client.attributes[GEN_AI.GEN_AI_RESPONSE_MODEL] == MODEL  # from the SSE events
    assert client.attributes["gen_ai.usage.input_tokens"] == emulator.config.prompt_eval_count
    assert client.attributes["gen_ai.usage.output_tokens"] == emulator.config.tokens
    (received,) = [r for r in emulator.state.records if r.method == "POST"]
    assert received.path == "/v1/chat/completions"
    assert received.headers["traceparent"].split("-")[2] == f"{client.context.span_id:016x}"


def test_a_failover_has_one_client_span_per_upstream_tried(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    app = create_emulator_app(EmulatorConfig(fault="busy"))
    with LoopbackServer(app) as other:
        second = Emulator(other.url, app.state.emulator)
        exporter = InMemorySpanExporter()
        gateway = make_gateway(
            span_exporter=exporter,
            upstreams=[{"url": emulator.url}, {"url": second.url}],
            retry_attempts=1,
        )
        emulator.config.fault = "busy"
        body = {"model": MODEL, "prompt": "hi"}
        response = httpx.post(f"{gateway.url}/api/generate", json=body, headers=gateway.headers())
        assert response.status_code == 503
        spans = wait_spans(exporter, 3)
    (server,) = by_kind(spans, SpanKind.SERVER)
    clients = by_kind(spans, SpanKind.CLIENT)
    ports = {int(url.rsplit(":", 1)[1]) for url in (emulator.url, second.url)}
    assert {span.attributes["server.port"] for span in clients if span.attributes} == ports
    reasons = [span.attributes["gateway.route.reason"] for span in clients if span.attributes]
    # The first choice's reason is the default policy's (scored: the term that decided it).
    assert len(reasons) == 2
    assert reasons.count("failover") == 1
    assert {"load", "prefix", "residency", "server", "session", "balance_guard"} & set(reasons)
    for client in clients:
        assert client.parent is not None
        assert client.parent.span_id == server.context.span_id
        assert client.status.status_code == StatusCode.ERROR
        assert client.attributes is not None
        assert client.attributes["http.response.status_code"] == 503
    # Each upstream heard its own attempt's span as the parent.
    sent = {
        record.headers["traceparent"].split("-")[2]
        for upstream in (emulator, second)
        for record in upstream.state.records
        if record.method == "POST"
    }
    assert sent == {f"{span.context.span_id:016x}" for span in clients}


def test_an_embedding_is_an_embeddings_operation(
    make_gateway: Callable[..., Gateway],
) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter)
    body = {"model": MODEL, "input": PROMPT}
    assert httpx.post(f"{gateway.url}/api/embed", json=body, headers=gateway.headers()).is_success
    spans = wait_spans(exporter, 2)
    (client,) = by_kind(spans, SpanKind.CLIENT)
    assert client.name == f"embeddings {MODEL}"
    assert client.attributes is not None
    embeddings = GEN_AI.GenAiOperationNameValues.EMBEDDINGS.value
    assert client.attributes[GEN_AI.GEN_AI_OPERATION_NAME] == embeddings
    assert GEN_AI.GEN_AI_REQUEST_MAX_TOKENS not in client.attributes  # its bound is no choice
    assert PROMPT not in all_values(spans)


def test_a_client_leaving_mid_stream_ends_both_spans(
    make_gateway: Callable[..., Gateway], emulator: Emulator
) -> None:
    exporter = InMemorySpanExporter()
    gateway = make_gateway(span_exporter=exporter)
    emulator.config.tokens = 200
    emulator.config.inter_token = 0.05
    body = {"model": MODEL, "prompt": "hi"}
    url = f"{gateway.url}/api/generate"
    with httpx.stream("POST", url, json=body, headers=gateway.headers(), timeout=10) as response:
        for _ in response.iter_lines():
            break
    spans = wait_spans(exporter, 2)
    (server,) = by_kind(spans, SpanKind.SERVER)
    (client,) = by_kind(spans, SpanKind.CLIENT)
    assert client.attributes is not None
    assert client.attributes[ERROR.ERROR_TYPE] == "client_disconnect"
    assert 1 <= client.attributes[GEN_AI.GEN_AI_USAGE_OUTPUT_TOKENS] < 200
    assert server.attributes is not None
    assert server.attributes["gateway.outcome"] == "client_disconnect"
    assert server.status.status_code == StatusCode.UNSET  # its 200 went out: no server error


def test_a_method_http_does_not_define_is_other() -> None:
    exporter = InMemorySpanExporter()
    traced = open_tracing(Settings(_env_file=None), {}, exporter)
    assert traced is not None
    scope = {"type": "http", "method": "FROB", "path": "/x", "headers": []}
    span = traced.start_server(scope)
    end_server(span, scope, RequestContext(), 405, None)
    traced.provider.shutdown()
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "HTTP"
    assert finished.attributes is not None
    assert finished.attributes[HTTP.HTTP_REQUEST_METHOD] == "_OTHER"
    assert finished.attributes["http.request.method_original"] == "FROB"


def test_a_grpc_protocol_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(_env_file=None, otel_exporter_otlp_endpoint="http://127.0.0.1:4318")
    environ = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with caplog.at_level("WARNING", logger="gateway.tracing"):
        traced = open_tracing(settings, environ)
    assert traced is not None
    traced.provider.shutdown()
    assert "OTEL_EXPORTER_OTLP_PROTOCOL is ignored" in caplog.text


_GLOBAL_PROVIDER_SCRIPT = """
import asyncio, sys, httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
from gateway.app import create_app
from gateway.settings import Settings
settings = Settings(upstream_url="http://127.0.0.1:9", database_url=sys.argv[1])
app = create_app(settings)
async def main():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        status = (await client.get("/healthz")).status_code
    print(status, [span.name for span in exporter.get_finished_spans()])
asyncio.run(main())
"""


@pytest.mark.processes
def test_a_global_tracer_provider_gets_no_spans_from_fastapi_itself(tmp_path: Path) -> None:
    # A process that sets a global provider (`opentelemetry-instrument`, a library) made
    # FastAPI 0.165 trace every request itself ('GET /healthz', 'fastapi.endpoint', ...),
    # beside the gateway's own spans. Its own process: the global provider is set only once.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    database = f"sqlite+aiosqlite:///{tmp_path}/keys.db"
    result = subprocess.run(  # noqa: S603 - this interpreter, a fixed script
        [sys.executable, "-c", _GLOBAL_PROVIDER_SCRIPT, database],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["200", "[]"]
