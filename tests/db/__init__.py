"""Tests of `gateway/db/`: the schema migrations."""
