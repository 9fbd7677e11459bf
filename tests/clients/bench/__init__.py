"""Tests of `gateway/clients/bench/`.

The shipped `gateway bench` tool (`bench_docs` and `bench_sim` are its test data).
"""
