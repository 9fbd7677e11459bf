"""Tests of `gateway/metering/`: metrics against the truth, `/metrics` scrapes, usage accounting."""
