"""How many tokens a generation body may use: what its TPM reservation is made of.

A request reserves tokens against its key's TPM when it is admitted (`KeyLimiter.reserve`),
and the reservation is settled with the real count when it ends. The estimate is cheap and
needs no tokenizer:

* Output: the client's own bound when it set one (`options.num_predict` on the Ollama surface,
  `max_tokens`/`max_completion_tokens` on the OpenAI one: the answer cannot be longer, every
  dialect sends it on); absent, -1 (no limit), -2 (fill the context) or anything else: none.
  What is reserved is what the key's recent answers on the model needed
  (`gateway.limits.history`), before any: `GATEWAY_TPM_RESERVE_TOKENS`; at most the bound
  (`KeyLimiter.reserve`). Embeddings generate nothing: 0.
* Prompt: UTF-8 bytes of the prompt / 4 (about one token per 4 bytes of English text;
  under for CJK, over for code), plus the length of a generate `context` (already tokens).
  The prompt of a generation is every field of its body but the few that are not prompt text
  (`prompt_bytes`: a denylist, so tools, tool calls, thinking, schemas and a
  field added tomorrow all count: upstreams render them into what the model prefills); an
  embedding's is its input texts. Images are not counted: their cost depends on the model, and
  a reservation that counts a base64 blob at 4 bytes a token would refuse what is servable. The
  surface that parsed the body counts the bytes (`GenerationRequest.prompt_bytes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gateway.neutral import GenerationRequest

#: Bytes of prompt text per estimated token.
BYTES_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class TokenEstimate:
    """What a request may use, in tokens.

    Attributes:
        output: Output tokens to expect before the key has answers on the model to go by
            (`gateway.limits.history`): the configured default, at most the client's bound
            (0 for an embedding).
        bound: The client's own bound on output tokens, or None when it set none.
        prompt: Estimated prompt tokens.
    """

    output: int
    bound: int | None
    prompt: int

    @property
    def asked(self) -> bool:
        """The client set its own bound."""
        return self.bound is not None

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
    output = default_output if limit is None else min(limit, default_output)
    prompt = request.prompt_tokens + math.ceil(request.prompt_bytes / BYTES_PER_TOKEN)
    return TokenEstimate(output, limit, prompt)


def text_bytes(value: object) -> int:
    """UTF-8 bytes of a string value (0 for anything else): the TPM estimate's unit."""
    if not isinstance(value, str):
        return 0
    # isascii() reads a flag of the string: a megabyte of ASCII is never copied to be measured.
    return len(value) if value.isascii() else len(value.encode("utf-8", "replace"))


#: Top-level fields of a generation body that are not prompt text: the model's name, flags,
#: sampling options and stop strings, the client's labels, images (not counted: what they cost
#: depends on the model, and base64 at 4 bytes a token would refuse what is servable) and a
#: generate `context` (already tokens: `GenerationRequest.prompt_tokens`). Every other field
#: counts, whatever its name.
NOT_PROMPT = frozenset(
    {"model", "stream", "stream_options", "options", "keep_alive", "images", "context"}
    | {"stop", "logit_bias", "metadata", "user"}
)

#: Fields of a message (`messages[]`) and of a content part (`content[]`) that hold media.
_MEDIA = frozenset({"images", "image_url", "input_audio", "audio_url", "video_url", "file"})


def prompt_bytes(body: dict[str, Any]) -> int:
    """Bytes of a generation body's prompt text: what its TPM estimate counts (bytes / 4).

    A denylist, not a list of prompt fields: every value of the body counts except the fields
    of `NOT_PROMPT` and the media of a message, so a field a client or a new Ollama or OpenAI
    release adds (tools, tool calls, thinking, a format schema, names) counts too. Upstreams
    render those into the prompt the model prefills. Strings and the keys below the top level
    count their UTF-8 bytes, numbers their digits, `true`/`false`/`null` 4, and each member of
    an object or array one byte more (its punctuation): close to the body's JSON text, which
    is how tools and schemas reach the model. Top-level field names and top-level numbers and
    flags are parameters, not text. One walk of the parsed body, bounded by
    `GATEWAY_MAX_JSON_VALUES`.

    Args:
        body: A parsed generation body (a chat or generate request of either surface).

    Returns:
        The byte count; 0 when nothing counts.
    """
    total = 0
    for name, value in body.items():
        if name in NOT_PROMPT:
            continue
        if name == "messages" and isinstance(value, list):
            total += sum(1 + _without_media(message) for message in value)
        elif isinstance(value, str | dict | list):
            total += _json_bytes(value)
    return total


def _without_media(value: object) -> int:
    """`_json_bytes` of a message or a content part, its media fields left out."""
    if not isinstance(value, dict):
        return _json_bytes(value)
    total = 0
    for name, member in value.items():
        if name in _MEDIA:
            continue
        if name == "content" and isinstance(member, list):  # OpenAI's parts: text or media
            size = sum(1 + _without_media(part) for part in member)
        else:
            size = _json_bytes(member)
        total += text_bytes(name) + 1 + size
    return total


def _json_bytes(value: object) -> int:
    """About the bytes of `value`'s JSON text (`prompt_bytes`); depth is bounded by parsing."""
    if isinstance(value, str):
        return text_bytes(value)
    if isinstance(value, dict):
        return sum(text_bytes(key) + 1 + _json_bytes(member) for key, member in value.items())
    if isinstance(value, list):
        return sum(1 + _json_bytes(member) for member in value)
    if isinstance(value, bool) or value is None:
        return 4
    return len(str(value))  # an int (at most `gateway.wire.json.MAX_INT_DIGITS`) or a finite float
