"""Test, demo and benchmark support: the Ollama emulator, a loopback uvicorn runner, the demo.

On top of everything: nothing in the server or the client tools imports it.
"""
