"""How many tokens a generation body may use: what its TPM reservation is made of.

A request reserves tokens against its key's TPM when it is admitted (`KeyLimiter.reserve`),
and the reservation is settled with the real count when it ends. The estimate is cheap and
needs no tokenizer:

* Output: the client's own bound when it set one (`options.num_predict` on the Ollama surface,
  `max_tokens`/`max_completion_tokens` on the OpenAI one: the answer cannot be longer, every
  dialect sends it on). Absent, -1 (no limit), -2 (fill the context) or anything else:
  `GATEWAY_TPM_RESERVE_TOKENS`, a guess. Embeddings generate nothing: 0.
* Prompt: UTF-8 bytes of the prompt / 4 (about one token per 4 bytes of English text;
  under for CJK, over for code), plus the length of a generate `context` (already tokens).
  The prompt of a generation is every field of its body but the few that are not prompt text
  (`gateway.wire.json.prompt_bytes`: a denylist, so tools, tool calls, thinking, schemas and a
  field added tomorrow all count: upstreams render them into what the model prefills); an
  embedding's is its input texts. Images are not counted: their cost depends on the model, and
  a reservation that counts a base64 blob at 4 bytes a token would refuse what is servable. The
  surface that parsed the body counts the bytes (`GenerationRequest.prompt_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.neutral import GenerationRequest

#: Bytes of prompt text per estimated token.
BYTES_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """What a request may use, in tokens.

    Attributes:
        output: Most output tokens expected: the client's bound, or the configured default.
        asked: `output` is the client's own bound, not the default (a guess).
        prompt: Estimated prompt tokens.
    """

    output: int
    asked: bool
    prompt: int

    @property
    def total(self) -> int:
        """Prompt + output tokens."""
        return self.output + self.prompt


def estimate_tokens(request: GenerationRequest, default_output: int) -> TokenEstimate:
    """Estimate a request's tokens (module docstring).

    Args:
        request: The checked request.
        default_output: Output tokens to expect when the client set no bound.

    Returns:
        The estimate; never negative.
    """
    limit = request.max_output_tokens
    asked = limit is not None
    output = limit if limit is not None else default_output
    prompt = request.prompt_tokens + math.ceil(request.prompt_bytes / BYTES_PER_TOKEN)
    return TokenEstimate(output, asked, prompt)
