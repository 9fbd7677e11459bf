"""API keys: the principal, key format and hashing, and the request dependency."""
