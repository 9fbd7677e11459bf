"""The TPM reservation that fits agents: what the key's answers needed, not the declared bound.

Unit tests of `KeyLimiter.reserve` and `release` on the in-memory storage, and of
`AnswerHistory`; the same over a real gateway is in `test_tpm_reservation.py`.
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from gateway.auth.principal import Principal
from gateway.errors import OverTokenLimitError, RateLimitedError
from gateway.limits.estimate import TokenEstimate
from gateway.limits.history import AnswerHistory
from gateway.limits.limiter import Admission, KeyLimiter
from gateway.limits.storage import build_storage, close_storage
from gateway.metering.metrics import Metrics
from gateway.policies import LimitPolicy
from gateway.settings import Settings
from tests.limits.test_ratelimit import _redis_up
from tests.support.servers import REDIS_URL

MODEL = "qwen3-coder:30b"


def _limiter(url: str = "memory://") -> KeyLimiter:
    settings = Settings(
        upstream_url="http://127.0.0.1:1",
        rate_limit_storage=url,
        rate_limit_key_prefix=f"test-{uuid.uuid4().hex}",
        rate_limit_timeout=5.0,
    )
    policy = LimitPolicy.of(settings)
    return KeyLimiter(build_storage(policy), policy, Metrics())


def _estimate(prompt: int, bound: int | None, default: int = 256) -> TokenEstimate:
    """As `estimate_tokens` makes it: the default output, at most the bound."""
    return TokenEstimate(default if bound is None else min(bound, default), bound, prompt)


async def _reserve(
    limiter: KeyLimiter, principal: Principal, estimate: TokenEstimate
) -> tuple[Admission, int | None]:
    admission = await limiter.admit(principal)
    return admission, await limiter.reserve(admission, estimate, MODEL)


def test_the_history_is_the_most_of_the_last_answers_per_key_and_model() -> None:
    history = AnswerHistory(answers=3, pairs=2)
    assert history.expected("k", MODEL) is None
    for tokens in (500, 20, 30, 40):  # 500 falls out of the last three
        history.record("k", MODEL, tokens)
    assert history.expected("k", MODEL) == 40
    assert history.expected("k", "Qwen3-Coder:30B") == 40  # names compared as allow-lists do
    assert history.expected("other", MODEL) is None
    history.record("k", "m2", 1)
    history.record("k", "m3", 1)  # a third pair: the least recently used one is forgotten
    assert history.expected("k", MODEL) is None
    assert history.expected("k", "m3") == 1


@pytest.mark.anyio
async def test_claude_codes_bound_reserves_the_default_then_what_the_answers_needed() -> None:
    """TPM 100,000, `max_tokens: 32000`: before, 32,000 (+ the prompt) were held per request.
    Now the default 256 before any answer, then the most of the key's recent answers; the
    upstream is still told 32,000 while the key's headroom holds it."""
    limiter = _limiter()
    key = Principal("k1", "agent", None, tpm=100_000)
    first, bound = await _reserve(limiter, key, _estimate(5_000, 32_000))
    assert (first.reserved, bound) == (5_000 + 256, None)  # None: the client's 32,000 is sent
    await limiter.release(first, 5_000 + 300, answered=300)
    second, bound = await _reserve(limiter, key, _estimate(5_000, 32_000))
    assert (second.reserved, bound) == (5_000 + 300, None)
    assert second.headroom == 32_000 - 300
    await limiter.release(second, 5_000 + 120, answered=120)
    third, _ = await _reserve(limiter, key, _estimate(5_000, 32_000))
    assert third.reserved == 5_000 + 300  # the most of the recent answers, not the last


