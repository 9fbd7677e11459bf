"""`python -m benchmarks.otlp_sink`: an OTLP/HTTP traces endpoint that drops every batch.

What the `gw-otel` row of `python -m benchmarks.gateway --tracing-row` exports to: the gateway then
does all of tracing's work (spans, attributes, the batch processor, protobuf encoding, the POST)
against a collector that answers at once, so the row measures the gateway's own cost, not a
collector's. It counts the spans it received (`GET /spans`), so a run can show they arrived.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def build_app() -> Starlette:
    """The sink: `POST /v1/traces` (protobuf), `GET /spans` (the count so far)."""
    received = [0]

    async def export(request: Request) -> Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.body())
        received[0] += sum(
            len(scope.spans) for spans in message.resource_spans for scope in spans.scope_spans
        )
        return Response(b"", media_type="application/x-protobuf")

    async def spans(_: Request) -> Response:
        return JSONResponse({"spans": received[0]})

    return Starlette(routes=[Route("/v1/traces", export, methods=["POST"]), Route("/spans", spans)])


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the sink on 127.0.0.1."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.otlp_sink")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(build_app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
