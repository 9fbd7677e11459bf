"""The generation engine: one request from a checked body to the finished upstream answer.

A request passes the modules in this order (each imports only those after it, never back):

1. `pipeline`: `Relay`, the app's services; `Relay.handle` refuses while draining, records a
   refusal's usage row, and builds the response.
2. `admission`: the one admission path (key limits, body, model allow-list, upstream headers,
   TPM reservation, meter), shared with batch lines and model management; builds the
   `Generation`.
3. `response`: `RelayResponse`, built by the pipeline, runs the request under one disconnect
   watcher (`disconnect`) and the shutdown's cancel scope, and writes the answer with the
   surface's codec (`surface`: the `Endpoint` and `Codec` a surface implements).
4. `generation`: `Generation`, handed its services: upstream choice, slot, failover,
   `stream:false` aggregation, and the finish that gives everything back once.
5. `exchange`: one upstream request: first-byte and idle deadlines (`deadline`), retries on the
   same upstream (`retry`), failures classified by `gateway.upstream.errors`.
"""
