"""The narrow settings views (`gateway.policies`): built from `Settings`, or by hand in a test."""

from __future__ import annotations

import dataclasses
import ipaddress

import httpx
import pytest

from gateway.auth.principal import Principal
from gateway.limits.limiter import Limits
from gateway.policies import (
    AuthFailurePolicy,
    BatchPolicy,
    LimitPolicy,
    PoolPolicy,
    UploadLimits,
    UpstreamTimeouts,
)
from gateway.settings import Settings
from gateway.upstream.client import upstream_timeout


def _settings(**fields: object) -> Settings:
    return Settings(_env_file=None, upstream_url="http://127.0.0.1:1", **fields)  # type: ignore[arg-type]


def test_upstream_timeouts_take_the_three_timeouts() -> None:
    settings = _settings(connect_timeout=2, first_byte_timeout=30, idle_timeout=7)
    assert UpstreamTimeouts.of(settings) == UpstreamTimeouts(connect=2, first_byte=30, idle=7)


def test_a_hand_built_timeout_view_drives_the_client_timeouts() -> None:
    timeout = upstream_timeout(UpstreamTimeouts(connect=1.5, first_byte=20, idle=40))
    assert timeout == httpx.Timeout(connect=1.5, read=40, write=40, pool=1.5)


def test_the_pool_policy_holds_every_upstream_and_the_gate_and_breaker_settings() -> None:
    settings = _settings(
        upstreams=[{"url": "http://10.0.0.1:11434"}, {"url": "http://10.0.0.2:11434"}],
        upstream_max_concurrent=3,
        upstream_queue_size=9,
        circuit_failures=4,
        upstream_http_client="httpx",
    )
    policy = PoolPolicy.of(settings)
    assert [spec.base for spec in policy.upstreams] == [s.base for s in settings.upstream_specs]
    assert len(policy.upstreams) == 2
    assert policy.timeouts == UpstreamTimeouts.of(settings)
    assert (policy.max_concurrent, policy.queue_size, policy.circuit_failures) == (3, 9, 4)
    assert policy.http_client == "httpx"
    assert policy.max_connections == settings.max_connections
    assert policy.queue_timeout == settings.upstream_queue_timeout
    assert policy.poll_interval == settings.upstream_poll_interval
    assert policy.circuit_cooldown == settings.circuit_cooldown


def test_the_pool_policy_of_one_upstream_settings_has_that_upstream() -> None:
    (spec,) = PoolPolicy.of(_settings()).upstreams
    assert spec.base == "http://127.0.0.1:1"


def test_the_limit_policy_resolves_a_keys_limits_without_settings() -> None:
    policy = LimitPolicy(
        storage_url="memory://",
        key_prefix="t",
        timeout=1.0,
        lease_seconds=30.0,
        fail_open=False,
        default_rpm=60,
        default_tpm=1000,
        default_max_concurrent=2,
    )
    own = Principal("k", "k", None, rpm=5)
    assert Limits.of(own, policy) == Limits(rpm=5, tpm=1000, max_concurrent=2)


def test_the_limit_policy_of_settings() -> None:
    settings = _settings(
        rate_limit_key_prefix="gw2", rate_limit_fail_open=True, default_rpm=7, default_tpm=8
    )
    policy = LimitPolicy.of(settings)
    assert (policy.storage_url, policy.key_prefix, policy.fail_open) == ("memory://", "gw2", True)
    assert (policy.default_rpm, policy.default_tpm) == (7, 8)
    assert policy.default_max_concurrent == settings.default_max_concurrent
    assert policy.timeout == settings.rate_limit_timeout
    assert policy.lease_seconds == settings.rate_limit_lease_seconds


def test_the_auth_failure_policy_parses_the_trusted_proxies() -> None:
    settings = _settings(
        auth_failures_per_minute=11, admin_auth_failures_per_minute=3, trusted_proxies=["10.0.0.1"]
    )
    policy = AuthFailurePolicy.of(settings)
    assert (policy.api_per_minute, policy.admin_per_minute) == (11, 3)
    assert policy.trusted_proxies == (ipaddress.ip_network("10.0.0.1/32"),)


def test_upload_limits_and_batch_policy_of_settings() -> None:
    settings = _settings(
        batch_max_file_bytes=4096,
        body_timeout=4,
        batch_upload_min_bytes_per_second=100,
        batch_max_concurrent=5,
        batch_max_attempts=2,
        batch_lease_seconds=60,
    )
    assert UploadLimits.of(settings) == UploadLimits(4096, 4, 100)
    batch = BatchPolicy.of(settings)
    assert (batch.max_concurrent, batch.max_attempts, batch.lease_seconds) == (5, 2, 60)
    assert batch.reserved_slots == settings.batch_reserved_slots
    assert batch.retry_base_seconds == settings.batch_retry_base_seconds
    assert batch.retry_max_seconds == settings.batch_retry_max_seconds
    assert batch.poll_seconds == settings.batch_poll_seconds
    assert batch.idle_poll_seconds == settings.batch_idle_poll_seconds == 10.0
    slow = _settings(batch_poll_seconds=20.0)  # the idle pace is never faster than the busy
    assert BatchPolicy.of(slow).idle_poll_seconds == 20.0


@pytest.mark.parametrize(
    "view",
    [UpstreamTimeouts, PoolPolicy, LimitPolicy, AuthFailurePolicy, UploadLimits, BatchPolicy],
)
def test_every_view_is_frozen(view: type) -> None:
    built = view.of(_settings())
    field = dataclasses.fields(built)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, field, None)
