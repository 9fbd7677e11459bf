"""Prompt prefixes: the prompt's chained block hashes, and what went to which server.

A chat prompt is hashed message by message, each message's role and text together with the
hash of the messages before it, as vLLM's automatic prefix caching names its KV blocks (a
block's hash stands for the whole prefix up to it). Consecutive messages make one block once
they hold at least `block_chars` characters; the block's hash is the chain's value at its
last message, and its end is the characters up to there. So a conversation's next turn, which
repeats the earlier messages, repeats their blocks; each message's text is hashed once, with
no copy of the prompt. A prompt string (generate, completions) is cut into blocks of exactly
`block_chars` characters. In both, what follows the last full block is not hashed. Tools are
left out: their JSON would cost an encoding of tens of kilobytes per request, and the
messages already tell conversations apart.

`PrefixIndex` remembers, for each block hash recently sent, which servers were sent it (a
bit per server), in one LRU of bounded size (the Gateway API Inference Extension's
prefix-cache plugin keeps such an approximate index instead of reading the servers' caches).
A server's match is the number of leading blocks of the prompt it was sent.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

from gateway.neutral import GenerationRequest


class PromptBlocks(NamedTuple):
    """A prompt's blocks: their chained hashes, the characters up to each one's end, in all."""

    hashes: list[int]
    ends: list[int]
    chars: int


NO_BLOCKS = PromptBlocks([], [], 0)


def prompt_blocks(
    request: GenerationRequest, block_chars: int, limit: int, *, scope: str | None = None
) -> PromptBlocks:
    """The prompt's blocks (module docstring), at most `limit`; none for embeddings.

    Python's own `hash` (SipHash, salted per process): the index lives in one process, and a
    collision only costs a worse choice. `scope` (the API key's id) starts every chain, so the
    same prompt from two keys gives two chains (`RouteTicket.scope`).
    """
    if request.operation == "embed":
        return NO_BLOCKS
    body = request.body
    messages = body.get("messages")
    if isinstance(messages, list):
        return _message_blocks(body.get("system"), messages, block_chars, limit, hash(scope))
    texts = [body.get(name) for name in ("system", "prompt", "input")]
    text = "\x1e".join(t for t in texts if isinstance(t, str))
    return text_blocks(text, block_chars, limit, hash(scope))


def _message_blocks(
    system: object, messages: list[Any], block_chars: int, limit: int, start: int = 0
) -> PromptBlocks:
    """Blocks of whole messages, each at least `block_chars` characters; chained from `start`."""
    hashes: list[int] = []
    ends: list[int] = []
    # Ollama's chat may have a system field
    chained = hash((start, system)) if isinstance(system, str) else start
    chars = pending = len(system) if isinstance(system, str) else 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts: their texts
            content = tuple(
                part["text"]
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
            size = sum(map(len, content))
        elif isinstance(content, str):
            size = len(content)
        else:
            content, size = None, 0
        calls = message.get("tool_calls")
        chained = hash(
            (
                chained,
                role if isinstance(role, str) else None,
                content,
                None if calls is None else _calls_key(calls),
            )
        )
        chars += size
        pending += size
        if pending >= block_chars and len(hashes) < limit:
            hashes.append(chained)
            ends.append(chars)
            pending = 0
    return PromptBlocks(hashes, ends, chars)


def _calls_key(calls: object) -> object:
    """A hashable stand-in for a message's `tool_calls` that tells calls apart.

    OpenAI's shape (which the Anthropic and Responses surfaces translate to) as the strings
    it holds: id, name and the arguments' JSON text, about a fifth of the cost of `str()` of
    the list (which escapes every argument), per message of an agent's long history. Any
    other shape (Ollama's arguments are an object) falls back to `str()`.
    """
    if not isinstance(calls, list):
        return str(calls)
    key: list[object] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            key.append((str(call.get("id")), str(function.get("name")), function["arguments"]))
        else:
            key.append(str(call))
    return tuple(key)


def text_blocks(text: str, block_chars: int, limit: int, start: int = 0) -> PromptBlocks:
    """Chained hashes of the full `block_chars`-character blocks of `text`, at most `limit`.

    The chain starts from `start` (the scope's hash: `prompt_blocks`).
    """
    count = min(len(text) // block_chars, limit)
    hashes: list[int] = []
    chained = start
    for start in range(0, count * block_chars, block_chars):
        chained = hash((chained, text[start : start + block_chars]))
        hashes.append(chained)
    ends = list(range(block_chars, (count + 1) * block_chars, block_chars))
    return PromptBlocks(hashes, ends, len(text))


class PrefixIndex:
    """Which servers were recently sent which prompt blocks; at most `capacity` blocks.

    Each entry maps a block hash to a bit set of servers. Recording a prompt refreshes its
    blocks in the LRU; past `capacity` entries, the least recently sent go first, so memory
    is bounded whatever the traffic (a flood of unique prompts only cycles the LRU).

    Args:
        capacity: Most block hashes kept (`GATEWAY_ROUTING_PREFIX_BLOCKS`).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self._bits: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def _bit(self, server: str) -> int:
        bit = self._bits.get(server)
        if bit is None:
            bit = self._bits[server] = 1 << len(self._bits)
        return bit

    def match(self, hashes: list[int], servers: list[str]) -> dict[str, int]:
        """Leading blocks of `hashes` each of `servers` was sent; servers with none left out.

        A binary search per server, over the index's entries for `hashes` (each read once):
        what a server holds of a chain is always a prefix of it (`record`), so whether it
        holds block i falls from yes to no once along the prompt. So a 512-block prompt
        costs a few dozen lookups, not 512; the first and the last block answer the common
        cases (nobody has it, or everybody all of it) in one lookup each.
        """
        found: dict[str, int] = {}
        count = len(hashes)
        if not count:
            return found
        bits = self._bits
        blocks = self._blocks
        first = blocks.get(hashes[0], 0)
        if not first:
            return found
        last = blocks.get(hashes[-1], 0)
        seen = {0: first, count - 1: last}
        for server in servers:
            bit = bits.get(server)
            if bit is None:
                bit = self._bit(server)
            if not first & bit:
                continue
            if last & bit:
                found[server] = count
                continue
            low, high = 1, count - 1  # it holds block low - 1, not block high
            while low < high:
                middle = (low + high) // 2
                held = seen.get(middle)
                if held is None:
                    held = seen[middle] = blocks.get(hashes[middle], 0)
                if held & bit:
                    low = middle + 1
                else:
                    high = middle
            found[server] = low
        return found

    def record(self, hashes: list[int], server: str) -> None:
        """`server` was sent a prompt of these blocks: note them as its, most recent.

        Noted last to first, so a prompt's first blocks are its most recent and leave the LRU
        last: what is left of a prompt is always a prefix of it (as a server evicts a
        sequence's KV blocks from its tail), and a match never stops at an evicted hole.
        """
        bit = self._bit(server)
        blocks = self._blocks
        for block in reversed(hashes):
            held = blocks.get(block)
            if held is None:
                blocks[block] = bit
            else:
                blocks[block] = held | bit
                blocks.move_to_end(block)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def forget(self, server: str) -> int:
        """Drop everything noted for `server` (it restarted, or failed); returns blocks dropped.

        Walks the whole index: rare (a failure, a restart), and bounded by `capacity`.
        """
        bit = self._bits.get(server)
        if bit is None:
            return 0
        dropped = 0
        for block, held in list(self._blocks.items()):
            if held & bit:
                dropped += 1
                if held == bit:
                    del self._blocks[block]
                else:
                    self._blocks[block] = held & ~bit
        return dropped


class SessionIndex:
    """The server that last served each session key (hashed), at most `capacity` sessions."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._servers: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._servers)

    def get(self, session: int) -> str | None:
        """The server that last served `session`, or None."""
        return self._servers.get(session)

    def record(self, session: int, server: str) -> None:
        """`server` serves `session` now."""
        self._servers[session] = server
        self._servers.move_to_end(session)
        while len(self._servers) > self.capacity:
            self._servers.popitem(last=False)

    def forget(self, server: str) -> None:
        """Drop every session noted for `server`."""
        for session in [s for s, name in self._servers.items() if name == server]:
            del self._servers[session]
