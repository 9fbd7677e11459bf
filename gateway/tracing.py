"""OpenTelemetry traces, off by default: one SERVER span per request, one CLIENT span per upstream.

On when `GATEWAY_OTEL_EXPORTER_OTLP_ENDPOINT` is set, or the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, unless
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` (`tracing_endpoint`). Off, no SDK is
imported, no tracer provider exists, and the request path only tests `Relay.tracing is None`;
the client's `traceparent` is not forwarded either (`gateway.upstream.headers`), as before
tracing existed.

On, each app has its own SDK `TracerProvider` (never the process-global one, so tests can build
many apps, as with the metrics' per-app registry) with a `BatchSpanProcessor`: spans are
exported by its worker thread over OTLP/HTTP (protobuf), never on the event loop. The lifespan
flushes and shuts it down within `SHUTDOWN_SECONDS`, so a collector that is down cannot hold
the shutdown.

Spans (names and attributes from the OpenTelemetry semantic conventions, HTTP v1.26 stable and
GenAI as of v1.37, `gen_ai.provider.name` replacing `gen_ai.system`):

* SERVER, `{http.request.method} {http.route}`, per HTTP request except `/metrics` and the
  probes (`TracingMiddleware`): `http.request.method` (`_OTHER`, with
  `http.request.method_original`, for a method HTTP does not define; the span is then named
  `HTTP`), `http.route`, `url.path`, `url.scheme`, `network.protocol.version`,
  `http.response.status_code`; `error.type` (the status code, or the type of an exception that
  ended the request after its response started) and status ERROR on a 5xx. Its parent is the
  client's W3C `traceparent` (and `tracestate`) when well-formed. Gateway attributes:
  `gateway.request_id` (the `X-Request-ID`), `gateway.key_id` (the key's public id, never the
  key) and `gateway.outcome` (the `outcome` metrics label).
* CLIENT, `{gen_ai.operation.name} {gen_ai.request.model}`, per upstream the request was sent
  to (a failover makes several; retries on one upstream stay in its span), child of the SERVER
  span; its context goes upstream as `traceparent` (`inject`). `gen_ai.operation.name`
  (`chat`, `text_completion`, `embeddings`), `gen_ai.provider.name` (the upstream's dialect,
  `ollama` or `openai`: the API it speaks, not who runs it), `gen_ai.request.model`,
  `gen_ai.request.max_tokens`, `gen_ai.request.temperature`, `server.address`, `server.port`.
  The upstream that answered adds the request's numbers from its `RequestSummary`:
  `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, and from its final chunk
  `gen_ai.response.finish_reasons` and `gen_ai.response.model`; and three times in seconds.
  The conventions' own span attribute `gen_ai.response.time_to_first_chunk` counts, as they
  define it, from issuing the upstream request (its last try) to the first token.
  `gen_ai.server.time_to_first_token` and `gen_ai.server.time_per_output_token` are named
  after the conventions' server metrics (which Envoy AI Gateway also exports; the conventions
  define no span attribute for them) and carry the values of
  `gateway_time_to_first_token_seconds` and `gateway_time_per_output_token_seconds`: that TTFT
  counts from the request's arrival at the gateway (`gateway.relay.meter`), so the difference
  is the gateway's own time and the wait for the upstream's slot. A failure sets status ERROR,
  `error.type` to the `outcome` label (`upstream_error`, `timeout`, `client_disconnect`, ...;
  docs/metrics.md) and, for an upstream's error answer, `http.response.status_code`.

No prompt or answer text, no header values: only with `GATEWAY_OTEL_CAPTURE_CONTENT=true` does
the CLIENT span carry the request's messages as `gen_ai.input.messages` (JSON, the conventions'
role/parts form), a system prompt as `gen_ai.system_instructions` and the answer's text as
`gen_ai.output.messages`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.neutral import GenerationRequest, RequestSummary
from gateway.routing import OTHER_ROUTE, route_label
from gateway.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from gateway.upstream.pool import Upstream

logger = logging.getLogger("gateway.tracing")

#: Longest wait, in seconds, for the last spans to be exported when the app stops.
SHUTDOWN_SECONDS = 5.0
#: The default `service.name` (`OTEL_SERVICE_NAME` or `GATEWAY_OTEL_SERVICE_NAME` override it).
SERVICE_NAME = "llm-gateway"
#: Scraped and probed every few seconds: their spans would drown the requests' own.
_UNTRACED = frozenset({"/metrics", "/healthz", "/readyz"})
#: `gen_ai.operation.name` of each neutral operation (GenAI conventions' well-known values).
_OPERATIONS = {"chat": "chat", "generate": "text_completion", "embed": "embeddings"}
_PROPAGATED = frozenset({b"traceparent", b"tracestate"})
#: The methods HTTP conventions name as they are; any other is `_OTHER` (bounded span names).
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
#: Most characters of an upstream's error message kept as a span's status (as in the log).
_MESSAGE_CHARS = 200
_FALSY = frozenset({"", "0", "false", "no", "off"})


def tracing_endpoint(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces URL to export to, `""` for the exporter's own default, or None (off).

    `GATEWAY_OTEL_EXPORTER_OTLP_ENDPOINT` is the collector's base URL (`http://collector:4318`);
    `/v1/traces` is appended unless the URL ends with it. Without it, the standard variables turn
    tracing on and the exporter reads them itself (`""`). `OTEL_SDK_DISABLED=true` and
    `OTEL_TRACES_EXPORTER=none` keep it off either way.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() not in _FALSY:
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    base = settings.otel_exporter_otlp_endpoint
    if base:
        base = base.rstrip("/")
        return base if base.endswith("/v1/traces") else f"{base}/v1/traces"
    standard = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return "" if any(environ.get(name) for name in standard) else None


class Tracing:
    """One app's tracer, its provider and the W3C propagator; built only when tracing is on.

    Args:
        provider: The SDK provider (its processor and exporter are set up by `open_tracing`).
        capture_content: Put the prompt on CLIENT spans (`GATEWAY_OTEL_CAPTURE_CONTENT`).
    """

    def __init__(self, provider: TracerProvider, *, capture_content: bool = False) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("gateway")
        self.capture_content = capture_content
        self.propagator = TraceContextTextMapPropagator()

    async def aclose(self) -> None:
        """Export what is pending and stop, in a thread, for at most `SHUTDOWN_SECONDS`."""
        with anyio.move_on_after(SHUTDOWN_SECONDS) as scope:
            await anyio.to_thread.run_sync(self.provider.shutdown, abandon_on_cancel=True)
        if scope.cancelled_caught:
            logger.warning("trace export did not finish within %g s", SHUTDOWN_SECONDS)

    def start_server(self, scope: Scope) -> Span:
        """Start the SERVER span of one HTTP request, child of the client's `traceparent`."""
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in _PROPAGATED
        }
        parent = self.propagator.extract(carrier) if carrier else None
        method = scope["method"]
        attributes = {
            "http.request.method": method if method in _METHODS else "_OTHER",
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        if method not in _METHODS:
            attributes["http.request.method_original"] = method
        return self.tracer.start_span(
            "HTTP" if method not in _METHODS else method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
        )

    def start_upstream(
        self, parent: Span | None, request: GenerationRequest, upstream: Upstream
    ) -> Span:
        """Start the CLIENT span of one upstream attempt (module docstring)."""
        operation = _OPERATIONS.get(request.operation, request.operation)
        url = upstream.spec.url
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": upstream.dialect.name,
            "gen_ai.request.model": request.model,
            "server.address": url.host or "",
            "server.port": url.port or 0,
        }
        if request.max_output_tokens:  # None: not set; 0: embeddings
            attributes["gen_ai.request.max_tokens"] = request.max_output_tokens
        temperature = _temperature(request)
        if temperature is not None:
            attributes["gen_ai.request.temperature"] = temperature
        if self.capture_content:
            attributes.update(_content(request))
        context = None if parent is None else trace.set_span_in_context(parent)
        return self.tracer.start_span(
            f"{operation} {request.model}",
            context=context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )

    def inject(self, span: Span, headers: dict[str, str]) -> dict[str, str]:
        """`headers` plus the `traceparent` (and `tracestate`) naming `span`, in a new dict."""
        carrier = dict(headers)
        self.propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier


