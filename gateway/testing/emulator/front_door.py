"""The Ollama emulator's front door: it records every request and applies the loopback gates.

Owns the pure ASGI middleware that files a `ReceivedRequest` for each HTTP request (status, first
byte, outcome) and, like Ollama bound to loopback, answers 403 to a non-local `Host` or a
disallowed `Origin` before any route runs (reference §6.8).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import TYPE_CHECKING

from starlette.responses import Response

from gateway.testing.emulator.state import RECORD_KEY, ReceivedRequest

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from gateway.testing.emulator.state import EmulatorState

_ORIGIN_SCHEMES = frozenset({"app", "file", "tauri", "vscode-webview", "vscode-file"})


def _host_allowed(host: str, hostname: str) -> bool:
    """Ollama's `allowedHostsMiddleware` for a server bound to loopback."""
    name = host[1 : host.find("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        name = name.lower()
        local_tld = name.endswith((".localhost", ".local", ".internal"))
        return local_tld or name in ("", "localhost", hostname)
    return address.is_loopback or address.is_private or address.is_unspecified


def _origin_allowed(origin: str, host: str) -> bool:
    """gin-contrib/cors with Ollama's default origins and an empty `OLLAMA_ORIGINS`."""
    if origin in (f"http://{host}", f"https://{host}"):
        return True  # same-origin requests are not CORS requests
    scheme, _, rest = origin.partition("://")
    if scheme in _ORIGIN_SCHEMES:
        return True
    name, _, port = rest.partition(":")
    local = name in ("localhost", "127.0.0.1", "0.0.0.0")  # noqa: S104 - a name, not a bind
    return scheme in ("http", "https") and local and (not port or port.isdigit())


class FrontDoor:
    """Pure ASGI middleware: records every request, then applies the Origin and Host gates."""

    def __init__(self, app: ASGIApp, state: EmulatorState) -> None:
        self._app = app
        self._state = state
        self._hostname = socket.gethostname().lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Record the request, then let the gate or the app answer it."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        record = ReceivedRequest(method=scope["method"], path=scope["path"], headers=headers)
        self._state.add(record)

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status, record.first_byte_at = message["status"], time.monotonic()
            await send(message)

        app = self._gate(scope["method"], headers) or self._app
        try:
            await app({**scope, RECORD_KEY: record}, receive, observed_send)
        except BaseException:
            record.finish("fault")
            raise
        record.finish("completed")

    def _gate(self, method: str, headers: dict[str, str]) -> ASGIApp | None:
        """Return the gate's answer, or None to let the request through (CORS runs first)."""
        config, origin, host = self._state.config, headers.get("origin"), headers.get("host", "")
        if origin and config.origin_gate and not _origin_allowed(origin, host):
            return Response(status_code=403)
        if origin and method == "OPTIONS":
            return Response(status_code=204)  # a CORS preflight
        if config.host_gate and not _host_allowed(host, self._hostname):
            return Response(status_code=403)
        return None
