"""Tests of `gateway/relay/`: the relay, retries, deadlines, large answers, the soak."""