def end_upstream_failure(span: Span, error: BaseException) -> None:
    """End an attempt's CLIENT span with the failure that moved the request on (or ended it)."""
    outcome = getattr(error, "outcome", "error")
    status = getattr(error, "upstream_status", None)
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    span.set_attribute("error.type", outcome)
    message = getattr(error, "message", None) or outcome
    span.set_status(Status(StatusCode.ERROR, str(message)[:_MESSAGE_CHARS]))
    span.end()


def end_upstream(
    span: Span,
    summary: RequestSummary,
    *,
    finish_reason: str | None = None,
    response_model: str | None = None,
    answer: str | None = None,
) -> None:
    """End the answering upstream's CLIENT span with the request's numbers (module docstring).

    `answer` is the text relayed, given only with content capture on.
    """
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": summary.tokens_in,
        "gen_ai.usage.output_tokens": summary.tokens_out,
    }
    if finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = (finish_reason,)
    if response_model is not None:
        attributes["gen_ai.response.model"] = response_model
    if answer is not None:
        message = {"role": "assistant", "parts": [{"type": "text", "content": answer}]}
        if finish_reason is not None:
            message["finish_reason"] = finish_reason
        attributes["gen_ai.output.messages"] = json.dumps([message])
    if summary.ttft_s is not None:
        attributes["gen_ai.server.time_to_first_token"] = summary.ttft_s
        if summary.queue_wait_s is not None:  # from sending the upstream request
            attributes["gen_ai.response.time_to_first_chunk"] = (
                summary.ttft_s - summary.queue_wait_s
            )
    if summary.time_per_output_token_s is not None:
        attributes["gen_ai.server.time_per_output_token"] = summary.time_per_output_token_s
    span.set_attributes(attributes)
    if summary.outcome != "completed":
        span.set_attribute("error.type", summary.outcome)
        span.set_status(Status(StatusCode.ERROR, summary.outcome))
    span.end()


