"""What makes a key valid: the rules for the fields an admin sets, and the errors of the key store.

Each rule exists in two forms, pure functions both:
- `check_*` take Python values and raise `ValueError`; `gateway.keys.store` enforces them.
- `parse_*` are argparse `type`s that read the same fields from the command line and raise
  `argparse.ArgumentTypeError`, so `gateway keys` reports bad input as a usage error (exit 2)
  before it opens the store.

`UNSET` marks a limit or permission that an update leaves alone. `KeyNotFoundError` and
`InvalidKeyError` are raised by the store and re-exported from it.
"""

from __future__ import annotations

import argparse
import enum
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

InvalidKeyReason = Literal["malformed", "unknown", "revoked", "expired"]

MAX_NAME_LENGTH = 200
MAX_MODEL_LENGTH = 200
"""The longest model name in an allow-list: the usage table's model column."""
MAX_MODELS = 1000
"""Most names in one allow-list (far above any real deployment's catalogue)."""
MAX_LIMIT = 2**31 - 1
"""The largest per-key limit: PostgreSQL's `integer`, so both backends accept the same values."""
_DURATION = re.compile(r"([1-9][0-9]*)([smhdw])")
_MAX_LIFETIME = timedelta(days=36525)
MAX_GRACE = timedelta(days=30)
"""The longest a rotated-out secret keeps working: long enough to roll out a new key, short
enough that a leaked old secret dies."""


class Unset(enum.Enum):
    """The type of `UNSET` (an enum, so that mypy narrows `int | None | Unset` by `isinstance`)."""

    UNSET = enum.auto()


UNSET: Final = Unset.UNSET
"""A field an update leaves alone, as opposed to None, which for a limit means "the default"."""


def check_name(name: str) -> str:
    """Return `name` if it is a valid key name.

    Names are printed as they are by `gateway keys list` and other commands, in an operator's
    terminal, and an admin API token can set them: a control character (an ANSI escape, a
    newline), a bidi override or other invisible format character could forge or hide output.

    Raises:
        ValueError: if it is blank, longer than 200 characters, or holds a character that is not
            printable (`str.isprintable`; the space is).
    """
    if not name.strip() or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"key name must be 1 to {MAX_NAME_LENGTH} characters")
    if not name.isprintable():
        raise ValueError("key name must not hold control or invisible formatting characters")
    return name


def check_models(models: Sequence[str] | None) -> list[str] | None:
    """Return the allow-list as stored: None (every model), or the distinct names in order.

    Raises:
        ValueError: on a bare string (a sequence of characters, almost surely a mistake), an
            empty list (which would allow nothing; None allows everything), more than
            `MAX_MODELS` names, or a name that is not a string, is blank, longer than
            `MAX_MODEL_LENGTH` or not printable (as for `check_name`: names are printed).
    """
    if isinstance(models, str):
        raise ValueError("models must be a sequence of names, not a string")
    if models is None:
        return None
    if not models:
        raise ValueError("models must be None (all models) or a non-empty list")
    if len(models) > MAX_MODELS:
        raise ValueError(f"an allow-list holds at most {MAX_MODELS} models")
    for model in models:
        if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_LENGTH:
            raise ValueError(f"each model name must be 1 to {MAX_MODEL_LENGTH} characters")
        if not model.isprintable():
            raise ValueError("model names must not hold control or invisible characters")
    return list(dict.fromkeys(models))


def check_expiry(expires_at: datetime | None) -> datetime | None:
    """Return an expiry as stored: None (never) or the aware time in UTC.

    Raises:
        ValueError: on a naive datetime (its zone would be a guess) or a non-datetime.
    """
    if expires_at is None:
        return None
    if not isinstance(expires_at, datetime):
        raise ValueError(f"expires_at must be a datetime or None, not {expires_at!r}")
    if expires_at.tzinfo is None or expires_at.utcoffset() is None:
        raise ValueError(f"naive datetime {expires_at!r}: pass a timezone-aware one")
    try:
        return expires_at.astimezone(UTC)
    except OverflowError:  # year 9999 at -14:00 is year 10000 in UTC
        raise ValueError("expires_at is out of range in UTC (years 1 to 9999)") from None


def check_grace(grace: timedelta) -> timedelta:
    """Return a rotation's grace period if it is 0 to `MAX_GRACE`.

    Raises:
        ValueError: if it is negative, longer than 30 days, or not a timedelta.
    """
    if not isinstance(grace, timedelta):
        raise ValueError(f"grace must be a timedelta, not {grace!r}")
    if not timedelta(0) <= grace <= MAX_GRACE:
        raise ValueError("the grace period must be 0 to 30 days")
    return grace


