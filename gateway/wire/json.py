"""Checking client request bodies before anything is sent upstream (field failure F-36).

Every surface parses its bodies here (`parse_object`), then checks their shape itself
(`gateway.api.ollama.schema`, `gateway.api.openai.schema`). Status codes: 400 for a body that
is not JSON (what Ollama answers, reference section 1: "Malformed JSON ... → 400"), 422 for
JSON of the wrong shape (the surfaces' checks).

The body the gateway checks must be the body Ollama acts on (issue 11). Ollama is Go: its
`encoding/json` matches object keys to struct fields case-insensitively (Unicode simple
folding: the Kelvin sign U+212A matches `k`, the long s U+017F matches `s`) and the last match
wins, while Python's `json` keeps keys exact. `{"model":"a","MODEL":"b"}` would be authorised
for `a` and served as `b`; so an object whose keys repeat, exactly or up to case, is refused at
any depth, and so is a differently-cased spelling of a request or message field.

Parsing work is bounded before the parser runs: a body within the size limit can still hold
millions of tiny values (`[0,0,...]`) that keep the one event loop busy for seconds.
`count_values` bounds the number of values with byte counts that run at C speed. A body over
`INLINE_PARSE_BYTES` is then parsed and checked in a worker thread (`parse_request_body`): the
parser's hooks (numbers, objects) and the checks after it are Python, so the interpreter hands
the GIL back to the event loop's thread every switch interval; the C-bound steps (the count,
the UTF-8 decoding, a run of strings without a hook) each take a few tens of milliseconds at
most at the 16 MiB body limit.

Every other JSON document from outside (an admin token's header and claims, an identity
provider's JWKS, tool-call arguments, an upstream's model list or error body) is parsed with
`parse_json`: the same bounds on values and depth, one `ValueError` for whatever is wrong, and
never the `RecursionError` of a deeply nested document.

Over ~300 lines for one reason: every bound on a client's JSON body (values, depth, key
folding, the hand-off to a thread, the bytes the TPM estimate counts) sits in one place, so
every surface parses through the same checks.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

import anyio

from gateway.errors import BadRequestError, UnprocessableError

T = TypeVar("T")
#: What `parse_request_body` hands its parser besides the bytes (the surfaces' settings).
C = TypeVar("C")

#: Largest answer body parsed (or non-streamed answer written) on the event loop; a larger one
#: goes to a worker thread (1 MiB of embeddings parses in a few milliseconds; a thread hop costs
#: ~100 us, and the Python number hooks of the dialects' `THREADED_JSON` a tenth more per
#: number). Here, below both the request bodies (`parse_request_body`) and the upstream
#: dialects (`gateway.upstream.dialects.framing`), which share the bound and the threads.
INLINE_PARSE_BYTES = 1024 * 1024

#: Most request bodies parsed, or upstream requests written, in worker threads at once: a flood
#: of large bodies waits for these, and leaves the rest of the thread pool to other work.
JSON_THREADS = 2

_json_limiters: WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = (
    WeakKeyDictionary()
)


def json_thread_limiter() -> anyio.CapacityLimiter:
    """The running event loop's limiter of `JSON_THREADS` (one per loop: tests run several)."""
    loop = asyncio.get_running_loop()
    limiter = _json_limiters.get(loop)
    if limiter is None:
        limiter = _json_limiters[loop] = anyio.CapacityLimiter(JSON_THREADS)
    return limiter


#: Longest model name accepted (Ollama names are `namespace/name:tag`, far shorter).
MAX_MODEL_NAME = 256


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


#: Longest integer literal accepted, sign included. Turning a decimal string into an int costs
#: time quadratic in its digits (a few thousand 4,000-digit numbers held the event loop for a
#: second); no Ollama or OpenAI field needs more than a 64-bit integer (20 digits).
MAX_INT_DIGITS = 32


