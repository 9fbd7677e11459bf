# ruff: noqa: T201 (a benchmark prints its result)
"""`python -m benchmarks.tracing_cost`: the CPU tracing adds per request, on and off the loop.

Runs what a traced request does in `gateway.tracing` (the SERVER span from a request with a
`traceparent`, the CLIENT span, the upstream `traceparent`, both ends with their attributes)
N times through the real SDK provider and `BatchSpanProcessor`, then times the OTLP protobuf
encoding the exporter's thread does for those spans (the SDK's own encoder). No sockets: the
POST to the collector is left out (`python -m benchmarks.gateway --tracing-row` has it all).
"""

from __future__ import annotations

import argparse
import time
import types
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gateway.auth.principal import Principal
from gateway.context import RequestContext
from gateway.neutral import GenerationRequest, RequestSummary
from gateway.settings import Settings
from gateway.tracing.middleware import end_server
from gateway.tracing.provider import open_tracing
from gateway.tracing.spans import end_upstream


class EncodingSink(SpanExporter):
    """Encodes every batch as the OTLP exporter would, then drops it; keeps the CPU time."""

    def __init__(self) -> None:
        self.spans = 0
        self.seconds = 0.0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Encode and drop."""
        started = time.process_time()
        encode_spans(spans).SerializeToString()
        self.seconds += time.process_time() - started
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def main(argv: Sequence[str] | None = None) -> None:
    """Print microseconds per request on the loop and in the exporter's thread."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing_cost")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args(argv)
    sink = EncodingSink()
    tracing = open_tracing(Settings(_env_file=None), {}, exporter=sink)
    assert tracing is not None  # noqa: S101 - an exporter turns it on
    spec = types.SimpleNamespace(url=types.SimpleNamespace(host="127.0.0.1", port=11434))
    upstream: Any = types.SimpleNamespace(spec=spec, dialect=types.SimpleNamespace(name="ollama"))
    body = {"model": "bench", "prompt": "Why is the sky blue?", "options": {"temperature": 0.2}}
    request = GenerationRequest("ollama", "generate", body, "bench", max_output_tokens=64)
    summary = RequestSummary(
        "/v1/generate", "bench", "all", "127.0.0.1:11434", "completed", 200, 0.7,
        ttft_s=0.05, tokens_in=12, tokens_out=64, time_per_output_token_s=0.01,
    )  # fmt: skip
    traceparent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    headers = [(b"host", b"gw"), (b"authorization", b"Bearer x"), (b"traceparent", traceparent)]
    scope = {"type": "http", "method": "POST", "path": "/v1/generate", "headers": headers}
    context = RequestContext("abc", principal=Principal("k", "bench", None))
    batch = 256  # below the processor's queue (2048), so no span is dropped
    loop_seconds = 0.0
    for done in range(0, args.requests, batch):
        started = time.process_time()
        for _ in range(min(batch, args.requests - done)):
            server = tracing.start_server(scope)
            client = tracing.start_upstream(server, request, upstream)
            tracing.inject(client, {"x-request-id": "abc"})
            end_upstream(client, summary, finish_reason="stop", response_model="bench")
            end_server(server, scope, context, 200, None)
        loop_seconds += time.process_time() - started
        tracing.provider.force_flush()
    tracing.provider.shutdown()
    per_request = sink.seconds / (sink.spans / 2) * 1e6 if sink.spans else 0.0
    print(f"{args.requests} requests, {sink.spans} spans exported")
    print(f"  on the event loop:        {loop_seconds / args.requests * 1e6:6.1f} us per request")
    print(f"  OTLP encoding (thread):   {per_request:6.1f} us per request (2 spans)")


if __name__ == "__main__":
    main()
