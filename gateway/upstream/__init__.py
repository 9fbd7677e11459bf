"""Upstream model servers: the shared HTTP client, header filters and the dialects."""
