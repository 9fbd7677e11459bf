# ruff: noqa: T201 (a benchmark prints its table)
"""`python -m benchmarks.chunk_json`: the relay's per-chunk JSON work, `json` against orjson.

In one process, no I/O: an answer of `--tokens` Ollama `/api/chat` lines (and one OpenAI SSE
answer) is fed through the dialect's decoder and the surface's codec, as the relay does per
upstream read, one token a read:

- `chat`: `/api/chat` relayed (`NdjsonDecoder` + `NdjsonCodec`: the upstream's own line out,
  so decoding only);
- `sse`: `/v1/chat/completions` on an Ollama upstream (`NdjsonDecoder` + `CompletionCodec`:
  each line decoded, an SSE event built and encoded);
- `sse-up`: `/api/chat` on an OpenAI upstream (`SseDecoder` + `NdjsonCodec`: each event
  decoded, an Ollama line built and encoded).

Each is run with the standard library's `json` only (`json`: `decode_object` and `encode_json`
as they were before orjson, put in their callers' namespaces) and as shipped (`orjson`,
`gateway.upstream.dialects.json_codec`), alternately, `--rounds` times; the table gives each
side's least µs per chunk over the rounds (interference only ever adds time) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gateway.api.ollama import codec as ollama_codec
from gateway.api.openai import codec as openai_codec
from gateway.neutral import GenerationRequest
from gateway.upstream.dialects import framing, ollama, openai
from gateway.upstream.dialects.json_codec import stdlib_decode_object
from gateway.upstream.dialects.ollama import NdjsonDecoder
from gateway.upstream.dialects.openai import SseDecoder


def _json_encode(data: Any) -> bytes:
    """`encode_json` as it was before orjson (commit ce7af81)."""
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


#: The modules that bound `decode_object` or `encode_json` at import, for the `json` side.
_CALLERS = (framing, ollama, openai, ollama_codec, openai_codec)


@contextmanager
def _stdlib_only() -> Iterator[None]:
    names = ("decode_object", "encode_json")
    saved = [(module, name, getattr(module, name, None)) for module in _CALLERS for name in names]
    stdlib = {"decode_object": stdlib_decode_object, "encode_json": _json_encode}
    try:
        for module, name, shipped in saved:
            if shipped is not None:
                setattr(module, name, stdlib[name])
        yield
    finally:
        for module, name, shipped in saved:
            if shipped is not None:
                setattr(module, name, shipped)


def _ndjson(tokens: int) -> list[bytes]:
    lines = [
        json.dumps(
            {
                "model": "llama3.2:1b",
                "created_at": "2026-12-07T07:00:00.123456789Z",
                "message": {"role": "assistant", "content": f" word{i}"},
                "done": False,
            },
            separators=(",", ":"),
        ).encode()
        + b"\n"
        for i in range(tokens)
    ]
    final = {
        "model": "llama3.2:1b",
        "created_at": "2026-12-07T07:00:01.123456789Z",
        "message": {"role": "assistant", "content": ""},
        "done_reason": "stop",
        "done": True,
        **{"total_duration": 1234567890, "load_duration": 1234567, "prompt_eval_count": 26},
        **{"prompt_eval_duration": 12345678, "eval_count": tokens, "eval_duration": 987654321},
    }
    return [*lines, json.dumps(final, separators=(",", ":")).encode() + b"\n"]


def _sse(tokens: int) -> list[bytes]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1765000000}
    events = []
    for i in range(tokens):
        choice = {"index": 0, "delta": {"content": f" word{i}"}, "finish_reason": None}
        event = {**head, "model": "m", "choices": [choice]}
        events.append(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
    last = {**head, "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    events.append(b"data: " + json.dumps(last, separators=(",", ":")).encode() + b"\n\n")
    return [*events, b"data: [DONE]\n\n"]


def _answer(decoder: Any, codec: Any, reads: list[bytes]) -> int:
    written = 0
    for read in reads:
        written += len(codec.encode(decoder.feed(read)))
    written += len(codec.encode(decoder.end()))
    return written


def _paths(tokens: int) -> dict[str, tuple[Callable[[], int], int]]:
    chat = GenerationRequest(surface="ollama", operation="chat", body={}, model="llama3.2:1b")
    sse = GenerationRequest(surface="openai", operation="chat", body={}, model="llama3.2:1b")
    ndjson, events = _ndjson(tokens), _sse(tokens)
    return {
        "chat": (lambda: _answer(NdjsonDecoder(), ollama_codec.NdjsonCodec(chat), ndjson), tokens),
        "sse": (
            lambda: _answer(NdjsonDecoder(), openai_codec.CompletionCodec(sse), ndjson),
            tokens,
        ),
        "sse-up": (
            lambda: _answer(SseDecoder(0.0, 0.0), ollama_codec.NdjsonCodec(chat), events),
            tokens,
        ),
    }


def _per_chunk(run: Callable[[], int], chunks: int, answers: int) -> float:
    started = time.perf_counter()
    for _ in range(answers):
        run()
    return (time.perf_counter() - started) / (answers * (chunks + 1)) * 1e6


def main() -> None:
    """Run the paths on both sides alternately and print least µs per chunk."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens an answer (64)")
    parser.add_argument("--answers", type=int, default=200, help="answers a round (200)")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds (7)")
    args = parser.parse_args()
    paths = _paths(args.tokens)
    least: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for side in ("json", "orjson"):
            for name, (run, chunks) in paths.items():
                if side == "json":
                    with _stdlib_only():
                        took = _per_chunk(run, chunks, args.answers)
                else:
                    took = _per_chunk(run, chunks, args.answers)
                least[side, name] = min(least.get((side, name), took), took)
    print(f"{'path':8} {'json µs/chunk':>14} {'orjson µs/chunk':>16} {'orjson/json':>12}")
    for name in paths:
        before, after = least["json", name], least["orjson", name]
        print(f"{name:8} {before:14.2f} {after:16.2f} {after / before:12.2f}")


if __name__ == "__main__":
    main()
