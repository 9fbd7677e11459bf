"""What the door counts across one server's connections: refusals, and connections per address.

Owns `DoorReport` (refusals summed into a log line at most every `REPORT_INTERVAL` seconds),
`AddressShares` (open connections per client address bucket, and one refusal log line per
address per `ADDRESS_LOG_INTERVAL`), and `shared_address` (the bucket a peer is counted in).
`gateway.serve.door` holds one of each per protocol class.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.limits.address import address_bucket

# The name from before the door had a module of its own: log lines and filters stay the same.
logger = logging.getLogger("gateway.coalesce")

#: Seconds between two log lines summing up refused connections and requests.
REPORT_INTERVAL = 10.0
#: Seconds between two log lines naming the same address refused over its share.
ADDRESS_LOG_INTERVAL = 60.0

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass
class DoorReport:
    """Refusals since the last log line, shared by a server's connections (one per class).

    Attributes:
        counts: Refusals per description since the last log line.
        logged_at: `time.monotonic()` of the last log line.
        count: Called with each refusal's `reason` label (`gateway_door_refused_total`), or
            None.
    """

    counts: Counter[str] = field(default_factory=Counter)
    logged_at: float = float("-inf")
    count: Callable[[str], None] | None = None

    def note(self, reason: str, what: str) -> None:
        """Count one refusal; log the counts at most every `REPORT_INTERVAL` seconds.

        Args:
            reason: The bounded label: `connections`, `connections_per_address`,
                `head_timeout`, `body_timeout`, `head_too_large`.
            what: The log line's words for it (which setting was exceeded).
        """
        if self.count is not None:
            self.count(reason)
        self.counts[what] += 1
        now = time.monotonic()
        if now - self.logged_at >= REPORT_INTERVAL:
            summary = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()))
            logger.warning("client connections refused or closed: %s", summary)
            self.counts.clear()
            self.logged_at = now


@dataclass
class AddressShares:
    """Open connections per client address, shared by a server's connections (one per class).

    Attributes:
        held: Open (admitted) connections per address bucket; an address with none is absent.
        logged_at: `time.monotonic()` of each address's last refusal log line, within the last
            `ADDRESS_LOG_INTERVAL` seconds only.
    """

    held: Counter[str] = field(default_factory=Counter)
    logged_at: dict[str, float] = field(default_factory=dict)

    def take(self, bucket: str, share: int) -> bool:
        """Count one more connection of `bucket`; False (nothing counted) if it holds `share`."""
        if self.held[bucket] >= share:
            return False
        self.held[bucket] += 1
        return True

    def release(self, bucket: str) -> None:
        """One connection of `bucket` ended."""
        self.held[bucket] -= 1
        if self.held[bucket] <= 0:
            del self.held[bucket]

    def first_refusal(self, bucket: str) -> bool:
        """True for the first refusal of `bucket` in `ADDRESS_LOG_INTERVAL` seconds.

        A flood of refused connections must not flood the log: one line per address per
        interval. Addresses whose interval has passed are forgotten when a new line is due, so
        the memory is bounded by the addresses refused within one interval.
        """
        now = time.monotonic()
        if now - self.logged_at.get(bucket, float("-inf")) < ADDRESS_LOG_INTERVAL:
            return False
        self.logged_at = {
            seen: at for seen, at in self.logged_at.items() if now - at < ADDRESS_LOG_INTERVAL
        }
        self.logged_at[bucket] = now
        return True


def shared_address(transport: asyncio.Transport, trusted: tuple[Network, ...]) -> str | None:
    """What the peer of `transport` is counted as (`address_bucket`); None when it has no share.

    No share: a peer in `trusted` (a proxy speaks for many clients), or one that is not an IP
    address (a Unix socket's peer).
    """
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple) or not peer:
        return None
    try:
        ip = ipaddress.ip_address(peer[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket's IPv4 client, as `address_bucket` counts it
    if any(ip in network for network in trusted):
        return None
    return address_bucket(str(ip))
