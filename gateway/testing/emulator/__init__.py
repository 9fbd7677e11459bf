"""The Ollama (and OpenAI-compatible) emulator: a fake model server with known truth."""
