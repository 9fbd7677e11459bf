"""Which upstream serves a request: the routing policy and the scores it is made of.

Named after llm-d's "inference scheduler" (Filter -> Score -> Pick over model servers, the
Kubernetes Gateway API Inference Extension's endpoint picker), and apart from
`gateway.routing`, which only names a request's route label. `UpstreamPool.choose` filters
the upstreams (breaker, up, lists the model) and asks the `Scheduler` for an order:

- `ticket`: what a request carries for the choice (model, tokens, session, prompt blocks);
- `prefixes`: the prompt's chained block hashes and the index of what went where (LRU);
- `residency`: whether a server has the model loaded, and what a cold load costs;
- `scores`: the pure scores (prefix, load, residency) and the balance guard;
- `scheduler`: the policy (`GATEWAY_ROUTING`) that combines them, and its metrics.
"""
