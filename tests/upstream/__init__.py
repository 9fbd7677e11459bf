"""Tests of `gateway/upstream/`: pool, routing, breaker, transport, dialects and their decoders."""
