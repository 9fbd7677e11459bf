"""Tests of `gateway/tracing/`: OpenTelemetry spans."""
