"""Tests of `gateway/api/`.

The client surfaces (Ollama and OpenAI routes, middleware) over a real gateway.
"""
