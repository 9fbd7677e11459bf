"""Who a verified admin token names, what it allows, and why a token was refused.

Owns `Scope`, `AdminIdentity` and `AdminAuthError`; `gateway.auth.jwt` produces them (and
re-exports them), the admin API consumes them. No JWT library here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

Scope = Literal["admin", "read"]
"""`admin`: every admin operation; `read`: list, get, usage and audit only."""
SCOPES: frozenset[Scope] = frozenset(get_args(Scope))


@dataclass(frozen=True)
class AdminIdentity:
    """Who presented a valid admin token, and what it allows.

    Attributes:
        subject: The token's `sub`, non-printable characters removed (controls, bidi and
            zero-width ones), at most 200 characters: what the audit trail records.
        scopes: `{"read"}`, or `{"admin", "read"}` (admin includes everything read allows).
        issuer: The token's `iss` (`ISSUER` for the gateway's own tokens).
        token_id: The token's `jti`, if any.
        expires_at: When the token expires (its `exp`, UTC); None if not known.
    """

    subject: str
    scopes: frozenset[Scope]
    issuer: str | None
    token_id: str | None
    expires_at: datetime | None = None

    def require(self, scope: Scope) -> None:
        """Raise unless the token grants `scope`.

        Raises:
            AdminAuthError: 403 `token lacks the admin scope` (or `read`).
        """
        if scope not in self.scopes:
            raise AdminAuthError(403, f"token lacks the {scope} scope")


class AdminAuthError(Exception):
    """An admin token was refused.

    Attributes:
        status: 401 (no valid token) or 403 (a valid token without the scope needed).
        message: A sentence safe to show the client; never contains the token.
    """

    def __init__(self, status: Literal[401, 403], message: str) -> None:
        super().__init__(message)
        self.status: Literal[401, 403] = status
        self.message = message

    @property
    def www_authenticate(self) -> str:
        """The `WWW-Authenticate` header value for this refusal (RFC 6750 section 3)."""
        error = "invalid_token" if self.status == 401 else "insufficient_scope"
        return f'Bearer error="{error}", error_description="{self.message}"'
