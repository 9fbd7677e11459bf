"""The API key store (SQLAlchemy async) and the `gateway keys` commands."""
