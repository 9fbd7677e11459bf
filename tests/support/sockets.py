"""Raw-socket reads, for tests that speak HTTP/1.1 by hand (slow, held or hostile clients)."""

from __future__ import annotations

import socket


def read_response(
    sock: socket.socket, timeout: float | None = None
) -> tuple[int, dict[str, str], bytes]:
    """Read one response with a `Content-Length` body: (status, lower-case headers, body).

    `timeout` (seconds, per read) replaces the socket's own when given. Fails if the server
    closes before the whole head or inside the body.
    """
    if timeout is not None:
        sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "closed inside the body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def read_until_closed(sock: socket.socket, within: float) -> bytes:
    """Everything the server sends until it closes; fails if it is still open after `within` s."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"still open after {within} s; received {received[:200]!r}") from None
    return received