@pytest.mark.anyio
async def test_a_bound_above_the_tpm_is_lowered_to_what_a_window_holds() -> None:
    """Before: 413 for good. Now the prompt fits, so it is admitted with a bound the window
    can hold (the TPM less the prompt); without a bound of its own it gets that one too."""
    limiter = _limiter()
    key = Principal("k1", "agent", None, tpm=1_000)
    admission, bound = await _reserve(limiter, key, _estimate(100, 32_000))
    assert (admission.reserved, bound) == (356, 900)
    await limiter.release(admission, 110, answered=10)
    admission, bound = await _reserve(limiter, key, _estimate(100, None))
    assert (admission.reserved, bound) == (110, 900)
    await limiter.release(admission, 110)
    with pytest.raises(OverTokenLimitError, match="its prompt is about 1001 tokens"):
        await _reserve(limiter, key, _estimate(1_001, 10))


@pytest.mark.anyio
async def test_parallel_requests_share_the_headroom_and_get_it_back() -> None:
    """TPM 1,000, answers of 10 so far, bounds of 32,000: each reserves 110, and the headroom
    (1,000 in all) goes to the first ones; the others are bounded by their reservation. So
    the requests in flight can spend at most the reservations plus 1,000."""
    limiter = _limiter()
    key = Principal("k1", "agent", None, tpm=1_000)
    warm, _ = await _reserve(limiter, key, _estimate(100, 32_000))
    await limiter.release(warm, 110, answered=10)
    held = [await _reserve(limiter, key, _estimate(100, 32_000)) for _ in range(8)]
    assert [admission.reserved for admission, _ in held] == [110] * 8
    bounds = [bound for _, bound in held]
    assert bounds == [900, 120] + [10] * 6  # 890 + 110 + 6 x 0 of headroom: the 1,000
    assert sum(admission.headroom for admission, _ in held) <= 1_000
    with pytest.raises(RateLimitedError):  # 110 (warm) + 8 x 110 = 990: no 110 left
        await _reserve(limiter, key, _estimate(100, 32_000))
    for admission, _ in held:
        await limiter.release(admission, 0)  # ended before the upstream took them: refunded
    admission, bound = await _reserve(limiter, key, _estimate(100, None))
    assert bound == 900  # every grant came back


@pytest.mark.anyio
async def test_an_embedding_reserves_its_prompt_and_keeps_its_body() -> None:
    limiter = _limiter()
    key = Principal("k1", "agent", None, tpm=1_000)
    admission, bound = await _reserve(limiter, key, TokenEstimate(0, 0, 50))
    assert (admission.reserved, admission.headroom, bound) == (50, 0, None)


@pytest.mark.anyio
async def test_a_key_without_tpm_changes_nothing() -> None:
    limiter = _limiter()
    admission, bound = await _reserve(limiter, Principal("k1", "agent", None), _estimate(5, 32_000))
    assert (admission.reserved, bound) == (0, None)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "storage",
    [
        "memory://",
        pytest.param(
            REDIS_URL,
            marks=pytest.mark.skipif(not _redis_up(), reason="Redis is not running"),
        ),
    ],
)
async def test_concurrent_takers_never_share_more_headroom_than_the_tpm(storage: str) -> None:
    """30 reservations at once (one increment each, the excess given back): the headroom they
    got adds up to the key's TPM at most, and all of it comes back when they end."""
    limiter = _limiter(storage)
    try:
        await _share_the_headroom(limiter)
    finally:
        await limiter.aclose()
        await close_storage(limiter._storage)


async def _share_the_headroom(limiter: KeyLimiter) -> None:
    key = Principal("k1", "agent", None, tpm=1_000)
    warm, _ = await _reserve(limiter, key, _estimate(10, 32_000))
    await limiter.release(warm, 0, answered=5)
    held: list[Admission] = []

    async def one() -> None:
        admission, _ = await _reserve(limiter, key, _estimate(10, 32_000))
        held.append(admission)

    async with anyio.create_task_group() as group:
        for _ in range(30):
            group.start_soon(one)
    assert len(held) == 30  # 30 x 15 = 450 of the window
    granted = sum(admission.headroom for admission in held)
    assert granted == 1_000  # the first wants 990 - 5 = 985, the next gets the 15 left
    for admission in held:
        await limiter.release(admission, 0)
    again, bound = await _reserve(limiter, key, _estimate(10, 32_000))
    assert (again.headroom, bound) == (985, 990)  # 32,000 lowered to the TPM less the prompt