def _bounded_int(text: str) -> int:
    """Parse a JSON integer; refuse literals longer than `MAX_INT_DIGITS`."""
    if len(text) > MAX_INT_DIGITS:
        raise ValueError(f"integer {text[:20]}... has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _finite_float(text: str) -> float:
    """Parse a JSON number; refuse ones that overflow to infinity (`1e999`)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


#: The bytes that begin a value after the first in a container (`,`) or a container (`[`, `{`).
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b",[{")


def count_values(raw: bytes, limit: int) -> int:
    """Return the count of JSON values in `raw` that `GATEWAY_MAX_JSON_VALUES` limits.

    Every value but the outermost is either a container's first element or follows a `,`, so
    `1 + (count of , [ { outside strings)` bounds the values from above (an empty container
    counts twice). Counting those bytes anywhere is a cheaper first bound; only when it passes
    `limit` are the strings cut out. Invalid JSON may be over-counted: it is refused either way.

    Args:
        raw: The request body (any bytes).
        limit: The count past which the exact figure does not matter.

    Returns:
        `1 + (count of , [ { outside strings)`: at least the number of values and at most
        twice it. A figure up to `limit` may also count those bytes inside strings (the cheap
        pass); a figure above it, only once the exact count passes `limit` too (or at least a
        quarter of the quotes do).
    """
    bound = len(raw.translate(None, _NOT_STRUCTURAL)) + 1
    if bound <= limit:
        return bound
    if b"\\" in raw:  # a backslash: escapes to drop, escaped backslashes first, so that
        # every backslash-quote left is an escaped quote
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    quotes = raw.count(b'"')
    # Each string is a key or a value, and an object has as many values as keys: past this
    # many quotes the values pass `limit`, and splitting would make that many objects.
    if quotes > 4 * limit:
        return max(limit + 1, quotes // 4)
    outside = b"".join(raw.split(b'"')[::2])
    return len(outside.translate(None, _NOT_STRUCTURAL)) + 1


class _RepeatedKeyError(ValueError):
    """An object repeats a key, exactly or up to case (what Go's decoder would fold together)."""


def _shown(key: str) -> str:
    """Quote a client's key for an error message, cut short (it is the client's text)."""
    return repr(key if len(key) <= 40 else key[:40] + "...")


def _fold(key: str) -> str:
    """Fold `key` so that keys Go's `encoding/json` matches to each other fold alike.

    `str.casefold` identifies at least what Go's simple folding does (the Kelvin sign and the
    long s included) except the dotless i U+0131, which Go folds with `I` and `i`. It also
    folds a few that Go keeps apart (`ß` and `ss`): that only refuses bodies no client sends.
    """
    return key.casefold().replace("\u0131", "i")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` of `parse_body`: the object as a dict, if no two keys fold together.

    Keys are compared by `_fold`.

    Raises:
        _RepeatedKeyError: two keys are equal, or equal up to case.
    """
    obj = dict(pairs)
    if len(pairs) < 2:
        return obj
    if len(obj) == len(pairs):
        # The common case, ASCII keys, folds with a method call (a third of the cost).
        fold = str.lower if "".join(obj).isascii() else _fold
        if len({fold(key) for key in obj}) == len(obj):
            return obj
    seen: dict[str, str] = {}
    for key, _ in pairs:
        first = seen.get(_fold(key))
        if first is None:
            seen[_fold(key)] = key
        elif first == key:
            raise _RepeatedKeyError(f"request body repeats the key {_shown(key)}")
        else:
            raise _RepeatedKeyError(
                f"request body has both {_shown(first)} and {_shown(key)}: keys may not "
                "differ only in case"
            )
    return obj  # pragma: no cover - a repeat was found above


def check_spelling(obj: dict[str, Any], where: str) -> None:
    """Refuse keys Go would match to a lowercase field the gateway reads by its exact name.

    Ollama's request and message fields are all lowercase; `{"Options": {...}}` reaches its
    `options` while the gateway, reading `options`, saw none (and metered none).

    Raises:
        BadRequestError: a key is not its own `_fold`.
    """
    for key in obj:
        if _fold(key) != key:
            raise BadRequestError(
                f"{where} key {_shown(key)} is not lowercase: field names are case-sensitive here"
            )


def nesting_depth(value: Any, limit: int) -> int:
    """Return the nesting depth of `value` (a scalar counts one), stopping once past `limit`.

    One level at a time, the per-element work in a list comprehension: at the value limit
    this takes a few milliseconds where a stack of (item, level) pairs took tens.
    """
    deepest = 1
    level = [value] if isinstance(value, dict | list) else []
    depth = 1  # of the containers in `level`
    while level and deepest <= limit:
        below: list[Any] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            if children:
                deepest = depth + 1
                below += [child for child in children if isinstance(child, dict | list)]
        level = below
        depth += 1
    return deepest


def _loads(text: str, object_pairs_hook: Any = None) -> Any:
    """`json.loads` refusing `NaN`/`Infinity`, numbers that overflow and over-long integers."""
    return json.loads(
        text,
        parse_constant=_reject_constant,
        parse_float=_finite_float,
        parse_int=_bounded_int,
        object_pairs_hook=object_pairs_hook,
    )


class JsonLimitError(ValueError):
    """JSON from outside the gateway that is invalid, too deep or holds too many values."""


def parse_json(raw: bytes | str, *, max_depth: int, max_values: int) -> Any:
    """Parse JSON that came from outside the gateway, within bounds on its parsing work.

    For every JSON document a client, an identity provider or an upstream supplies that is not
    a request body (`parse_object`): a token's header and claims, a JWKS, tool-call
    arguments, an upstream's model list or error body. Python's parser recurses once per level, so
    a deep enough document raises `RecursionError` (which no `except ValueError` catches) and a
    merely deep one leaves a structure that recursive code after it cannot walk; many tiny
    values cost time in proportion. Both are refused here, as one `ValueError`.

    Args:
        raw: The document (bytes must be UTF-8).
        max_depth: Deepest nesting accepted (a scalar is 1, `[1]` is 2).
        max_values: Most values accepted (`count_values`), checked before parsing.

    Returns:
        The parsed value (any JSON type).

    Raises:
        JsonLimitError: its message a predicate for the document (`is nested deeper than 8
            levels`): invalid UTF-8 or JSON (`NaN`, overflowing numbers and integers over
            `MAX_INT_DIGITS` included), more than `max_values` values, deeper than `max_depth`.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if count_values(data, max_values) > max_values:
        raise JsonLimitError(f"holds more than {max_values} JSON values")
    try:
        value = _loads(data.decode("utf-8") if isinstance(raw, bytes) else raw)
    except UnicodeDecodeError:
        raise JsonLimitError("is not valid UTF-8") from None
    except RecursionError:
        raise JsonLimitError(f"is nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise JsonLimitError(f"is not valid JSON: {exc}") from None
    if nesting_depth(value, max_depth) > max_depth:
        raise JsonLimitError(f"is nested deeper than {max_depth} levels")
    return value


def parse_arguments(text: str) -> Any:
    """Parse a tool call's `arguments`, a JSON document inside a JSON string.

    A client's (from its chat history) or an upstream's (from its answer): either may send a
    body's worth, so the bounds are the request body defaults (`GATEWAY_MAX_JSON_DEPTH`,
    `GATEWAY_MAX_JSON_VALUES`).

    Raises:
        JsonLimitError: as `parse_json`.
    """
    return parse_json(text, max_depth=64, max_values=100_000)


def parse_listing(raw: bytes) -> Any:
    """Parse an upstream's model list (`/api/tags`, `/v1/models`) or `/api/ps` answer.

    16 levels (an entry's `details` sit at level 4) and a million values (thousands of models).

    Raises:
        JsonLimitError: as `parse_json`.
    """
    return parse_json(raw, max_depth=16, max_values=1_000_000)


def parse_object(raw: bytes, *, max_depth: int, max_values: int = 100_000) -> dict[str, Any]:
    """Parse a request body that must be one JSON object with a model name.

    Args:
        raw: The request body.
        max_depth: Deepest nesting accepted.
        max_values: Most JSON values accepted (`count_values`), checked before parsing.

    Returns:
        The body as a dict, with `model` a non-empty string of at most `MAX_MODEL_NAME`.

    Raises:
        BadRequestError: empty body, too many values, invalid UTF-8, invalid JSON (including
            `NaN`, numbers that overflow, integers over `MAX_INT_DIGITS`), too deep, an object
            with a key repeated exactly or up to case, a top-level key that is not lowercase.
        UnprocessableError: not an object; `model` missing, too long or not a string;
            `stream` not a bool.
    """
    if not raw.strip():
        raise BadRequestError("missing request body")
    if count_values(raw, max_values) > max_values:
        raise BadRequestError(f"request body holds more than {max_values} JSON values")
    try:
        body = _loads(raw.decode("utf-8"), _unique_keys)
    except UnicodeDecodeError as exc:
        raise BadRequestError("request body is not valid UTF-8") from exc
    except _RepeatedKeyError as exc:
        raise BadRequestError(str(exc)) from exc
    except (ValueError, RecursionError) as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise UnprocessableError("request body must be a JSON object")
    if nesting_depth(body, max_depth) > max_depth:
        raise BadRequestError(f"request body is nested deeper than {max_depth} levels")
    check_spelling(body, "request body")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise UnprocessableError("model is required")
    if len(model) > MAX_MODEL_NAME:
        raise UnprocessableError(f"model name is longer than {MAX_MODEL_NAME} characters")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise UnprocessableError("stream must be true or false")
    return body


async def parse_request_body(parse: Callable[[bytes, C], T], raw: bytes, settings: C) -> T:
    """`parse(raw, settings)`: on the event loop, or in a worker thread for a large body.

    A body over `INLINE_PARSE_BYTES` (1 MiB), or over `INLINE_ALWAYS_BYTES` (64 KiB) with more
    than `INLINE_VALUES` JSON values, is parsed in a thread, at most `JSON_THREADS` at once (a
    flood of large bodies waits for those, not for the pool other work needs): its parse and
    checks held the loop for up to ~0.3 s. A smaller one costs the thread hop nothing (a
    typical chat body parses in tens of microseconds).

    Args:
        parse: A surface's body check (`parse_object` and the shape checks after it).
        raw: The request body.
        settings: Passed on to `parse` (the surfaces' `Settings`; nothing here reads it).

    Raises:
        Whatever `parse` raises.
    """
    if len(raw) <= INLINE_ALWAYS_BYTES or (
        len(raw) <= INLINE_PARSE_BYTES and count_values(raw, INLINE_VALUES) <= INLINE_VALUES
    ):
        return parse(raw, settings)
    return await anyio.to_thread.run_sync(parse, raw, settings, limiter=json_thread_limiter())


#: A body this small is parsed on the event loop whatever it holds (a few milliseconds at most).
INLINE_ALWAYS_BYTES = 64 * 1024
#: Up to 1 MiB, a body of at most this many JSON values is parsed on the loop too: its cost is
#: per value (the key hooks), not per byte. 95,000 keys in just under 1 MiB held the loop 0.16 s
#: each; eight connections of them paused another key's stream for seconds (a re-attack).
INLINE_VALUES = 4096
