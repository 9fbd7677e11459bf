"""Tests of `gateway/testing/emulator/`: the Ollama emulator the other tests stand on."""
