"""An authenticated, metered inference gateway for self-hosted LLM servers."""

__version__ = "0.1.0"
