"""Tests of `gateway/serve/`.

The `gateway serve` process: door, coalesced writes, shutdown, workers.
"""