def check_limit(field: str, value: int | None) -> int | None:
    """Return a per-key limit (`rpm`, `tpm` or `max_concurrent`) if it is valid.

    Args:
        field: The limit's name, for the error message.
        value: None (use the gateway's default), 0 (unlimited) or a positive limit.

    Raises:
        ValueError: if `value` is negative, above `MAX_LIMIT`, or not an integer (a bool
            included, since `True` would silently mean 1).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an integer or None, not {value!r}")
    if not 0 <= value <= MAX_LIMIT:
        raise ValueError(
            f"{field} must be 0 (unlimited) to {MAX_LIMIT}, or None (the default); got {value}"
        )
    return value


def check_permission(field: str, value: bool) -> bool:
    """Return a key permission (`manage_models`) if it is a bool.

    Raises:
        ValueError: on anything else, since `1`, `"no"` or None would grant or clear it by a
            truthiness the caller may not have meant.
    """
    if not isinstance(value, bool):
        raise ValueError(f"{field} must be True or False, not {value!r}")
    return value


def limit_changes(**limits: int | Unset | None) -> dict[str, int | None]:
    """Return the given limits (those not `UNSET`), each checked with `check_limit`.

    Raises:
        ValueError: if a given limit is invalid.
    """
    return {
        field: check_limit(field, value)
        for field, value in limits.items()
        if not isinstance(value, Unset)
    }


def parse_duration(text: str) -> timedelta:
    """Parse a key lifetime such as `90s`, `15m`, `12h`, `30d` or `2w` (an argparse `type`).

    Raises:
        argparse.ArgumentTypeError: on any other form, zero, or more than 100 years.
    """
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a positive whole number and one unit "
            "(s, m, h, d or w), for example 90s, 15m, 12h, 30d or 2w"
        )
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[match[2]]
    try:
        lifetime = timedelta(**{unit: int(match[1])})
    except OverflowError:
        lifetime = timedelta.max
    if lifetime > _MAX_LIFETIME:
        raise argparse.ArgumentTypeError(f"duration {text!r} is longer than 100 years")
    return lifetime


def parse_grace(text: str) -> timedelta:
    """Parse a rotation's grace period: `0` or a duration up to 30 days (an argparse `type`).

    Raises:
        argparse.ArgumentTypeError: on anything else.
    """
    if text == "0":
        return timedelta(0)
    grace = parse_duration(text)
    if grace > MAX_GRACE:
        raise argparse.ArgumentTypeError(f"grace period {text!r} is longer than 30 days")
    return grace


def parse_models(text: str) -> list[str]:
    """Parse `--models a,b` into distinct, stripped names (an argparse `type`).

    Raises:
        argparse.ArgumentTypeError: if no name is given.
    """
    names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names:
        raise argparse.ArgumentTypeError("give at least one model name, for example llama3.2:1b")
    return names


def parse_limit(text: str) -> int:
    """Parse a per-key limit: a whole number, `0` meaning unlimited (an argparse `type`).

    Raises:
        argparse.ArgumentTypeError: on anything else, a negative number included, or a number
            above `MAX_LIMIT`.
    """
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(
            f"invalid limit {text!r}: use a whole number, 0 for unlimited"
        )
    if int(text) > MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"limit {text} is above the maximum, {MAX_LIMIT}")
    return int(text)


def parse_limit_or_default(text: str) -> int | None:
    """Parse a `keys update` limit: `default` (None: back to the settings' default) or a number.

    Raises:
        argparse.ArgumentTypeError: on anything but `default` or what `parse_limit` accepts.
    """
    if text == "default":
        return None
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(
            f"invalid limit {text!r}: use a whole number, 0 for unlimited, or `default`"
        )
    return parse_limit(text)


def parse_name(text: str) -> str:
    """Parse `--name` with `check_name` (an argparse `type`).

    Raises:
        argparse.ArgumentTypeError: if `check_name` rejects it.
    """
    try:
        return check_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class KeyNotFoundError(LookupError):
    """No key has this id (raised by admin operations: get, update_limits, revoke, rotate)."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"no API key with id {key_id!r}")
        self.key_id = key_id


class InvalidKeyError(Exception):
    """A presented key cannot be used.

    Attributes:
        reason: `malformed` (not `gw_<id>_<secret>`), `unknown` (no such id, or a wrong secret:
            the two are deliberately indistinguishable), `revoked`, or `expired`.
        message: A sentence safe to show the client.
    """

    def __init__(self, reason: InvalidKeyReason) -> None:
        if reason == "revoked":
            message = "API key has been revoked"
        elif reason == "expired":
            message = "API key has expired"
        else:
            message = "invalid API key"
        super().__init__(message)
        self.reason: InvalidKeyReason = reason
        self.message = message
