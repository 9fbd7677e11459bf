"""The client's address: the peer's, or behind a trusted reverse proxy, its `X-Forwarded-For`.

Below every user of it: the access log (`gateway.api.middleware.access`), the per-address
budgets of failed authentications (`gateway.limits.address`) and the admin API's refusal log
and audit trail (`gateway.api.admin.auth`) all name the same address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.types import Scope

#: A network of `GATEWAY_TRUSTED_PROXIES`.
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def client_address(scope: Scope, trusted: Sequence[Network]) -> str | None:
    """The client's IP address as the access log names it; None when the server gave no peer.

    The peer address, unless it lies in one of `trusted`: then `X-Forwarded-For` is read from
    the right (the hop closest to the gateway) and the first address not in `trusted` is the
    client, as RFC 7239 section 7.4 advises; entries a client may have forged further left are
    ignored. A malformed entry stops the walk and is not trusted: the last good hop is named.
    """
    peer = scope.get("client")
    address: str | None = peer[0] if peer else None
    if address is None or not trusted or not _in(address, trusted):
        return address
    hops: list[str] = []
    for name, value in scope["headers"]:
        if name == b"x-forwarded-for":
            hops.extend(part.strip() for part in value.decode("latin-1").split(","))
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return address
        address = hop
        if not _in(hop, trusted):
            return hop
    return address


def _in(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)
