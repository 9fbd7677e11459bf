"""One batch line through the same pipeline as an interactive request, with no client.

The key's limits (RPM, in-flight, TPM), its model allow-list, the upstream choice, failover,
retries, metrics and usage are the interactive path's own (`gateway.relay.admission`,
`gateway.relay.pipeline`); only two things differ. The line takes an upstream slot only when
one is spare for batch work (`UpstreamSlots.try_acquire_background`), and its answer is
collected into one JSON object instead of being written to a socket. Its metrics carry the
route label `/v1/batches`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio

from gateway.auth.principal import Principal
from gateway.context import RequestContext
from gateway.neutral import Outcome
from gateway.relay.admission import admit_generation
from gateway.relay.pipeline import Relay
from gateway.relay.surface import Endpoint
from gateway.upstream.slots import NoSpareCapacity

#: The `route` label of batch lines in the metrics (one value, whatever the batch's endpoint).
BATCH_ROUTE = "/v1/batches"


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """A line's successful answer: the status and the JSON body the client would have got."""

    status: int
    body: bytes


async def run_line(
    relay: Relay,
    principal: Principal,
    endpoint: Endpoint,
    raw: bytes,
    *,
    request_id: str,
    holder: anyio.CancelScope,
) -> LineAnswer:
    """Run one batch line's request body through the pipeline and return its answer.

    Args:
        relay: The app's services.
        principal: The key that created the batch, as it is now (limits, allow-list).
        endpoint: The batch's endpoint (`/v1/chat/completions`, ...): parses, encodes.
        raw: The line's `body`, the bytes checked when the batch was created.
        request_id: Sent upstream as the request id, and kept with the line's result.
        holder: The cancel scope the line runs in; an interactive request that needs the
            line's slot cancels it (`gateway.upstream.slots`).

    Raises:
        RateLimitedError: a limit of the key (not an attempt: the caller waits and retries).
        NoSpareCapacity: no upstream slot is spare for batch work (likewise).
        GatewayError: every other failure, as the interactive path raises it.
    """
    context = RequestContext(request_id, time.perf_counter())  # no scope: the line's own
    generation = await admit_generation(
        relay.services,
        principal,
        endpoint,
        raw,
        context=context,
        route=BATCH_ROUTE,
        background=holder,
    )
    try:
        exchange = await generation.connect()
        body = await generation.collect(endpoint.codec(generation.request))
    except NoSpareCapacity:
        await generation.withdraw()
        raise
    except BaseException as exc:
        status = getattr(exc, "status_code", None)
        outcome: Outcome | None = getattr(exc, "outcome", None)
        if outcome is None:
            outcome = "preempted" if holder.cancel_called else "error"
        await generation.finish(outcome, status)
        raise
    await generation.finish(exchange.outcome or "completed")
    return LineAnswer(200, body)
