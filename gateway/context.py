"""`RequestContext`: the one owner of a request's own state, from its arrival to its log line.

Each HTTP request gets one context, made by `request_context` the first time anything asks for
it (`gateway.api.middleware.access.AccessMiddleware`, the outermost layer, asks first) and kept
at one ASGI scope key, `CONTEXT_KEY`. Starlette's `scope["state"]` is left to the lifespan's
app-wide services (`gateway.deps`). A batch line, which has no scope, builds its own
(`gateway.batch.line`).

Who writes what: the access middleware the request id and the arrival clock; the tracing
middleware the SERVER span; authentication the principal; the route the model; the body-budget
middleware its hold; the admin API the verified identity; the relay the summary; the error
handlers (and model management) the outcome of a request the relay did not meter. The access
log, the SERVER span and the rejection counters read it back.

How a request ended is written in two places only, each once:
- `RequestContext.outcome`: the metered summary's outcome wins; without one, the last outcome
  set (a refusal, an unexpected error, a model-management call);
- `ending`: how a relayed answer that stopped without its own ending ended (a shutdown, or the
  client leaving): `gateway.relay.response.RelayResponse` and the Ollama progress stream
  (`gateway.api.ollama.passthrough.ProgressResponse`) both end by it.

This module sits at the bottom of the layers, just above the vocabulary: it imports only
`gateway.neutral`, the standard library, and (for type checking) Starlette's `Scope` and
OpenTelemetry's `Span`. What sits above it is held through a `Protocol` (`Caller` for
`Principal`) or kept as an object its owner narrows (`AdminIdentity`, `BodyHold`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.neutral import Outcome, RequestSummary

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from starlette.types import Scope

#: The ASGI scope key of the request's `RequestContext` (its only key in the scope).
CONTEXT_KEY = "gateway.context"


class Caller(Protocol):
    """The authenticated API key, as the context needs it (`gateway.auth.principal.Principal`)."""

    @property
    def key_id(self) -> str:
        """The key's public id (the `<id>` of `gw_<id>_<secret>`); safe to log."""
        ...

    @property
    def name(self) -> str:
        """The key's name: the metrics' `key` label."""
        ...


@dataclass(slots=True)
class RequestContext:
    """One request's own state: who, what, when, and how it ended.

    Attributes:
        request_id: The `X-Request-ID` (the client's well-formed one, else made by the access
            middleware); `-` until it is known.
        arrival: `time.perf_counter()` seconds when the gateway first saw the request: the start
            of TTFT and of every duration (docs/metrics.md).
        principal: The authenticated key; None before authentication or without one.
        model: The model the request names (access log, usage); None until its body is read.
        span: The SERVER span when tracing (`gateway.tracing`): the upstream span's parent.
        admin: The verified `gateway.auth.identity.AdminIdentity` of an admin API request,
            kept so the token is verified once (`gateway.api.admin.auth` narrows it).
        body_hold: The request's `gateway.wire.budget.BodyHold` (`hold_of` narrows it).
        summary: The relay's measurement of the request (`gateway.metering.meter`), once
            finished; None for a request the relay never admitted.
    """

    request_id: str = "-"
    arrival: float = field(default_factory=time.perf_counter)
    principal: Caller | None = None
    model: str | None = None
    span: Span | None = None
    admin: object | None = None
    body_hold: object | None = None
    summary: RequestSummary | None = None
    _outcome: Outcome | None = field(default=None, init=False)

    @property
    def key_id(self) -> str | None:
        """The authenticated key's id, or None."""
        return None if self.principal is None else self.principal.key_id

    @property
    def metered(self) -> bool:
        """Whether the relay recorded the request itself (then nobody counts it again)."""
        return self.summary is not None

    @property
    def outcome(self) -> Outcome | None:
        """How the request ended: the summary's outcome once metered, else the last one set.

        None while it runs, and for a request that ended without an outcome (an answer that is
        not a generation: health, metadata, the admin API).
        """
        if self.summary is not None:
            return self.summary.outcome
        return self._outcome

    def set_outcome(self, outcome: Outcome) -> None:
        """Name how a request ended that the relay does not meter (a later call wins).

        Set for a metered request too (its error reaches the error handlers), where the
        summary's outcome still wins (`outcome`).
        """
        self._outcome = outcome

    def finish(self, summary: RequestSummary) -> None:
        """Keep the relay's summary of the request: its outcome is the request's."""
        self.summary = summary


def request_context(scope: Scope) -> RequestContext:
    """The request's context, made at the first call (arrival is then) and kept in `scope`."""
    context: RequestContext | None = scope.get(CONTEXT_KEY)
    if context is None:
        context = scope[CONTEXT_KEY] = RequestContext()
    return context


def ending(relayed: Outcome | None, *, shutdown: bool) -> Outcome:
    """How a relayed answer ended when its relay stopped.

    Args:
        relayed: The ending the upstream's answer reached by itself (`completed`,
            `upstream_error`, `timeout`), or None when it was cut short.
        shutdown: The gateway's stop ended it while the client was still there.

    Returns:
        `relayed` when there is one: it happened first. Else `shutdown`, or else
        `client_disconnect` (the client left, or read nothing for `GATEWAY_IDLE_TIMEOUT`).
    """
    if relayed is not None:
        return relayed
    return "shutdown" if shutdown else "client_disconnect"
