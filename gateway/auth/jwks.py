"""An identity provider's signing keys (a JWKS, RFC 7517): fetched, cached, refreshed, bounded.

Owns `JwksCache`, which hands `gateway.auth.jwt` the public JWK (a plain mapping) a token's `kid`
names. It knows nothing of tokens, and does not import python-jose: turning a JWK into a key is
the verifier's job, so that jose stays in one module.

Refresh policy, one rule for a file and a URL alike:
- the keys are used for `cache_seconds`, then loaded again on the next lookup;
- a `kid` the cache does not hold triggers a reload, so a key the provider has just rotated in
  works at once;
- but at most one load (successful or not) starts per `min_refresh_seconds`
  (`GATEWAY_ADMIN_JWKS_MIN_REFRESH_SECONDS`, default `MIN_REFRESH_SECONDS`), so tokens with
  random kids cannot turn the gateway into a JWKS hammer, and a provider that is down is not
  asked again on every request;
- concurrent lookups share one load (single flight);
- a failed load keeps the last good keys, and is logged (the source and the reason, never a
  token).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx

from gateway.wire.json import parse_json

logger = logging.getLogger(__name__)

JWK = Mapping[str, Any]
"""One public key as the JWKS publishes it: `kty`, `kid`, and `n`/`e` or `crv`/`x`/`y`."""

MIN_REFRESH_SECONDS = 30.0
"""Default fewest seconds between two loads (`GATEWAY_ADMIN_JWKS_MIN_REFRESH_SECONDS`)."""
FETCH_TIMEOUT = 5.0
"""Seconds one JWKS fetch may take from connecting to the last byte."""
MAX_JWKS_BYTES = 256 * 1024
"""Largest JWKS accepted. Providers publish a few keys (a few KiB); more is a broken source."""
MAX_JWKS_DEPTH = 16
"""Deepest nesting accepted in a JWKS (a key's `x5c` list sits at level 4)."""
MAX_JWKS_VALUES = 50_000
"""Most JSON values accepted in a JWKS: a few hundred keys' worth."""
#: The members, by key type, that a usable public key has as strings (RFC 7518 section 6).
_MEMBERS = {"RSA": ("n", "e"), "EC": ("crv", "x", "y")}


class JwksError(Exception):
    """A JWKS could not be loaded: unreachable, not 200, too large, not a JWKS."""


def parse_jwks(data: bytes) -> dict[str, JWK]:
    """Return the usable keys of a JWKS document, by `kid`.

    Kept: RSA and EC keys with a `kid` and their public members (`n`, `e`; `crv`, `x`, `y`) as
    strings, for signatures (`use` absent or `sig`), public only.
    Symmetric (`oct`) keys are skipped: HMAC tokens are checked only with the gateway's own
    secret, never with a key a JWKS supplies. A key holding private material is skipped (and
    logged): a provider publishing it is misconfigured.

    Raises:
        JwksError: if `data` is not a JSON object with a `keys` list, or holds more than
            `MAX_JWKS_VALUES` values or nests deeper than `MAX_JWKS_DEPTH` levels.
    """
    try:
        document = parse_json(data, max_depth=MAX_JWKS_DEPTH, max_values=MAX_JWKS_VALUES)
    except ValueError as exc:
        raise JwksError(f"the document {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise JwksError('not a JWKS (no "keys" list)')
    keys: dict[str, JWK] = {}
    for entry in document["keys"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str):
            continue
        kty = entry.get("kty")
        members = _MEMBERS.get(kty) if isinstance(kty, str) else None
        if members is None or entry.get("use", "sig") != "sig":
            continue
        if not all(isinstance(entry.get(name), str) for name in members):
            continue  # jose would fail on it with errors of its own choosing: not a usable key
        if any(part in entry for part in ("d", "p", "q")):
            logger.warning("JWKS key %r holds private key material; ignored", entry["kid"])
            continue
        keys[entry["kid"]] = entry
    return keys


class JwksCache:
    """The signing keys of one JWKS source, loaded lazily and refreshed under the policy above.

    Args:
        load: Reads the JWKS document's bytes; raises `JwksError` (or `OSError`, `httpx`
            errors) on failure.
        source: What to name in logs (the URL or path).
        cache_seconds: How long loaded keys are used before the next lookup loads again.
        min_refresh_seconds: Fewest seconds between two loads, whatever triggers them.
        clock: Monotonic seconds; tests pass their own to step through the refresh policy.
        keys: Keys already loaded (by `from_file`), counted as loaded now.
    """

    def __init__(
        self,
        load: Callable[[], Awaitable[bytes]],
        *,
        source: str,
        cache_seconds: float,
        min_refresh_seconds: float = MIN_REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        keys: dict[str, JWK] | None = None,
    ) -> None:
        self._load = load
        self._source = source
        self._cache_seconds = cache_seconds
        self._min_refresh_seconds = min_refresh_seconds
        self._clock = clock
        self._keys: dict[str, JWK] = keys or {}
        self._loaded_at = clock() if keys is not None else None
        self._attempted_at = self._loaded_at
        self._attempts = 0
        self._lock = anyio.Lock()

    @classmethod
    def from_file(
        cls,
        path: Path,
        *,
        cache_seconds: float,
        min_refresh_seconds: float = MIN_REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> JwksCache:
        """Load a JWKS file now (a broken file stops start-up) and re-read it as it expires.

        Raises:
            JwksError: if the file cannot be read or holds no JWKS.
        """
        try:
            keys = parse_jwks(path.read_bytes())
        except OSError as exc:
            raise JwksError(f"cannot read JWKS file {path}: {exc.strerror}") from None

        async def load() -> bytes:
            return await anyio.Path(path).read_bytes()

        return cls(
            load,
            source=str(path),
            cache_seconds=cache_seconds,
            min_refresh_seconds=min_refresh_seconds,
            clock=clock,
            keys=keys,
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        http: httpx.AsyncClient,
        *,
        cache_seconds: float,
        min_refresh_seconds: float = MIN_REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> JwksCache:
        """Fetch the JWKS from `url` with `http` on first use (never at construction)."""

        async def load() -> bytes:
            with anyio.fail_after(FETCH_TIMEOUT):
                async with http.stream(
                    "GET", url, timeout=FETCH_TIMEOUT, follow_redirects=False
                ) as response:
                    if response.status_code != 200:
                        raise JwksError(f"status {response.status_code}")
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > MAX_JWKS_BYTES:
                            raise JwksError(f"larger than {MAX_JWKS_BYTES} bytes")
                    return bytes(body)

        return cls(
            load,
            source=url,
            cache_seconds=cache_seconds,
            min_refresh_seconds=min_refresh_seconds,
            clock=clock,
        )

    @property
    def loaded(self) -> bool:
        """Whether keys were ever loaded (false while the provider has been down since start)."""
        return self._loaded_at is not None

    async def key(self, kid: str) -> JWK | None:
        """Return the public JWK named `kid`, loading the JWKS first if the policy allows.

        Returns:
            The JWK, or None when the source does not publish `kid` (or cannot be reached and
            did not publish it when it last could).
        """
        now = self._clock()
        stale = self._loaded_at is None or now - self._loaded_at >= self._cache_seconds
        allowed = (
            self._attempted_at is None or now - self._attempted_at >= self._min_refresh_seconds
        )
        if (stale or kid not in self._keys) and allowed:
            await self._refresh(self._attempts)
        return self._keys.get(kid)

    async def _refresh(self, attempts_seen: int) -> None:
        async with self._lock:
            if self._attempts != attempts_seen:
                return  # another lookup loaded while this one waited: use its result
            self._attempts += 1
            self._attempted_at = self._clock()
            try:
                keys = parse_jwks(await self._load())
            except (JwksError, OSError, httpx.HTTPError, TimeoutError) as exc:
                logger.warning(
                    "loading the admin JWKS from %s failed (%s: %s); keeping the %d keys "
                    "loaded before, next try in %.0f s or later",
                    self._source,
                    type(exc).__name__,
                    exc,
                    len(self._keys),
                    self._min_refresh_seconds,
                )
                return
            self._keys = keys
            self._loaded_at = self._clock()
