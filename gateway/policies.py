"""Narrow, frozen views of `Settings`: what each engine unit takes instead of all 81 fields.

A unit of `gateway/upstream/`, `gateway/limits/` or `gateway/batch/` takes the one view it
reads, so a unit test builds it with the few values that matter, without `Settings`. Each view
is built from the settings by its `of` classmethod (the one place a field maps to a view);
the views hold plain values, already checked by `Settings`' validators.

Apart from `settings.py` on purpose: that module is the one pydantic-settings class (its
fields must sit in one class for `GATEWAY_*` parsing); these are plain dataclasses.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gateway.settings import Settings, UpstreamSpec

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Upstream call timeouts, in seconds.

    Attributes:
        connect: To connect, and to wait for a pooled connection (`GATEWAY_CONNECT_TIMEOUT`).
        first_byte: For the first byte of an answer (`GATEWAY_FIRST_BYTE_TIMEOUT`).
        idle: Between two chunks, and to send the request (`GATEWAY_IDLE_TIMEOUT`).
    """

    connect: float
    first_byte: float
    idle: float

    @classmethod
    def of(cls, settings: Settings) -> UpstreamTimeouts:
        """The view of `settings`."""
        return cls(settings.connect_timeout, settings.first_byte_timeout, settings.idle_timeout)


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """How the pool orders its candidates (`gateway.upstream.scheduling.scheduler`).

    Attributes:
        mode: `least_in_flight`, `round_robin` or `scored` (`GATEWAY_ROUTING`).
        weights: Each score's weight, (name, weight) pairs; 0 or absent: off
            (`GATEWAY_ROUTING_SCORES`).
        balance_abs_threshold: Requests in flight the busiest upstream must have beyond the
            idlest for the balance guard (`GATEWAY_ROUTING_BALANCE_ABS_THRESHOLD`).
        balance_rel_threshold: And how many times the idlest's
            (`GATEWAY_ROUTING_BALANCE_REL_THRESHOLD`).
        prefix_blocks: Blocks the prefix index keeps (`GATEWAY_ROUTING_PREFIX_BLOCKS`).
        prefix_block_chars: Characters per block (`GATEWAY_ROUTING_PREFIX_BLOCK_CHARS`).
    """

    mode: Literal["least_in_flight", "round_robin", "scored"] = "least_in_flight"
    weights: tuple[tuple[str, float], ...] = (
        ("prefix", 1.0),
        ("load", 1.0),
        ("residency", 1.0),
        ("server", 1.0),
    )
    balance_abs_threshold: int = 4
    balance_rel_threshold: float = 1.5
    prefix_blocks: int = 32768
    prefix_block_chars: int = 1024

    @classmethod
    def of(cls, settings: Settings) -> SchedulingPolicy:
        """The view of `settings`."""
        return cls(
            mode=settings.routing,
            weights=tuple(settings.routing_scores.items()),
            balance_abs_threshold=settings.routing_balance_abs_threshold,
            balance_rel_threshold=settings.routing_balance_rel_threshold,
            prefix_blocks=settings.routing_prefix_blocks,
            prefix_block_chars=settings.routing_prefix_block_chars,
        )


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """What the upstream pool is built from (`gateway.upstream.pool.open_pool`).

    Attributes:
        upstreams: The upstreams to serve from (`GATEWAY_UPSTREAMS`, or the one-upstream
            settings).
        timeouts: Every upstream call's timeouts.
        http_client: The transport (`GATEWAY_UPSTREAM_HTTP_CLIENT`).
        max_connections: Connections kept per upstream (`GATEWAY_MAX_CONNECTIONS`).
        max_concurrent: Requests in flight per upstream, unless the upstream sets its own
            (`GATEWAY_UPSTREAM_MAX_CONCURRENT`; 0: no gate).
        queue_size: Requests waiting for an upstream slot (`GATEWAY_UPSTREAM_QUEUE_SIZE`).
        queue_timeout: Seconds one may wait there (`GATEWAY_UPSTREAM_QUEUE_TIMEOUT`).
        poll_interval: Seconds between two monitor polls (`GATEWAY_UPSTREAM_POLL_INTERVAL`).
        circuit_failures: Failures in a row that open an upstream's breaker.
        circuit_cooldown: Seconds an open breaker waits before a trial request.
        scheduling: How the upstream of each request is chosen.
    """

    upstreams: tuple[UpstreamSpec, ...]
    timeouts: UpstreamTimeouts
    http_client: Literal["aiohttp", "httptools", "httpx"]
    max_connections: int
    max_concurrent: int
    queue_size: int
    queue_timeout: float
    poll_interval: float
    circuit_failures: int
    circuit_cooldown: float
    scheduling: SchedulingPolicy = SchedulingPolicy()

    @classmethod
    def of(cls, settings: Settings) -> PoolPolicy:
        """The view of `settings`."""
        return cls(
            upstreams=tuple(settings.upstream_specs),
            timeouts=UpstreamTimeouts.of(settings),
            http_client=settings.upstream_http_client,
            max_connections=settings.max_connections,
            max_concurrent=settings.upstream_max_concurrent,
            queue_size=settings.upstream_queue_size,
            queue_timeout=settings.upstream_queue_timeout,
            poll_interval=settings.upstream_poll_interval,
            circuit_failures=settings.circuit_failures,
            circuit_cooldown=settings.circuit_cooldown,
            scheduling=SchedulingPolicy.of(settings),
        )


