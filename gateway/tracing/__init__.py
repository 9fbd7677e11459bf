"""OpenTelemetry traces, off by default: one SERVER span per request, one CLIENT span per upstream.

The package: `provider` (on or off, the per-app SDK provider), `spans` (`Tracing`: starting,
propagating and ending the spans), `middleware` (the SERVER span of each HTTP request).

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
  counts from the request's arrival at the gateway (`gateway.metering.meter`), so the difference
  is the gateway's own time and the wait for the upstream's slot. A failure sets status ERROR,
  `error.type` to the `outcome` label (`upstream_error`, `timeout`, `client_disconnect`, ...;
  docs/metrics.md) and, for an upstream's error answer, `http.response.status_code`.

No prompt or answer text, no header values: only with `GATEWAY_OTEL_CAPTURE_CONTENT=true` does
the CLIENT span carry the request's messages as `gen_ai.input.messages` (JSON, the conventions'
role/parts form), a system prompt as `gen_ai.system_instructions` and the answer's text as
`gen_ai.output.messages`.
"""

from __future__ import annotations
