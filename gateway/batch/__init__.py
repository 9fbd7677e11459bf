"""Batch jobs: the OpenAI Batch API run by the gateway against its own upstreams (docs/batch.md)."""