@dataclass(frozen=True, slots=True)
class LimitPolicy:
    """The per-key limits' defaults and their storage (`gateway.limits.limiter`).

    Attributes:
        storage_url: `memory://`, `redis://...` or `rediss://...`
            (`GATEWAY_RATE_LIMIT_STORAGE`).
        key_prefix: Prefix of the limiter's Redis keys.
        timeout: Seconds one storage call may take (`GATEWAY_RATE_LIMIT_TIMEOUT`).
        lease_seconds: How long an in-flight slot outlives a process that stopped renewing it.
        fail_open: Admit requests while the storage is unavailable (else 503).
        default_rpm: Requests per minute of a key without its own (0: unlimited).
        default_tpm: Tokens per minute of a key without its own (0: unlimited).
        default_max_concurrent: In-flight requests of a key without its own (0: unlimited).
    """

    storage_url: str
    key_prefix: str
    timeout: float
    lease_seconds: float
    fail_open: bool
    default_rpm: int
    default_tpm: int
    default_max_concurrent: int

    @classmethod
    def of(cls, settings: Settings) -> LimitPolicy:
        """The view of `settings`."""
        return cls(
            storage_url=settings.rate_limit_storage,
            key_prefix=settings.rate_limit_key_prefix,
            timeout=settings.rate_limit_timeout,
            lease_seconds=settings.rate_limit_lease_seconds,
            fail_open=settings.rate_limit_fail_open,
            default_rpm=settings.default_rpm,
            default_tpm=settings.default_tpm,
            default_max_concurrent=settings.default_max_concurrent,
        )


@dataclass(frozen=True, slots=True)
class AuthFailurePolicy:
    """The per-address budgets of failed authentications (`gateway.limits.address`).

    Attributes:
        api_per_minute: Failed API-key authentications per address and minute (0: no limit).
        admin_per_minute: The same for admin tokens.
        trusted_proxies: Peers whose `X-Forwarded-For` names the client.
        timeout: Seconds one storage call may take (`GATEWAY_RATE_LIMIT_TIMEOUT`).
    """

    api_per_minute: int
    admin_per_minute: int
    trusted_proxies: tuple[Network, ...]
    timeout: float

    @classmethod
    def of(cls, settings: Settings) -> AuthFailurePolicy:
        """The view of `settings`."""
        return cls(
            api_per_minute=settings.auth_failures_per_minute,
            admin_per_minute=settings.admin_auth_failures_per_minute,
            trusted_proxies=tuple(settings.trusted_proxy_networks),
            timeout=settings.rate_limit_timeout,
        )


@dataclass(frozen=True, slots=True)
class UploadLimits:
    """A batch input upload's size and pace (`gateway.batch.upload`).

    Attributes:
        max_file_bytes: Largest file accepted (`GATEWAY_BATCH_MAX_FILE_BYTES`).
        grace: Seconds before the pace applies (`GATEWAY_BODY_TIMEOUT`).
        min_bytes_per_second: The pace (`GATEWAY_BATCH_UPLOAD_MIN_BYTES_PER_SECOND`).
    """

    max_file_bytes: int
    grace: float
    min_bytes_per_second: int

    @classmethod
    def of(cls, settings: Settings) -> UploadLimits:
        """The view of `settings`."""
        return cls(
            settings.batch_max_file_bytes,
            settings.body_timeout,
            settings.batch_upload_min_bytes_per_second,
        )


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How the batch runner runs lines (`gateway.batch.runner`).

    Attributes:
        max_concurrent: Lines this process runs at once (`GATEWAY_BATCH_MAX_CONCURRENT`).
        reserved_slots: Upstream slots batch work leaves to interactive requests.
        max_attempts: Attempts of a line before it fails (`GATEWAY_BATCH_MAX_ATTEMPTS`).
        retry_base_seconds: First backoff between attempts (jittered, doubling).
        retry_max_seconds: Longest backoff.
        lease_seconds: A claimed line's lease (renewed while it runs).
        poll_seconds: Seconds between two looks for work when nothing wakes the runner.
        idle_poll_seconds: The same while no batch is open on any replica (at least
            `poll_seconds`).
    """

    max_concurrent: int
    reserved_slots: int
    max_attempts: int
    retry_base_seconds: float
    retry_max_seconds: float
    lease_seconds: float
    poll_seconds: float
    idle_poll_seconds: float

    @classmethod
    def of(cls, settings: Settings) -> BatchPolicy:
        """The view of `settings`."""
        return cls(
            max_concurrent=settings.batch_max_concurrent,
            reserved_slots=settings.batch_reserved_slots,
            max_attempts=settings.batch_max_attempts,
            retry_base_seconds=settings.batch_retry_base_seconds,
            retry_max_seconds=settings.batch_retry_max_seconds,
            lease_seconds=settings.batch_lease_seconds,
            poll_seconds=settings.batch_poll_seconds,
            idle_poll_seconds=max(settings.batch_idle_poll_seconds, settings.batch_poll_seconds),
        )
