"""The emulator's GPU knobs on the command line, and named presets of real figures for them.

Owns the GPU flags (`add_arguments`, read back by `gpu_knobs`) and `GPU_PROFILES`, each a set of
`EmulatorConfig` field values (`--gpu-profile NAME`, applied by `apply_preset`; explicit flags
still win), so a benchmark says one word for a real model on a real GPU. The figures and where
they come from:

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
* `prefill_shared`: the 3,000 tokens/s is the GPU's, shared by the prompts prefilled at once
  (llama.cpp batches every slot's prompt tokens into one `n_batch` step);
* `ttft` 10 ms: the fixed part (scheduling, tokenisation, sampling the first token).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
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
        "prefill_shared": True,
    },
}
"""`EmulatorConfig` field values per preset name (module docstring)."""


def apply_preset(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> float:
    """Make `--gpu-profile`'s values the parser's defaults; return its `model_size` (or 0.0).

    The size is returned rather than set: `--model-size` is a list of `[NAME=]GB` values.
    """
    profile = _profile_parser().parse_known_args(argv)[0].gpu_profile
    preset = dict(GPU_PROFILES[profile]) if profile else {}
    size = float(preset.pop("model_size", 0.0))
    parser.set_defaults(**preset)
    return size


def gpu_knobs(
    parser: argparse.ArgumentParser, args: argparse.Namespace, preset_size: float
) -> dict[str, Any]:
    """The `EmulatorConfig` fields the GPU flags set (argparse reports a bad `--model-size`)."""
    sizes = _model_sizes(parser, args.model_size)
    preload = None if args.preload is None else [n for n in args.preload.split(",") if n]
    return {
        "model_size": sizes.pop("", preset_size),
        "model_sizes": sizes,
        "memory": args.memory,
        "load_rate": args.load_rate,
        "keep_alive": args.keep_alive,
        "preload": preload,
        "prefill_rate": args.prefill_rate,
        "cache_tokens": args.cache_tokens,
        "prefill_shared": args.prefill_shared,
    }


def _profile_parser() -> argparse.ArgumentParser:
    """Reads `--gpu-profile` alone, so the preset can set the other flags' defaults."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--gpu-profile", choices=sorted(GPU_PROFILES), default=None)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The GPU server knobs: residency, memory, prefill and the prefix cache."""
    gpu = parser.add_argument_group(
        "GPU server",
        "model residency, memory and a prefix cache (gateway.testing.emulator.capacity, "
        "gateway.testing.emulator.prefix); GET /emulator/stats reads the counters",
    )
    gpu.add_argument(
        "--gpu-profile",
        choices=sorted(GPU_PROFILES),
        default=None,
        help="a preset of real figures (gateway.testing.emulator.profiles); flags given win",
    )
    gpu.add_argument(
        "--model-size",
        action="append",
        default=[],
        metavar="[NAME=]GB",
        help="a model's memory once loaded; without NAME, every model's (repeatable)",
    )
    gpu.add_argument("--memory", type=float, default=None, metavar="GB", help="memory budget")
    gpu.add_argument(
        "--load-rate",
        type=float,
        default=0.0,
        metavar="GB/S",
        help="cold load = size / rate (default 0: --load-duration applies)",
    )
    gpu.add_argument(
        "--keep-alive",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="an idle model's time loaded (default: %(default)s; negative: forever)",
    )
    gpu.add_argument(
        "--preload", default=None, metavar="NAMES", help="comma-separated models loaded at start"
    )
    gpu.add_argument(
        "--prefill-rate",
        type=float,
        default=0.0,
        metavar="TOKENS/S",
        help="tokenise prompts; TTFT adds uncached prompt tokens / rate (default 0: off)",
    )
    gpu.add_argument(
        "--prefill-shared",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the prefill rate is the server's, shared by prompts prefilled at once",
    )
    gpu.add_argument(
        "--cache-tokens",
        type=int,
        default=0,
        metavar="N",
        help="tokens each model's prefix cache holds, LRU (default 0: no cache)",
    )


def _model_sizes(parser: argparse.ArgumentParser, values: list[object]) -> dict[str, float]:
    """`--model-size` values as `{name: GB}`; the key "" is every model's (later ones win)."""
    sizes: dict[str, float] = {}
    for value in values:
        name, _, size = str(value).rpartition("=")
        try:
            sizes[name] = float(size)
        except ValueError:
            parser.error(f"--model-size: not [NAME=]GB: {value}")
    return sizes
