"""The API key format and how its secret is hashed and checked.

A key reads `gw_<id>_<secret>`:

- `id` is 12 lowercase hex characters (48 random bits). It is not secret: it names the key in the
  store, in logs and in metrics, and is the primary key the store looks the key up by.
- `secret` is `secrets.token_urlsafe(32)` (256 random bits, 43 characters of `[A-Za-z0-9_-]`).
  Only `sha256(secret)` is stored.

This module is pure (no I/O); `gateway.keys.store` uses it to create and authenticate keys.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

KEY_PREFIX = "gw_"
"""Every key starts with this, so secret scanners and humans can recognise one."""

MAX_KEY_LENGTH = 256
"""Longest presented key `parse_key` accepts, in characters; a real key is 59."""

# The id is exactly what `secrets.token_hex(6)` makes; the secret is any non-empty run of the
# URL-safe base64 alphabet, which may itself contain `_`, so the split is at the first `_` after
# the id. `fullmatch` (not `$`) so a trailing newline is rejected too.
_KEY_PATTERN = re.compile(r"gw_(?P<id>[0-9a-f]{12})_(?P<secret>[A-Za-z0-9_-]+)")


def generate_key() -> tuple[str, str, str]:
    """Make a new random key.

    Returns:
        `(key_id, secret, full_key)`: the 12-hex-character id, the 256-bit URL-safe secret, and
        `gw_<key_id>_<secret>`, the string handed to the client once.
    """
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return key_id, secret, f"{KEY_PREFIX}{key_id}_{secret}"


def parse_key(presented: str) -> tuple[str, str] | None:
    """Split a presented key into its id and secret.

    Args:
        presented: The credential exactly as the client sent it (no surrounding whitespace).

    Returns:
        `(key_id, secret)`, or None when the string is not a well-formed key: wrong prefix, an id
        that is not 12 lowercase hex characters, an empty secret or one outside the URL-safe
        alphabet, non-ASCII text, or more than `MAX_KEY_LENGTH` characters.
    """
    if len(presented) > MAX_KEY_LENGTH or not presented.isascii():
        return None
    match = _KEY_PATTERN.fullmatch(presented)
    if match is None:
        return None
    return match["id"], match["secret"]


def hash_secret(secret: str) -> str:
    """Hash a key's secret for storage.

    A single unsalted SHA-256 is enough here, and deliberately fast: the secret is 256 bits from
    `secrets`, not a human password, so there is no dictionary to attack and nothing for a slow
    KDF (bcrypt, argon2) to protect; it would only add latency to every request.

    Args:
        secret: The secret part of a key (after `gw_<id>_`).

    Returns:
        The SHA-256 digest of the UTF-8 secret as 64 lowercase hex characters.
    """
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    """Check a presented secret against a stored hash in constant time.

    The comparison is between the two hashes, so its time depends on neither the secret nor how
    many leading characters match.

    Args:
        secret: The secret part of the presented key.
        stored_hash: The hex digest from `hash_secret`, as stored.

    Returns:
        True when `hash_secret(secret)` equals `stored_hash`.
    """
    return hmac.compare_digest(hash_secret(secret).encode(), stored_hash.encode())
