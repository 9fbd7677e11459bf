"""What one request carries to the upstream choice, from admission to `UpstreamPool.choose`."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.neutral import GenerationRequest
from gateway.upstream.scheduling.prefixes import NO_BLOCKS, PromptBlocks, prompt_blocks


@dataclass(slots=True)
class RouteTicket:
    """One request's routing inputs and, once chosen, the choice (`gateway.upstream.scheduling`).

    The prompt's block hashes are computed at most once, and only when a policy asks for them
    (`blocks`): the default policy never hashes the prompt.

    Attributes:
        model: The model that runs (after aliases).
        tokens: Estimated prompt + expected output tokens (`gateway.limits.estimate`), the
            load the request adds to its upstream while in flight.
        session: A hash of the client's session key (`x-claude-code-session-id`,
            `prompt_cache_key`, `user`), or None.
        request: The neutral request whose prompt is hashed; None: no prompt (tests,
            model management).
        reason: Why the last choice went where it went (`REASONS`); None before a choice.
        prefix_tokens: Estimated prompt tokens the chosen upstream already had (0: none).
    """

    model: str
    tokens: int = 0
    session: int | None = None
    request: GenerationRequest | None = None
    reason: str | None = None
    prefix_tokens: int = 0
    _blocks: PromptBlocks | None = field(default=None, repr=False)

    def blocks(self, block_chars: int, limit: int) -> PromptBlocks:
        """The prompt's blocks (`prefixes.prompt_blocks`), computed once."""
        if self._blocks is None:
            request = self.request
            self._blocks = (
                NO_BLOCKS if request is None else prompt_blocks(request, block_chars, limit)
            )
        return self._blocks


#: The client header that names a conversation (Claude Code sends one per session).
SESSION_HEADER = "x-claude-code-session-id"


def session_of(body: dict[str, object], header: str | None) -> int | None:
    """A hash of the request's session key, or None when it names none.

    The key is the first of: the `x-claude-code-session-id` header, the body's
    `prompt_cache_key` (OpenAI's prompt-caching hint, sent to keep a conversation on one
    cache), its `user`, or Anthropic's `metadata.user_id`. Only its hash is kept, so the
    index never holds what a client wrote.
    """
    key: object = header
    if not key:
        key = body.get("prompt_cache_key") or body.get("user")
    if not key:
        metadata = body.get("metadata")
        key = metadata.get("user_id") if isinstance(metadata, dict) else None
    return hash(key) if isinstance(key, str) and key else None
