"""The emulated GPU server's prompt tokens and its prefix (KV) cache.

Owns how a generation request becomes tokens (`tokenize`) and how a server remembers the
prompts it recently prefilled (`PrefixCache`), so a routed benchmark can see prefix affinity pay:
a server that holds a prompt's prefix prefills only the tail.

Tokens. The prompt is rendered as the emulator's chat template renders it
(`gateway.testing.emulator.catalog.TEMPLATE`: `<|system|>...<|end|>`, then each message as
`<|role|>content<|end|>`, then `<|assistant|>`), in the same way for `/api/chat`,
`/api/generate` (its `system`, then `prompt` as a user message), `/v1/chat/completions` and
`/v1/completions`; offered `tools` are rendered as JSON after the system text, as templates put
them first. One token is `BYTES_PER_TOKEN` bytes of the UTF-8 rendering (OpenAI's rule of thumb
for English, "about 4 characters per token"), rounded up.

Cache. Like vLLM's automatic prefix caching (docs.vllm.ai, "Automatic Prefix Caching": KV blocks
of 16 tokens keyed by a hash of the block's tokens and of every token before it), the rendering
is cut into blocks of `BLOCK_TOKENS` tokens, each named by a chained hash (its own bytes and the
previous block's hash), so a block matches only when everything before it matches. A lookup
counts the leading blocks already held; the prompt's blocks are then held, most recent last, and
the least recently used are dropped past the capacity (`EmulatorConfig.cache_tokens`). At
least one token is always prefilled, as llama.cpp and vLLM recompute the last one on a full hit.
The cache belongs to one model on one server; it is dropped when the model is evicted.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

BYTES_PER_TOKEN = 4
"""Bytes of the rendered prompt per token."""

BLOCK_TOKENS = 16
"""Tokens per cache block (vLLM's default `block_size`)."""

_BLOCK_BYTES = BYTES_PER_TOKEN * BLOCK_TOKENS


@dataclass(frozen=True)
class PromptTokens:
    """A request's prompt as the emulated server sees it.

    Attributes:
        count: Prompt tokens (the rendering's bytes / `BYTES_PER_TOKEN`, rounded up, >= 1).
        blocks: Chained hashes of the rendering's whole blocks, in order.
    """

    count: int
    blocks: tuple[int, ...]


def _text(content: object) -> str:
    """A message content as text: a string, or the text parts of an OpenAI content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (part.get("text") if isinstance(part, dict) else part for part in content)
        return "".join(part for part in parts if isinstance(part, str))
    return ""


def render(body: object) -> str:
    """Render a generation request's prompt with the emulator's chat template (module docstring).

    Args:
        body: The decoded JSON body of `/api/chat`, `/api/generate`, `/v1/chat/completions` or
            `/v1/completions`; anything else renders as the bare assistant header.

    Returns:
        The rendered prompt text.
    """
    if not isinstance(body, dict):
        return "<|assistant|>"
    parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        parts.append(f"<|system|>{system}<|end|>")
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        parts.append(f"<|tools|>{json.dumps(tools, sort_keys=True)}<|end|>")
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            role = message.get("role")
            parts.append(f"<|{role if isinstance(role, str) else 'user'}|>")
            parts.append(f"{_text(message.get('content'))}<|end|>")
    prompt = body.get("prompt")
    if isinstance(prompt, list):  # /v1/completions may send a list of prompts: the first
        prompt = prompt[0] if prompt else ""
    if isinstance(prompt, str) and prompt:
        parts.append(f"<|user|>{prompt}<|end|>")
    parts.append("<|assistant|>")
    return "".join(parts)


def tokenize(body: object) -> PromptTokens:
    """The prompt tokens and cache blocks of a generation request (module docstring)."""
    data = render(body).encode()
    count = max(1, -(-len(data) // BYTES_PER_TOKEN))
    blocks: list[int] = []
    previous = 0
    for start in range(0, len(data) - _BLOCK_BYTES + 1, _BLOCK_BYTES):
        previous = hash((previous, data[start : start + _BLOCK_BYTES]))
        blocks.append(previous)
    return PromptTokens(count, tuple(blocks))


class PrefixCache:
    """One model's prefix cache on one server: block hashes, least recently used first.

    Args:
        capacity_tokens: Tokens it holds at most (0 holds nothing: every prompt is a miss).
    """

    def __init__(self, capacity_tokens: int) -> None:
        self._capacity = max(0, capacity_tokens) // BLOCK_TOKENS
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._blocks)

    def admit(self, prompt: PromptTokens) -> int:
        """Look the prompt up, then hold its blocks; return the cached tokens it starts with.

        Returns:
            Tokens of the longest held prefix, at most `prompt.count - 1`.
        """
        hit = 0
        for block in prompt.blocks:
            if block not in self._blocks:
                break
            hit += 1
        for block in prompt.blocks:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
        return min(hit * BLOCK_TOKENS, prompt.count - 1)

    def clear(self) -> None:
        """Drop everything (the model was evicted or unloaded)."""
        self._blocks.clear()
