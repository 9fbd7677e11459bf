"""Tests of `gateway/limits/`.

Per-key and per-address limits, in-flight counts, TPM reservations.
"""
