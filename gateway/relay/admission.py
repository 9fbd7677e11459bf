"""The one admission path: what every request that reaches an upstream on a key's behalf passes.

key's RPM and in-flight (`KeyLimiter.admit`, before the body is read: a flood of slow or junk
bodies spends the key's own limits, issue 11) -> read the body (`GATEWAY_MAX_BODY_BYTES`) or
take the one given -> parse it (a generation's model alias replaced by its target,
`GATEWAY_MODEL_ALIASES`: the body sent upstream, the allow-list, the TPM history, routing, the
metrics' label, usage and the access log's `model` all see the model that runs; the alias the
client sent is not recorded) -> the models it names -> the key's model allow-list (403) ->
the upstream request's headers (the forwarded few and the request id) -> the expected tokens
reserved in the key's TPM (and the output bound sent upstream lowered, or set, to what that
reservation and the key's headroom grant: `KeyLimiter.reserve`) -> on any failure (or
cancellation) after `admit`, the key's limits given back at once -> the request's
`RequestMeter`.

Three callers, whose deliberate differences are parameters here, not copies:
- interactive generations (`gateway.relay.pipeline`): `admit_generation` with the request;
- batch lines (`gateway.batch.line`): `admit_generation` with the line's body bytes (no client
  headers are forwarded), the route label `/v1/batches`, and the line's cancel scope, so the
  line takes only a spare upstream slot, never an interactive one;
- model management (`gateway.api.ollama.manage`): `admitted`, with no TPM reservation and no
  meter (it counts only `gateway_requests_total`, at its end), its limits held for a block
  rather than until a generation finishes, and the model noted for the access log only once
  every check passed.

What comes before the path stays with the caller, in the caller's order: the drain check (the
interactive and the progress routes, each with its own headers), the management routes'
choice of upstream, and the interactive path's usage row for a refusal (`Relay.handle`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
from starlette.requests import Request

from gateway.auth.principal import Principal
from gateway.context import RequestContext
from gateway.errors import ForbiddenError
from gateway.limits.estimate import TokenEstimate, estimate_tokens
from gateway.limits.limiter import Admission, KeyLimiter
from gateway.metering.meter import RequestMeter
from gateway.metering.metrics import ALL_KEYS
from gateway.neutral import GenerationRequest
from gateway.relay.generation import Generation, Services
from gateway.relay.surface import Endpoint
from gateway.settings import Settings
from gateway.upstream.headers import upstream_request_headers
from gateway.upstream.scheduling.ticket import SESSION_HEADER, RouteTicket, capped, session_of
from gateway.wire.body import read_body
from gateway.wire.json import parse_request_body

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Admitted(Generic[T]):
    """A request let in: its checked body, and the key's limits it now holds.

    Attributes:
        admission: The key's RPM and in-flight slot (and the TPM reservation, if any); whoever
            holds it gives it back (`KeyLimiter.release`): the `Generation`'s finish, or the
            end of the `admitted` block.
        body: The parsed body (a `GenerationRequest`, or management's JSON object).
        raw: The body's bytes, as read (what management sends upstream).
        model: The first model the body names, or None.
        headers: The upstream request's headers: the forwarded few and the request id.
        expected: The tokens reserved in the key's TPM; None when none were (management).
        bound: The output bound the upstream must be sent instead of the body's own
            (`KeyLimiter.reserve`); None: the body as it is.
    """

    admission: Admission
    body: T
    raw: bytes
    model: str | None
    headers: dict[str, str]
    expected: TokenEstimate | None
    bound: int | None = None


def upstream_headers(body: bytes | Request, context: RequestContext) -> dict[str, str]:
    """The upstream request's headers: a client's forwarded few (none for a batch line's bytes).

    Raises nothing: a header value the upstream hop cannot carry is left out.
    """
    forwarded = body.headers.items() if isinstance(body, Request) else ()
    return upstream_request_headers(forwarded, request_id=context.request_id)


async def admit(
    limiter: KeyLimiter,
    settings: Settings,
    principal: Principal,
    body: bytes | Request,
    parse: Callable[[bytes, Settings], T],
    models: Callable[[T], Sequence[str]],
    *,
    context: RequestContext,
    tokens: Callable[[T], TokenEstimate] | None = None,
    note_refused_model: bool = True,
    asked: Callable[[T], Mapping[str, str]] | None = None,
) -> Admitted[T]:
    """Admit one request on the key's limits and check its body (the module docstring's path).

    Args:
        limiter: The per-key limits.
        settings: `GATEWAY_MAX_BODY_BYTES`, and what `parse` reads.
        principal: The authenticated key.
        body: The client's request, its body not read yet; or a body's bytes (a batch line).
        parse: Checks the bytes and returns the body (`Endpoint.parse`, ...).
        models: The models the body names, the first one noted; may refuse the body itself.
        context: The request's own state (`gateway.context`, or a batch line's own):
            `request_id` is read, the first model is written as `model` (the access log and a
            refusal's usage row).
        tokens: The body's expected tokens, reserved in the key's TPM; None: no reservation.
        note_refused_model: Whether `model` is noted before the allow-list check, so that a
            refusal names it too (generations), or only once every check passed (management).
        asked: The names the client used for the models `models` returns, where they differ
            (an alias and its target): a refusal names what the client asked for, never an
            alias's target.

    Returns:
        The admitted request; the caller (or the `Generation` it builds) must release it.

    Raises:
        RateLimitedError, ServiceUnavailableError: a limit of the key (`KeyLimiter.admit`,
            `KeyLimiter.reserve`).
        GatewayError: the body's size, syntax or shape, as `read_body` and `parse` raise it.
        ForbiddenError: the body names a model off the key's allow-list (403).
    """
    admission = await limiter.admit(principal)
    try:
        raw = body if isinstance(body, bytes) else await read_body(body, settings.max_body_bytes)
        parsed = await parse_request_body(parse, raw, settings)
        named = models(parsed)
        first = named[0] if named else None
        if note_refused_model:
            context.model = first
        for model in named:
            if not principal.allows_model(model):
                shown = asked(parsed).get(model, model) if asked is not None else model
                raise ForbiddenError(f"this API key may not use model '{shown}'")
        if not note_refused_model:
            context.model = first
        headers = upstream_headers(body, context)
        expected = bound = None
        if tokens is not None:
            expected = tokens(parsed)
            bound = await limiter.reserve(admission, expected, first)
    except BaseException:  # refused (or cancelled) after admission: no leaked slot
        with anyio.CancelScope(shield=True):  # a cancelled scope would skip the release
            await limiter.release(admission, 0)
        raise
    return Admitted(admission, parsed, raw, first, headers, expected, bound)


@asynccontextmanager
async def admitted(
    limiter: KeyLimiter,
    settings: Settings,
    principal: Principal,
    request: Request,
    parse: Callable[[bytes, Settings], T],
    models: Callable[[T], Sequence[str]],
    *,
    context: RequestContext,
    asked: Callable[[T], Mapping[str, str]] | None = None,
) -> AsyncIterator[Admitted[T]]:
    """`admit` a request that spends no tokens (model management) for a block, then release.

    The model is noted only once every check passed (`note_refused_model=False`). The key's
    limits are given back when the block ends, however it ends (shielded).

    Raises:
        GatewayError: as `admit`.
    """
    ticket = await admit(
        limiter,
        settings,
        principal,
        request,
        parse,
        models,
        context=context,
        note_refused_model=False,
        asked=asked,
    )
    try:
        yield ticket
    finally:
        with anyio.CancelScope(shield=True):  # a cancelled request still gives its slot back
            await limiter.release(ticket.admission, 0)


def _named_model(request: GenerationRequest) -> list[str]:
    return [request.model]


def asked_model(request: GenerationRequest) -> dict[str, str]:
    """`{target: alias}` when `request` came for an alias, else empty (`admit`'s `asked`)."""
    return {} if request.alias is None else {request.model: request.alias}


def aliased(request: GenerationRequest, settings: Settings) -> GenerationRequest:
    """`request` for its model alias's target (`GATEWAY_MODEL_ALIASES`), else as it is.

    What every parser of a generation body passes its request through before the allow-list
    (`admit_generation`, and a route that admits one without running it, such as
    `/v1/messages/count_tokens`), so that no route checks the alias instead of the target.
    """
    target = settings.aliases.target(request.model)
    return request if target is None else request.for_model(target)


async def admit_generation(
    services: Services,
    principal: Principal,
    endpoint: Endpoint,
    body: bytes | Request,
    *,
    context: RequestContext,
    route: str | None = None,
    background: anyio.CancelScope | None = None,
) -> Generation:
    """Admit one generation or embedding request (`admit`, TPM reserved) and meter it.

    Args:
        services: The engine's services (limits, settings, metrics, the pool's model labels).
        principal: The authenticated key.
        endpoint: The surface's endpoint: parses the body, names the metrics route.
        body: The client's request (body unread), or a batch line's body bytes.
        context: The request's own state, or a batch line's own (`arrival`, `request_id`).
        route: The metrics route label; None: the endpoint's (a batch line: `/v1/batches`).
        background: A batch line's cancel scope: it takes only a spare upstream slot, which an
            interactive request may take back by cancelling it (`gateway.upstream.slots`).

    Returns:
        The admitted `Generation`, holding the key's limits until its `finish` or `withdraw`.

    Raises:
        GatewayError: every refusal, as `admit` raises it.
    """
    settings = services.settings

    def parse(raw: bytes, settings: Settings) -> GenerationRequest:
        # An alias becomes its target before anything reads the model (module docstring).
        return aliased(endpoint.parse(raw, settings), settings)

    ticket = await admit(
        services.limiter,
        settings,
        principal,
        body,
        parse,
        _named_model,
        context=context,
        tokens=lambda request: estimate_tokens(request, settings.tpm_reserve_tokens),
        asked=asked_model,
    )
    request = ticket.body
    if ticket.bound is not None:  # what the TPM granted is what the upstream is told
        request = request.with_output_bound(ticket.bound)
    expected = ticket.expected
    meter = RequestMeter(
        metrics=services.metrics,
        route=endpoint.route if route is None else route,
        model=services.pool.label(request.model),
        key=principal.name if settings.metrics_per_key else ALL_KEYS,
        arrival=context.arrival,
        key_id=principal.key_id,
        requested_model=request.model,
        prompt_estimate=0 if expected is None else expected.prompt,
    )
    header = body.headers.get(SESSION_HEADER) if isinstance(body, Request) else None
    routing = RouteTicket(
        request.model,
        tokens=0 if expected is None else capped(expected.total),
        output=0 if expected is None else capped(expected.output),
        session=session_of(request.body, header, principal.key_id),
        request=request,
        scope=principal.key_id,
    )
    return Generation(
        services,
        context,
        request,
        ticket.headers,
        meter,
        ticket.admission,
        key=principal.key_id,
        background=background,
        routing=routing,
    )
