"""Tests of the repository's assets.

The lock files, `scripts/audit`, `deploy/` (Kubernetes, Prometheus).
"""
