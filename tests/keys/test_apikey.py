from __future__ import annotations

import hashlib
import re

import pytest

from gateway.keys.apikey import (
    MAX_KEY_LENGTH,
    generate_key,
    hash_secret,
    parse_key,
    secret_matches,
)


def test_generate_key_has_documented_format() -> None:
    key_id, secret, full_key = generate_key()

    assert re.fullmatch(r"[0-9a-f]{12}", key_id)
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", secret)
    assert full_key == f"gw_{key_id}_{secret}"


def test_generate_key_is_random() -> None:
    keys = {generate_key()[2] for _ in range(100)}

    assert len(keys) == 100


def test_parse_key_round_trips_generated_keys() -> None:
    for _ in range(200):
        key_id, secret, full_key = generate_key()

        assert parse_key(full_key) == (key_id, secret)


def test_parse_key_splits_at_first_underscore_after_id() -> None:
    assert parse_key("gw_0123456789ab__x-y_z") == ("0123456789ab", "_x-y_z")


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "gw_",
        "gw_0123456789ab",
        "gw_0123456789ab_",
        "sk_0123456789ab_secret",
        "GW_0123456789ab_secret",
        "gw_0123456789AB_secret",
        "gw_0123456789a_secret",
        "gw_0123456789abc_secret",
        "gw_0123456789xz_secret",
        "gw_0123456789ab_sec ret",
        "gw_0123456789ab_secret\n",
        " gw_0123456789ab_secret",
        "gw_0123456789ab_sécret",
        "gw_\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669ab_secret",
        "Bearer gw_0123456789ab_secret",
        "gw_0123456789ab_" + "a" * (MAX_KEY_LENGTH - len("gw_0123456789ab_") + 1),
    ],
)
def test_parse_key_rejects_malformed(presented: str) -> None:
    assert parse_key(presented) is None


def test_parse_key_accepts_longest_allowed() -> None:
    presented = "gw_0123456789ab_" + "a" * (MAX_KEY_LENGTH - len("gw_0123456789ab_"))

    assert len(presented) == MAX_KEY_LENGTH
    assert parse_key(presented) is not None


def test_hash_secret_is_sha256_hex() -> None:
    assert hash_secret("abc") == hashlib.sha256(b"abc").hexdigest()
    assert len(hash_secret("abc")) == 64


def test_secret_matches_only_the_right_secret() -> None:
    _, secret, _ = generate_key()
    stored = hash_secret(secret)

    assert secret_matches(secret, stored)
    assert not secret_matches(secret + "x", stored)
    assert not secret_matches(secret, hash_secret("other"))
    assert not secret_matches(secret, "")
