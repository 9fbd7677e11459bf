"""Tests of `gateway/keys/`.

API keys, the key store and its admin operations, the `gateway keys` CLI.
"""