class TracingMiddleware:
    """Pure ASGI: one SERVER span per HTTP request (module docstring); added only when on.

    It sits inside `AccessMiddleware`, so the request id is known, and keeps the span in the
    scope's `state` as `span`, where the request's `Generation` finds its parent.

    Args:
        app: The ASGI app.
        tracing: The app's tracing.
    """

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request inside its span; end the span with its status and route."""
        if scope["type"] != "http" or scope["path"] in _UNTRACED:
            await self.app(scope, receive, send)
            return
        span = self.tracing.start_server(scope)
        state = scope.setdefault("state", {})
        state["span"] = span
        status: int | None = None

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        error: str | None = None
        try:
            await self.app(scope, receive, send_noting_status)
        except BaseException as exc:  # after the response started, or a cancellation
            error = type(exc).__qualname__
            raise
        finally:
            end_server(span, scope, state, status, error)


def end_server(
    span: Span, scope: Scope, state: dict[str, Any], status: int | None, error: str | None
) -> None:
    """End a SERVER span: route, status, the request's id, key id and outcome from `state`."""
    route = route_label(scope)
    attributes: dict[str, Any] = {"gateway.request_id": state.get("request_id", "")}
    if route != OTHER_ROUTE:
        attributes["http.route"] = route
        method = scope["method"]
        span.update_name(f"{method if method in _METHODS else 'HTTP'} {route}")
    if status is not None:
        attributes["http.response.status_code"] = status
    key_id = state.get("key_id")
    if key_id:
        attributes["gateway.key_id"] = key_id
    summary = state.get("summary")
    outcome = summary.outcome if isinstance(summary, RequestSummary) else state.get("outcome")
    if outcome:
        attributes["gateway.outcome"] = outcome
    span.set_attributes(attributes)
    if error is not None or status is None or status >= 500:
        # HTTP conventions: the exception's type if one ended the request, else the status.
        span.set_attribute("error.type", error or str(status or "no_response"))
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def open_tracing(
    settings: Settings,
    environ: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
) -> Tracing | None:
    """Build the app's tracing, or return None when it is off (`tracing_endpoint`).

    The SDK is imported only here, only when tracing is on.

    Args:
        settings: `otel_exporter_otlp_endpoint`, `otel_service_name`, `otel_capture_content`.
        environ: The standard `OTEL_*` variables; None reads `os.environ`.
        exporter: Export there instead of OTLP (tests: the SDK's `InMemorySpanExporter`);
            tracing is then on whatever the settings say.
    """
    environ = os.environ if environ is None else environ
    if exporter is None:
        endpoint = tracing_endpoint(settings, environ)
        if endpoint is None:
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        for variable in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
            if environ.get(variable, "http/protobuf").strip() != "http/protobuf":
                # The gRPC exporter would add grpcio, a large native dependency, for one
                # protocol every collector also takes over HTTP (port 4318).
                logger.warning("%s is ignored: spans are sent as OTLP http/protobuf", variable)

        # Without an endpoint the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, its
        # headers, timeout and compression variables itself.
        exporter = OTLPSpanExporter(endpoint=endpoint or None)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from gateway import __version__

    resource: dict[str, str] = {"service.version": __version__}
    # The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; ours wins only when set.
    name = settings.otel_service_name or (
        None if environ.get("OTEL_SERVICE_NAME") else SERVICE_NAME
    )
    if name:
        resource["service.name"] = name
    # The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based, always on).
    provider = TracerProvider(resource=Resource.create(resource), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider, capture_content=settings.otel_capture_content)


def _temperature(request: GenerationRequest) -> float | None:
    body = request.body
    options = body.get("options") if request.surface == "ollama" else body
    value = options.get("temperature") if isinstance(options, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _content(request: GenerationRequest) -> dict[str, str]:
    """The prompt as `gen_ai.input.messages` (role and text parts) and `system_instructions`."""
    body = request.body
    messages: list[dict[str, Any]] = []
    attributes: dict[str, str] = {}
    raw = body.get("messages")
    if isinstance(raw, list):
        for message in raw:
            if isinstance(message, dict):
                content = message.get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                messages.append(
                    {"role": message.get("role"), "parts": [{"type": "text", "content": text}]}
                )
    for field in ("prompt", "input"):
        value = body.get(field)
        if value is not None:
            text = value if isinstance(value, str) else json.dumps(value)
            messages.append({"role": "user", "parts": [{"type": "text", "content": text}]})
    if messages:
        attributes["gen_ai.input.messages"] = json.dumps(messages)
    system = body.get("system")
    if isinstance(system, str):
        attributes["gen_ai.system_instructions"] = json.dumps([{"type": "text", "content": system}])
    return attributes
