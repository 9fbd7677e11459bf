"""The admin-auth settings: weak secrets refused at start-up, JWKS settings checked together.

Kept apart from tests/test_settings.py so the settings of each feature are tested (and merged)
on their own.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.settings import Settings

JWKS = {
    "admin_jwks_url": "https://sso.example.com/realms/acme/protocol/openid-connect/certs",
    "admin_jwt_issuer": "https://sso.example.com/realms/acme",
    "admin_jwt_audience": "llm-gateway",
    "admin_jwt_admin_values": ["gateway-admin"],
}


@pytest.mark.parametrize(
    "weak",
    [
        "",
        "changeme",
        "secret",
        "your-secret-here",
        secrets.token_urlsafe(23),  # 31 characters
        "a" * 64,
        "ab" * 32,
        "0123456789" * 4,  # ten distinct characters
        "changeme" * 5,
        "your-secret-key-here-must-be-at-least-32-bytes-long",
        "please-replace-with-a-long-random-string-0123456789",
        "SuperSecretSuperSecretSuperSecret!",
        "example-jwt-signing-key-for-the-llm-gateway",
        "my-password-for-the-admin-api-of-the-gateway",
    ],
)
def test_weak_admin_secrets_are_refused_with_how_to_make_one(weak: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, admin_jwt_secret=weak)
    text = str(caught.value)
    assert "GATEWAY_ADMIN_JWT_SECRET is too weak" in text
    assert 'python -c "import secrets; print(secrets.token_urlsafe(48))"' in text
    if len(weak) >= 16:  # shorter ones ("secret") are words the message itself uses
        assert weak not in text


@pytest.mark.parametrize("strong", [secrets.token_urlsafe(48), secrets.token_hex(32)])
def test_random_admin_secrets_are_accepted(strong: str) -> None:
    settings = Settings(_env_file=None, admin_jwt_secret=strong)
    assert settings.admin_jwt_secret is not None
    assert settings.admin_jwt_secret.get_secret_value() == strong


def test_an_empty_secret_in_the_environment_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_JWT_SECRET", "")  # as .env.example ships it
    assert Settings(_env_file=None).admin_jwt_secret is None


def test_lists_come_comma_separated_or_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_JWT_ALGORITHMS", "RS256, ES384")
    monkeypatch.setenv("GATEWAY_ADMIN_JWT_ADMIN_VALUES", '["Gateway Admins", "ops"]')
    monkeypatch.setenv("GATEWAY_ADMIN_JWT_READ_VALUES", "auditors")
    settings = Settings(_env_file=None)
    assert settings.admin_jwt_algorithms == ["RS256", "ES384"]
    assert settings.admin_jwt_admin_values == ["Gateway Admins", "ops"]
    assert settings.admin_jwt_read_values == ["auditors"]


def test_a_complete_jwks_configuration_is_accepted(tmp_path: Path) -> None:
    assert Settings(_env_file=None, **JWKS).admin_jwks_url is not None
    local = JWKS | {"admin_jwks_url": "http://127.0.0.1:8180/certs"}
    assert Settings(_env_file=None, **local).admin_jwks_url is not None
    from_file = {k: v for k, v in JWKS.items() if k != "admin_jwks_url"}
    settings = Settings(_env_file=None, admin_jwks_file=tmp_path / "jwks.json", **from_file)
    assert settings.admin_jwks_file == tmp_path / "jwks.json"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"admin_jwks_url": "http://sso.example.com/certs"}, "must be https"),
        ({"admin_jwks_file": "/etc/gateway/jwks.json"}, "not both"),
        ({"admin_jwt_issuer": None}, "GATEWAY_ADMIN_JWT_ISSUER and GATEWAY_ADMIN_JWT_AUDIENCE"),
        ({"admin_jwt_audience": None}, "GATEWAY_ADMIN_JWT_ISSUER and GATEWAY_ADMIN_JWT_AUDIENCE"),
        ({"admin_jwt_admin_values": []}, "the groups or roles that grant a scope"),
        ({"admin_jwt_algorithms": ["RS256", "HS256"]}, "GATEWAY_ADMIN_JWT_ALGORITHMS"),
        ({"admin_jwt_algorithms": ["none"]}, "GATEWAY_ADMIN_JWT_ALGORITHMS"),
        ({"admin_jwt_algorithms": []}, "GATEWAY_ADMIN_JWT_ALGORITHMS"),
    ],
)
def test_incomplete_or_unsafe_jwks_settings_stop_start_up(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(_env_file=None, **(JWKS | change))


# --- single sign-on on the admin page (GATEWAY_ADMIN_OIDC_*) ----------------------------------

PAGE = {"admin_oidc_redirect_uris": "https://gateway.example.com/admin/"}


def test_a_complete_oidc_configuration_is_accepted() -> None:
    settings = Settings(
        _env_file=None,
        **JWKS,
        admin_oidc_client_id="llm-gateway-admin-page",
        admin_oidc_redirect_uris="https://gw.example.com/admin/, https://gw.example.com/llm/admin/",
        admin_oidc_client_secret="provider-made",
        admin_oidc_scopes="openid profile email groups",
        admin_oidc_token="access_token",
    )  # type: ignore[call-arg]

    assert settings.admin_oidc_client_id == "llm-gateway-admin-page"
    assert settings.admin_oidc_token == "access_token"
    assert settings.admin_oidc_redirect_uris == [
        "https://gw.example.com/admin/",
        "https://gw.example.com/llm/admin/",
    ]


def test_oidc_defaults_offer_no_sign_in() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]

    assert settings.admin_oidc_client_id is None
    assert (settings.admin_oidc_scopes, settings.admin_oidc_token) == (
        "openid profile email",
        "id_token",
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"admin_oidc_client_id": "page"}, "needs GATEWAY_ADMIN_JWKS_URL .or _FILE. and"),
        (
            {**JWKS, "admin_jwt_issuer": "http://sso.example.com/realms/acme"},
            "GATEWAY_ADMIN_JWT_ISSUER must be the provider's https URL",
        ),
        ({**JWKS, "admin_jwt_issuer": "acme"}, "must be the provider's https URL"),
        ({**JWKS, "admin_oidc_scopes": "profile email"}, "must be space-separated scopes that"),
        ({**JWKS, "admin_oidc_scopes": 'openid "x"'}, "include openid"),
        ({**JWKS, "admin_oidc_client_id": " page"}, "holds surrounding spaces or control"),
        ({**JWKS, "admin_oidc_client_id": "page\n"}, "holds surrounding spaces or control"),
        (
            {**JWKS, "admin_oidc_client_id": None, "admin_oidc_client_secret": "x"},
            "GATEWAY_ADMIN_OIDC_CLIENT_SECRET is set without GATEWAY_ADMIN_OIDC_CLIENT_ID",
        ),
        ({**JWKS, "admin_oidc_token": "refresh_token"}, "id_token"),
        (
            {**JWKS, "admin_oidc_redirect_uris": ""},
            "GATEWAY_ADMIN_OIDC_CLIENT_ID needs GATEWAY_ADMIN_OIDC_REDIRECT_URIS: the admin "
            "page's exact URL.s. .*e.g. GATEWAY_ADMIN_OIDC_REDIRECT_URIS=https://gateway",
        ),
        ({**JWKS, "admin_oidc_redirect_uris": "https://gw.example/"}, "is not the admin page's"),
        ({**JWKS, "admin_oidc_redirect_uris": "https://*.example/admin/"}, "is not the admin"),
        ({**JWKS, "admin_oidc_redirect_uris": "https://gw.example/admin/?x"}, "is not the admin"),
        ({**JWKS, "admin_oidc_redirect_uris": "ftp://gw.example/admin/"}, "is not the admin"),
        ({**JWKS, "admin_oidc_redirect_uris": "/admin/"}, "is not the admin page's"),
    ],
)
def test_incomplete_or_unsafe_oidc_settings_stop_start_up(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(_env_file=None, **({"admin_oidc_client_id": "page"} | PAGE | values))  # type: ignore[call-arg]


def test_a_loopback_issuer_may_be_plain_http() -> None:
    issuer = "http://127.0.0.1:9400"
    values = JWKS | {"admin_jwks_url": f"{issuer}/jwks", "admin_jwt_issuer": issuer}
    settings = Settings(_env_file=None, **values, **PAGE, admin_oidc_client_id="page")  # type: ignore[call-arg]

    assert settings.admin_jwt_issuer == issuer
