"""Ollama's API: `/api/*` at Ollama's paths, and its bodies at `/v1/generate` and `/v1/chat`."""
