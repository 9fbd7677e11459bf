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
            load the request adds to its upstream until its first chunk; at most
            `MAX_TICKET_TOKENS` (`capped`).
        output: The expected output tokens among them: the load it leaves there from its first
            chunk on, the prompt being prefilled by then.
        session: A hash of the client's session key (`x-claude-code-session-id`,
            `prompt_cache_key`, `user`), or None.
        request: The neutral request whose prompt is hashed; None: no prompt (tests,
            model management).
        reason: Why the last choice went where it went (`REASONS`); None before a choice.
        prefix_tokens: Estimated prompt tokens the chosen upstream already had (0: none).
        charged: The tokens it added to its upstream's load at the choice (`work` then), taken
            off again when it ends.
        prefill: Of those, its prompt tokens until its first chunk (0 after, or not sent).
        answered_at: `time.monotonic()` when the chosen upstream answered (None: not yet),
            so the slot's hold can be measured at the end (`Scheduler.held`).
        scope: Whose prompts these are (the API key's id): the prefix chain and the session
            start from it, so a key matches only its own earlier prompts. Shared across keys,
            the index would tell one key, through routing, timing and
            `gateway_route_prefix_hit_tokens`, whether another key sent a given prompt.
    """

    model: str
    tokens: int = 0
    output: int = 0
    session: int | None = None
    request: GenerationRequest | None = None
    reason: str | None = None
    prefix_tokens: int = 0
    scope: str | None = None
    answered_at: float | None = None
    charged: int = 0
    prefill: int = 0
    _blocks: PromptBlocks | None = field(default=None, repr=False)

    @property
    def work(self) -> int:
        """Tokens of work it brings the chosen upstream: `tokens` less the prefix it holds.

        A conversation's next turn, sent where its history is cached, costs that server only
        its new tail and the answer, which is what the next request there waits behind.
        """
        return max(0, self.tokens - self.prefix_tokens)

    def blocks(self, block_chars: int, limit: int) -> PromptBlocks:
        """The prompt's blocks (`prefixes.prompt_blocks`), computed once."""
        if self._blocks is None:
            request = self.request
            self._blocks = (
                NO_BLOCKS
                if request is None
                else prompt_blocks(request, block_chars, limit, scope=self.scope)
            )
        return self._blocks


#: The most tokens one request adds to its upstream's load (`RouteTicket.tokens`): a model's
#: context is at most this long on the servers the gateway fronts, so a huge prompt, which the
#: server cuts to its context anyway, cannot make its upstream look busy for every other key.
MAX_TICKET_TOKENS = 32768

#: The client header that names a conversation (Claude Code sends one per session).
SESSION_HEADER = "x-claude-code-session-id"


def capped(tokens: int) -> int:
    """`tokens` as a ticket counts them: at most `MAX_TICKET_TOKENS`."""
    return min(tokens, MAX_TICKET_TOKENS)


def session_of(body: dict[str, object], header: str | None, scope: str | None = None) -> int | None:
    """A hash of the request's session key, or None when it names none.

    The key is the first of: the `x-claude-code-session-id` header, the body's
    `prompt_cache_key` (OpenAI's prompt-caching hint, sent to keep a conversation on one
    cache), its `user`, or Anthropic's `metadata.user_id`. Only its hash is kept, so the
    index never holds what a client wrote; with `scope` (the key's id) in it, one key cannot
    steer its requests to another key's session by naming it.
    """
    key: object = header
    if not key:
        key = body.get("prompt_cache_key") or body.get("user")
    if not key:
        metadata = body.get("metadata")
        key = metadata.get("user_id") if isinstance(metadata, dict) else None
    return hash((scope, key)) if isinstance(key, str) and key else None
