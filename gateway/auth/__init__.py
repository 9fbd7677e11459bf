"""Authentication: API keys (principal, format, hashing, the request dependency) and admin JWTs."""
