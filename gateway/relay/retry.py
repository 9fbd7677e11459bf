"""Retries of one upstream request on the same upstream, before its first byte (tenacity).

Retried up to `GATEWAY_RETRY_ATTEMPTS` tries: refused or reset connections, and upstream
502/503/504 answers (Ollama's "server busy" 503, reference section 8). A 500 not blamed on the
request at most once, and only when the caller allows it (no other upstream is left): a model
server's 500 is usually the same for the same request, and each try costs a generation. Never a
timeout (the upstream may still be generating: the caller moves on), never a 4xx, never what
the request caused (`blame == "request"`, such as a 500 in `gateway.errors.REQUEST_BLAMING_500`:
it fails the same way anywhere), never an answer with `Retry-After` (not sooner than asked: the
caller moves on to another upstream), and never once a chunk has been relayed: the exchange's
`open()` is the only caller, and the client has received nothing while it runs (field failure
F-06). The rule by kind of fault: docs/operations.md, "Retries and failover by kind of fault".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from gateway.errors import UpstreamStatusError
from gateway.metering.metrics import Metrics

# The relay's logger name, as before this module was cut out of the exchange: log lines and
# their filters stay the same.
logger = logging.getLogger("gateway.relay")


def retryable(exc: BaseException, *, retry_server_error: bool, server_errors: int) -> bool:
    """Whether a failed try may be repeated on the same upstream (module docstring).

    Args:
        exc: What the try raised.
        retry_server_error: An upstream 500 (one not blamed on the request) may be tried once
            more on this upstream.
        server_errors: Such 500s this request's tries got so far, this one included.
    """
    if isinstance(exc, UpstreamStatusError):
        if exc.blame == "request" or exc.retry_after is not None:
            return False
        if exc.upstream_status == 500:
            return retry_server_error and server_errors < 2
        return exc.upstream_status in (502, 503, 504)
    return isinstance(exc, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError)


async def with_retries(
    attempt: Callable[[], Awaitable[None]],
    may_retry: Callable[[BaseException], bool],
    *,
    attempts: int,
    backoff: float,
    metrics: Metrics,
) -> None:
    """Run `attempt`; on a failure `may_retry` allows, again, with backoff and jitter.

    The first try runs at once; tenacity takes over only when it failed and may be retried.
    Most requests succeed at the first try, and an `AsyncRetrying` loop costs about 50 µs of
    CPU per request (docs/performance.md). After a retryable failure the loop starts with that
    failure as its first attempt, so the backoff, the retry counting
    (`gateway_upstream_retries_total`) and the attempt limit are tenacity's exactly as if it
    had run from the start.

    Args:
        attempt: One try.
        may_retry: Whether a try's failure may be repeated (`retryable`, bound by the caller).
        attempts: Most tries in all (`GATEWAY_RETRY_ATTEMPTS`).
        backoff: Seconds of the exponential backoff's multiplier and jitter
            (`GATEWAY_RETRY_BACKOFF`; waits at most 2 s).
        metrics: Counts each retry by reason.

    Raises:
        Exception: the last try's failure, as it was raised.
    """
    try:
        await attempt()
        return
    except Exception as exc:
        if not may_retry(exc) or attempts < 2:
            raise
        failure: Exception | None = exc

    def count_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        reason = "status" if isinstance(exc, UpstreamStatusError) else "connect"
        metrics.upstream_retries.labels(reason).inc()
        logger.info("retrying upstream request (%s), attempt %d", reason, state.attempt_number)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=backoff, max=2.0, jitter=backoff),
        retry=retry_if_exception(may_retry),
        before_sleep=count_retry,
        reraise=True,
    )
    async for try_ in retrying:
        with try_:
            if failure is not None:
                first, failure = failure, None
                raise first
            await attempt()
