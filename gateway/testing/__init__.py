"""Test and benchmark support: the Ollama emulator and a loopback uvicorn runner."""
