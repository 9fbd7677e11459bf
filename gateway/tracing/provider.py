"""Whether tracing is on, and the per-app SDK provider that exports over OTLP/HTTP when it is.

The SDK is imported only in `open_tracing`, only when tracing is on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway.settings import Settings
from gateway.tracing.spans import Tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger("gateway.tracing")

#: The default `service.name` (`OTEL_SERVICE_NAME` or `GATEWAY_OTEL_SERVICE_NAME` override it).
SERVICE_NAME = "llm-gateway"
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
    # OTEL_TRACES_SAMPLER chooses the sampler when set. The SDK's own default (parent-based)
    # would let any client turn its traces off with a `-00` traceparent, keeping its slow or
    # failing requests from the collector: the gateway samples every request it serves.
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    sampler = None if environ.get("OTEL_TRACES_SAMPLER") else ALWAYS_ON
    # Attribute values are client-supplied (the path): bounded unless the operator says so.
    from opentelemetry.sdk.trace import SpanLimits

    limits = SpanLimits(
        max_attribute_length=None if environ.get("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") else 1024
    )
    # The SDK warns once per malformed `tracestate` member with the client's whole value:
    # log volume any client could drive without a key. The header is dropped either way.
    logging.getLogger("opentelemetry.trace.span").setLevel(logging.ERROR)
    provider = TracerProvider(
        resource=Resource.create(resource),
        shutdown_on_exit=False,
        sampler=sampler,
        span_limits=limits,
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider, capture_content=settings.otel_capture_content)
