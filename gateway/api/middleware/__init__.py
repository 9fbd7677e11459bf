"""Pure-ASGI middleware: the access log, CORS."""
