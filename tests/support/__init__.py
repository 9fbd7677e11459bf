"""Helpers the test modules share (not fixtures: those live in `tests/conftest.py`).

One module a concern, so a test imports what it uses from where it lives:
- `stack`: the running `Gateway` and `Emulator` a fixture hands a test, keys in a gateway's store;
- `servers`: the PostgreSQL and Redis servers on this machine, and a `Database` for the key store;
- `client`: `MODEL`, and requests a test sends (generations, streamed or not) and checks on them;
- `metrics`: reading Prometheus text and waiting on a gauge;
- `lookalikes`: stand-in Ollama and OpenAI servers a test writes the answers of, SSE and NDJSON;
- `sockets`: raw-socket reads, for tests that speak HTTP/1.1 by hand;
- `oidc`: the test OpenID provider (its own process, `oidc_mock_app`) and a browser's sign-in.
"""
