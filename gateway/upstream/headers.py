"""Pure header filters for the upstream hop (reference section 6.8; RFC 9110 section 7.6.1).

The gateway builds the upstream request's headers itself from an allow-list, so the client's
credentials (`Authorization`, `X-API-Key`, `Cookie`, `Proxy-Authorization`), its `Host` and its
`Origin` can never reach the model server: a new header a client invents is dropped by default.
Responses to the client are likewise built by the gateway, never copied from the upstream, so
no upstream hop-by-hop header can reach the client either.

A forwarded value is checked before the request is admitted: only visible ASCII, space and tab,
at most `MAX_FORWARDED_VALUE` characters. Anything else is refused with 400 for that client.
Passed on, a `User-Agent` holding the byte 0xff makes the HTTP client raise while it builds the
upstream request, a failure that used to be counted against the upstream's circuit breaker, so
a few such requests from one key took the upstream away from every key.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

#: Connection-level headers that a proxy must not forward in either direction
#: (RFC 9110 section 7.6.1, plus the de-facto `keep-alive` and `proxy-connection`).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

#: Client headers that carry the gateway credential or browser identity; never forwarded.
CREDENTIALS = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization", "origin"})

#: The only client headers forwarded upstream: harmless and useful in upstream logs.
FORWARDED = frozenset({"user-agent", "accept-language"})

#: Longest forwarded header value, in characters (browsers' User-Agent is under 300).
MAX_FORWARDED_VALUE = 1024

#: The namespace of the upstream ids made from request ids that are not UUIDs (a fixed uuid4).
_UPSTREAM_ID_NAMESPACE = uuid.UUID("6f2c1b9e-3d4a-4c8e-9a57-0b1e2d3c4f5a")


def upstream_request_id(request_id: str) -> str:
    """The `X-Request-ID` for the upstream hop: `request_id` itself when it is a UUID.

    llama-cpp-python's server (starlette-context's `RequestIdPlugin`) answers 400 with an
    empty body to an `X-Request-ID` that is not a UUID, so a client's own id (`req-123`) or a
    batch line's (`batch_req_...`) goes upstream as the name-based UUID (RFC 9562 section 5.5)
    of it: the same id always maps to the same UUID, and the access log shows it as
    `upstream_request_id`. The gateway's own ids are uuid4 hex and go unchanged.
    """
    try:
        uuid.UUID(request_id)
    except ValueError:
        return uuid.uuid5(_UPSTREAM_ID_NAMESPACE, request_id).hex
    return request_id


#: A header value the upstream hop accepts: visible ASCII (VCHAR), space and tab (RFC 9110
#: section 5.5 without `obs-text`, which the HTTP clients refuse to encode).
_VALID_VALUE = re.compile(r"[\t\x20-\x7e]*")


def upstream_request_headers(
    client_headers: Iterable[tuple[str, str]],
    *,
    request_id: str,
) -> dict[str, str]:
    """Return the headers for the upstream request.

    Args:
        client_headers: The client's headers as (name, value) pairs, any case.
        request_id: The gateway's request id, sent as `X-Request-ID` for log correlation
            (as `upstream_request_id` makes it: always a UUID).

    Returns:
        A new dict of lower-case header names; no hop-by-hop, credential, `Host` or `Origin`
        header from the client is in it. The upstream client adds its own `Host` and
        credential (`gateway.upstream.client.upstream_default_headers`).

        A forwarded header whose value is not visible ASCII, space and tab (a `User-Agent` with
        `münchen` in it, legal as RFC 9110 `obs-text`), or is longer than
        `MAX_FORWARDED_VALUE`, is left out: the HTTP clients refuse to encode it, so sending it
        would fail in the upstream call, and refusing the request would break apps that Ollama
        serves. Both headers are informational; the upstream sees the gateway's `User-Agent`.
    """
    headers = {
        name.lower(): value
        for name, value in client_headers
        if name.lower() in FORWARDED
        and name.lower() not in HOP_BY_HOP | CREDENTIALS
        and len(value) <= MAX_FORWARDED_VALUE
        and _VALID_VALUE.fullmatch(value)
    }
    headers["x-request-id"] = upstream_request_id(request_id)
    return headers
