"""`gateway bench`: the measuring method for a self-hosted model server, as a shipped tool.

Points at any Ollama or OpenAI-compatible server, directly or through the gateway with a key,
and measures TTFT, time per output token, inter-token latency and decode tokens/s from the
server's own counters (never a guessed tokenizer), under fixed, swept or searched load; finds the
concurrency knee and the SLO limit; saves runs with a fingerprint and compares them
(docs/benchmarking.md).
"""
