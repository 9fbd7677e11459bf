"""Named GPU presets for the emulator: one word gives a benchmark a real model on a real GPU.

Owns `GPU_PROFILES`, each a set of `EmulatorConfig` field values (`--gpu-profile NAME`; explicit
flags still win). The figures and where they come from:

`rtx3090-llama3.1-8b`: Llama 3.1 8B Instruct, Q4_K_M GGUF, on one RTX 3090 (24 GB), llama.cpp
CUDA as Ollama runs it, `OLLAMA_NUM_PARALLEL=4`, `num_ctx` 8192.

* decode 123 tokens/s for one stream (`inter_token` 8.1 ms) and prefill about 3,000 tokens/s
  (`prefill_rate`): llama.cpp CUDA on an RTX 3090 with an 8B dense Q4_K_M model (4.98 GiB of
  weights), 122-127 tokens/s decode and 2,850-3,120 tokens/s prefill on 555-695-token prompts
  (calebcoffie.com/benchmarks/granite-4-1-8b-gguf, the "rag" and "agent" rows; the same
  32-layer shape as Llama 3.1 8B);
* `batch_slowdown` 0.17: llama.cpp batched decoding on one GPU gives each of 4 streams 89
  tokens/s against 136 alone (ggml-org/llama.cpp PR #3776, `batched-bench`, PP 512 TG 128):
  1 + k * 3 = 136 / 89;
* `model_size` 9.2 GB: the Q4_K_M file (4.92 GB) plus the KV cache Ollama allocates,
  `num_ctx` x parallel = 32,768 tokens (reference ollama-protocol.md §8) at 128 KiB a token
  (Llama 3.1 8B's config.json: 32 layers x 8 KV heads x 128 dims x K and V x 2 bytes) = 4.3 GB;
  so `memory` 24 GB holds two such models and a third evicts one;
* `cache_tokens` 32,768: that KV cache, the most prompt tokens the server can keep;
* `load_rate` 2 GB/s: a cold load of 4.6 s, in line with the 6.3 s `load_duration` of
  Ollama's documented cold start (reference §10 T1) and NVMe reads of 2-3 GB/s;
* `ttft` 10 ms: the fixed part (scheduling, tokenisation, sampling the first token).
"""

from __future__ import annotations

from typing import Any

GPU_PROFILES: dict[str, dict[str, Any]] = {
    "rtx3090-llama3.1-8b": {
        "parallel": 4,
        "ttft": 0.01,
        "inter_token": 0.0081,
        "batch_slowdown": 0.17,
        "model_size": 9.2,
        "memory": 24.0,
        "load_rate": 2.0,
        "prefill_rate": 3000.0,
        "cache_tokens": 32768,
    },
}
"""`EmulatorConfig` field values per preset name (module docstring)."""
