"""Tests of `gateway/auth/`.

Admin tokens (JWT, JWKS), the key authenticator, `gateway admin token`.
"""
