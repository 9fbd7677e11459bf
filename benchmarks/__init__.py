"""Benchmarks: numbers printed side by side, never asserted in tests."""
