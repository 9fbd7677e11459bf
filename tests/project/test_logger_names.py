"""The logger names are an interface: log pipelines select on them (docs/operations.md).

Modules moved in issue 25; their loggers kept the names they had, so a name is not always the
module's path. A new place for a module must not rename its channel by accident.
"""

from __future__ import annotations

import importlib

import pytest

LOGGERS = [
    ("gateway.api.middleware.access", "gateway.access"),
    ("gateway.api.auth", "gateway.auth"),
    ("gateway.api.admin.auth", "gateway.admin"),
    ("gateway.api.admin.oidc", "gateway.admin"),
    ("gateway.limits.limiter", "gateway.ratelimit"),
    ("gateway.limits.address", "gateway.ratelimit"),
    ("gateway.serve.server", "gateway.server"),
    ("gateway.serve.workers", "gateway.workers"),
    ("gateway.serve.door", "gateway.coalesce"),
    ("gateway.serve.tallies", "gateway.coalesce"),
    ("gateway.relay.exchange", "gateway.relay"),
    ("gateway.relay.response", "gateway.relay"),
    ("gateway.relay.retry", "gateway.relay"),
    ("gateway.upstream.pool", "gateway.upstream"),
    ("gateway.upstream.monitor", "gateway.upstream"),
    ("gateway.batch.runner", "gateway.batch"),
    ("gateway.metering.usage", "gateway.metering"),
    ("gateway.tracing.provider", "gateway.tracing"),
]


@pytest.mark.parametrize(("module", "name"), LOGGERS)
def test_each_module_logs_on_its_documented_channel(module: str, name: str) -> None:
    assert importlib.import_module(module).logger.name == name
