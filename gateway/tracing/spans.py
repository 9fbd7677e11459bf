"""`Tracing`: one app's tracer and propagator; the SERVER and CLIENT spans' attributes.

Names and values as the package docstring (`gateway.tracing`) lists them.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import anyio
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Scope

from gateway.neutral import GenerationRequest, RequestSummary

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from gateway.upstream.pool import Upstream

logger = logging.getLogger("gateway.tracing")

#: Longest wait, in seconds, for the last spans to be exported when the app stops.
SHUTDOWN_SECONDS = 5.0
#: `gen_ai.operation.name` of each neutral operation (GenAI conventions' well-known values).
_OPERATIONS = {"chat": "chat", "generate": "text_completion", "embed": "embeddings"}
_PROPAGATED = frozenset({b"traceparent", b"tracestate"})
#: The methods HTTP conventions name as they are; any other is `_OTHER` (bounded span names).
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
#: Most characters of an upstream's error message kept as a span's status (as in the log).
_MESSAGE_CHARS = 200


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
        carrier: dict[str, list[str]] = {}
        for name, value in scope["headers"]:
            if name in _PROPAGATED:
                carrier.setdefault(name.decode("latin-1"), []).append(value.decode("latin-1"))
        # W3C Trace Context: repeated `tracestate` lines are one list (section 3.3.1.1); two
        # `traceparent` lines are no usable parent (section 3.2), so a new trace starts.
        parents = carrier.pop("traceparent", [])
        merged = {"tracestate": ",".join(carrier["tracestate"])} if "tracestate" in carrier else {}
        if len(parents) == 1:
            merged["traceparent"] = parents[0]
        parent = self.propagator.extract(merged) if "traceparent" in merged else None
        method = scope["method"]
        attributes = {
            "http.request.method": method if method in METHODS else "_OTHER",
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        if method not in METHODS:
            attributes["http.request.method_original"] = method
        return self.tracer.start_span(
            "HTTP" if method not in METHODS else method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
        )

    def start_upstream(
        self,
        parent: Span | None,
        request: GenerationRequest,
        upstream: Upstream,
        reason: str | None = None,
    ) -> Span:
        """Start the CLIENT span of one upstream attempt (`gateway.tracing`).

        `reason` is why the upstream was chosen (`gateway.route.reason`,
        `gateway.upstream.scheduling`).
        """
        operation = _OPERATIONS.get(request.operation, request.operation)
        url = upstream.spec.url
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": upstream.dialect.name,
            "gen_ai.request.model": request.model,
            "server.address": url.host or "",
            "server.port": url.port or 0,
        }
        if reason is not None:
            attributes["gateway.route.reason"] = reason
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
    # The outcome, not the message: an upstream's 400/422 text may quote the request's own
    # content, and spans carry none unless content capture is on.
    span.set_status(Status(StatusCode.ERROR, str(outcome)[:_MESSAGE_CHARS]))
    span.end()


def end_upstream(
    span: Span,
    summary: RequestSummary,
    *,
    finish_reason: str | None = None,
    response_model: str | None = None,
    answer: str | None = None,
) -> None:
    """End the answering upstream's CLIENT span with the request's numbers (`gateway.tracing`).

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
