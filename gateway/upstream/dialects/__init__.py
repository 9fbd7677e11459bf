"""The APIs a model server speaks (Ollama, OpenAI-compatible): requests out, chunks back."""
