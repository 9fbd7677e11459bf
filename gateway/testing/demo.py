# ruff: noqa: T201 (the demo talks to a person on the terminal)
"""The main job: a real model answers through the gateway, streaming, with a key, measured.

Starts llama-cpp-python's OpenAI-compatible server with Gemma 3 270M, starts `gateway serve` in
front of it with the `openai` dialect, creates a key with `gateway keys create`, streams an
answer through `POST /api/generate` and prints it as it arrives, then prints TTFT and decode
tokens/s as the client measured them and as the gateway's `/metrics` recorded them.
Run it with `scripts/demo` (which installs everything first) or `python -m gateway.testing.demo`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import httpx

from gateway.testing.stack import MODEL_ALIAS, create_key, gateway_process, model_server

DEFAULT_PROMPT = "Why is the sky blue?"


def completion_body(question: str, max_tokens: int) -> dict[str, object]:
    """The `/api/generate` body the demo sends.

    The Gemma 3 270M GGUF answers chat-templated prompts poorly (it echoes them), but completes
    a plain `Question: ... Answer:` text well; so the demo asks in raw mode (`raw: true`, no
    template, reference section 2.1), which the openai dialect sends to `/v1/completions`.
    """
    return {
        "model": MODEL_ALIAS,
        "prompt": f"Question: {question}\nAnswer:",
        "raw": True,
        "options": {"num_predict": max_tokens, "temperature": 0.3, "stop": ["\nQuestion:"]},
    }


def _interrupt(signum: int, _: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stream_answer(url: str, key: str, prompt: str, max_tokens: int) -> dict[str, float]:
    """Stream `/api/generate`, print tokens as they come, return the client's measurements.

    Returns:
        `ttft_s` (request sent to first non-empty token, seconds), `tokens` (text chunks),
        `tokens_per_s` (decode rate: (chunks - 1) / (last - first), tokens per second),
        `eval_count` and `eval_rate` (from the final chunk: eval_count / eval_duration * 1e9).
    """
    body = completion_body(prompt, max_tokens)
    headers = {"Authorization": f"Bearer {key}"}
    first = last = None
    chunks = 0
    final: dict[str, float] = {}
    with httpx.Client(timeout=300) as client:  # built before the clock starts
        sent = time.perf_counter()
        with client.stream("POST", f"{url}/api/generate", json=body, headers=headers) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"gateway answered {response.status_code}: {response.text}")
            for line in response.iter_lines():
                if not line:
                    continue
                chunk = json.loads(line)
                if "error" in chunk:
                    raise RuntimeError(f"stream failed: {chunk['error']}")
                if chunk.get("response"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
                    print(chunk["response"], end="", flush=True)
                if chunk.get("done"):
                    final = chunk
    print()
    if first is None or last is None:
        raise RuntimeError("the model produced no tokens")
    eval_count = float(final.get("eval_count", 0))
    eval_ns = float(final.get("eval_duration", 0))
    return {
        "ttft_s": first - sent,
        "tokens": chunks,
        "tokens_per_s": (chunks - 1) / (last - first) if chunks > 1 and last > first else 0.0,
        "eval_count": eval_count,
        "eval_rate": eval_count / eval_ns * 1e9 if eval_ns else 0.0,
    }


def gateway_metrics(url: str) -> dict[str, float]:
    """Read the gateway's mean TTFT and decode rate for the demo model from `/metrics`."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or f'model="{MODEL_ALIAS}"' not in line:
            continue
        name = line.split("{", 1)[0]
        values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])

    def mean(metric: str) -> float:
        count = values.get(f"{metric}_count", 0.0)
        return values.get(f"{metric}_sum", 0.0) / count if count else 0.0

    return {
        "ttft_s": mean("gateway_time_to_first_token_seconds"),
        "tokens_per_s": mean("gateway_output_tokens_per_second"),
        "output_tokens": values.get("gateway_output_tokens_total", 0.0),
        "requests": values.get("gateway_time_to_first_token_seconds_count", 0.0),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit code (0 on success)."""
    parser = argparse.ArgumentParser(prog="gateway-demo", description=__doc__)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    # A background job of a non-interactive shell starts with SIGINT ignored; restore Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print("Press Ctrl-C at any time to stop; every process started here is stopped with it.")
    with tempfile.TemporaryDirectory(prefix="gateway-demo-") as tmp:
        workdir = Path(tmp)
        try:
            print("==> starting the model server (llama-cpp-python, Gemma 3 270M Q4_K_M)...")
            with model_server(workdir) as model:
                print(f"    model server ready at {model.url}")
                env = {
                    "GATEWAY_UPSTREAM_URL": model.url,
                    "GATEWAY_UPSTREAM_DIALECT": "openai",
                    "GATEWAY_LOG_LEVEL": "warning",
                }
                print("==> starting the gateway in front of it (dialect: openai)...")
                with gateway_process(workdir, env) as gateway:
                    print(f"    gateway ready at {gateway.url}")
                    key = create_key(gateway.extra_env, "demo")
                    print(f"==> created API key id={key['id']} (the secret is shown only once)")
                    rejected = httpx.post(
                        f"{gateway.url}/api/generate",
                        json={"model": MODEL_ALIAS, "prompt": "hi"},
                        headers={"Authorization": "Bearer gw_000000000000_wrong"},
                    )
                    print(f"    a wrong key gets: {rejected.status_code} {rejected.text}")
                    print(f"==> question: {args.prompt}")
                    print("    (sent as a raw Question/Answer completion; see completion_body)\n")
                    client = stream_answer(
                        gateway.url, str(key["key"]), args.prompt, args.max_tokens
                    )
                    server = gateway_metrics(gateway.url)
                    _report(client, server)
                print("==> stopping the gateway and the model server...")
        except KeyboardInterrupt:
            print("\ninterrupted; stopped every process this demo started")
            return 130
        except Exception as exc:  # a person reads this, not a traceback
            print(f"\ndemo failed: {exc}", file=sys.stderr)
            return 1
    print("done: nothing is left running")
    return 0


def _report(client: dict[str, float], server: dict[str, float]) -> None:
    print("\n                      client measured   gateway /metrics")
    ttft_client, ttft_server = client["ttft_s"] * 1000, server["ttft_s"] * 1000
    print(f"  TTFT                {ttft_client:12.1f} ms {ttft_server:14.1f} ms")
    print(f"  decode tokens/s     {client['tokens_per_s']:12.1f}    {server['tokens_per_s']:14.1f}")
    print(
        f"  output tokens       {client['tokens']:12.0f}    {server['output_tokens']:14.0f}"
        f"   (final chunk eval_count: {client['eval_count']:.0f})"
    )


if __name__ == "__main__":
    raise SystemExit(main())
