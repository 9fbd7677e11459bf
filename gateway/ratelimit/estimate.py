"""How many tokens a generation body may use: what its TPM reservation is made of.

A request reserves tokens against its key's TPM when it is admitted (`KeyLimiter.reserve`),
and the reservation is settled with the real count when it ends. The estimate is cheap and
needs no tokenizer:

* Output: `options.num_predict` when it is a positive integer (the answer cannot be longer:
  Ollama stops there, and the openai dialect sends it as `max_tokens`). Absent, -1 (no limit),
  -2 (fill the context) or anything else: `GATEWAY_TPM_RESERVE_TOKENS`, a guess. The bodies
  the gateway takes are Ollama's, so a top-level OpenAI `max_tokens` is not read: nothing
  upstream would honour it, and reserving by it would under-reserve.
* Prompt: UTF-8 bytes of the text fields / 4 (about one token per 4 bytes of English text;
  under for CJK, over for code), plus the length of a generate `context` (already tokens).
  Images are not counted: their cost depends on the model, and a reservation that counts a
  base64 blob at 4 bytes a token would refuse what is servable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Bytes of prompt text per estimated token.
BYTES_PER_TOKEN = 4

#: Text fields of a generate body that reach the model as prompt tokens.
_GENERATE_TEXT = ("prompt", "system", "suffix", "template")


@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """What a request may use, in tokens.

    Attributes:
        output: Most output tokens expected: `num_predict`, or the configured default.
        asked: `output` is the body's own `num_predict` (a bound), not the default (a guess).
        prompt: Estimated prompt tokens.
    """

    output: int
    asked: bool
    prompt: int

    @property
    def total(self) -> int:
        """Prompt + output tokens."""
        return self.output + self.prompt


def estimate_tokens(body: Mapping[str, Any], default_output: int) -> TokenEstimate:
    """Estimate a parsed generate or chat body's tokens (module docstring).

    Args:
        body: The body as `gateway.relay.body.parse_body` returns it.
        default_output: Output tokens to expect when the body sets no positive `num_predict`.

    Returns:
        The estimate; never negative.
    """
    options = body.get("options")
    limit = options.get("num_predict") if isinstance(options, dict) else None
    asked = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
    output = limit if isinstance(limit, int) and asked else default_output
    size = sum(_text_bytes(body.get(name)) for name in _GENERATE_TEXT)
    messages = body.get("messages")
    if isinstance(messages, list):
        size += sum(_text_bytes(m.get("content")) for m in messages if isinstance(m, dict))
    context = body.get("context")
    tokens = len(context) if isinstance(context, list) else 0
    return TokenEstimate(output, asked, tokens + math.ceil(size / BYTES_PER_TOKEN))


def _text_bytes(value: object) -> int:
    return len(value.encode("utf-8", "replace")) if isinstance(value, str) else 0
