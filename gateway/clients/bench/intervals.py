"""Confidence intervals and the two-sample test behind `gateway bench`'s numbers and its gate.

Three methods, each for the samples it is valid on (docs/benchmarking.md "Reading the
intervals"):

- `mean_interval`: Student's t interval of a mean, mean +- t(1 - a/2, n - 1) s / sqrt(n) (NIST/
  SEMATECH e-Handbook of Statistical Methods, 7.2.2.1). Over the repeats of a point (each repeat
  is an independent run, so its statistics are independent draws): the interval of every
  reported metric. Within one repeat, over its requests: the interval of a per-request mean.
- `quantile_interval`: the distribution-free interval of a percentile from order statistics:
  [x(l), x(u)] with the ranks from Binomial(n, q) (W. J. Conover, Practical Nonparametric
  Statistics, 3rd ed., 1999, section 3.2; Hahn & Meeker, Statistical Intervals, 1991, 5.2).
  Exact for independent samples, no resampling (so free beside the sort the percentile already
  did), and None when n is too small for the percentile (a p99 of 50 requests has no upper
  rank).
- `welch`: Welch's t-test on the difference of two means with unequal variances (B. L. Welch,
  Biometrika 34, 1947; NIST e-Handbook 1.3.5.3), the gate's test on the repeats of BASE and NEW.

No SciPy (it is no dependency of the gateway): Student's t distribution is computed exactly for
whole degrees of freedom from its closed forms (Abramowitz & Stegun, Handbook of Mathematical
Functions, 26.7.3 for odd and 26.7.4 for even degrees) and inverted by bisection; Welch's
fractional degrees of freedom are rounded down, which widens the interval (conservative); past
`NORMAL_DF` degrees the standard normal (`statistics.NormalDist`) stands in, less than 0.1% off.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Degrees of freedom past which the normal quantile replaces Student's (t(0.975, 1000) = 1.9623,
#: z = 1.9600).
NORMAL_DF = 1000
#: The default confidence of every interval and of the gate.
DEFAULT_CONFIDENCE = 0.95


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's T with `df` whole degrees of freedom (A&S 26.7.3, 26.7.4)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 0:
        term = total = 1.0
        for k in range(2, df, 2):
            term *= c2 * (k - 1) / k
            total += term
        return min(1.0, s * total)
    if df == 1:
        return 2 * theta / math.pi
    term = total = math.cos(theta)
    for k in range(3, df, 2):
        term *= c2 * (k - 1) / k
        total += term
    return min(1.0, 2 / math.pi * (theta + s * total))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's T; fractional `df` is rounded down (a heavier tail).

    Raises:
        ValueError: `df` below 1.
    """
    if not df >= 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df > NORMAL_DF:
        return statistics.NormalDist().cdf(t)
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    half = _t_two_sided(t, math.floor(df)) / 2
    return 0.5 + half if t >= 0 else 0.5 - half


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` degrees of freedom (rounded down).

    `t_quantile(0.975, 2)` = 4.303, `t_quantile(0.975, 4)` = 2.776 (the tables' values).

    Raises:
        ValueError: `p` outside (0, 1) or `df` below 1.
    """
    if not 0 < p < 1:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    if not df >= 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df > NORMAL_DF:
        return statistics.NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1 - p, df)
    whole, target = math.floor(df), 2 * p - 1
    low, high = 0.0, 1.0
    while _t_two_sided(high, whole) < target:
        high *= 2
    for _ in range(200):  # bisection to the float's resolution
        middle = (low + high) / 2
        if middle in (low, high):
            break
        if _t_two_sided(middle, whole) < target:
            low = middle
        else:
            high = middle
    return high


@dataclass(frozen=True, slots=True)
class Interval:
    """An estimate and its two-sided confidence interval.

    Attributes:
        estimate: The mean (or the percentile) the interval is around.
        low: The interval's lower end.
        high: Its upper end.
        n: The samples it came from.
        confidence: Its confidence (0.95).
    """

    estimate: float
    low: float
    high: float
    n: int
    confidence: float

    @property
    def half_width(self) -> float:
        """Half the interval's width, in the estimate's unit."""
        return (self.high - self.low) / 2

    @property
    def relative_half_width(self) -> float:
        """The half width over |estimate| (inf for an estimate of 0 and a positive width)."""
        if self.half_width == 0:
            return 0.0
        return self.half_width / abs(self.estimate) if self.estimate else math.inf


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"the confidence must be within (0, 1), got {confidence}")


def mean_interval(
    values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
) -> Interval | None:
    """Student's t interval of the mean of `values` (independent draws), or None under 2 values.

    Raises:
        ValueError: `confidence` outside (0, 1).
    """
    _check_confidence(confidence)
    n = len(values)
    if n < 2:
        return None
    mean = statistics.fmean(values)
    margin = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - margin, mean + margin, n, confidence)


def _binomial_cdf(n: int, q: float) -> list[float]:
    """`[P(B <= k) for k in 0..n]` for B ~ Binomial(n, q), 0 < q < 1 (log-space pmf)."""
    log_q, log_r = math.log(q), math.log1p(-q)
    total, out = 0.0, []
    for k in range(n + 1):
        log_pmf = (
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * log_q
            + (n - k) * log_r
        )
        total += math.exp(log_pmf)
        out.append(min(total, 1.0))
    return out


def quantile_interval(
    ordered: Sequence[float], q: float, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float] | None:
    """The distribution-free interval of the `q` quantile (0-1) from sorted independent samples.

    [x(l), x(u)] (1-based ranks) with l the largest rank and u the smallest such that
    P(B <= l - 1) <= a/2 and P(B <= u - 1) >= 1 - a/2 for B ~ Binomial(n, q): its coverage is
    at least `confidence` (Conover 1999, 3.2).

    Returns:
        (low, high), or None when the samples are too few for a rank on either side.

    Raises:
        ValueError: `q` outside (0, 1) or `confidence` outside (0, 1).
    """
    _check_confidence(confidence)
    if not 0 < q < 1:
        raise ValueError(f"a quantile needs 0 < q < 1, got {q}")
    ranks = _ranks(len(ordered), q, confidence)
    return None if ranks is None else (ordered[ranks[0] - 1], ordered[ranks[1] - 1])


@functools.lru_cache(maxsize=256)
def _ranks(n: int, q: float, confidence: float) -> tuple[int, int] | None:
    """The 1-based ranks of `quantile_interval`; cached, as every metric of a run shares `n`."""
    if n < 2:
        return None
    alpha = 1 - confidence
    cdf = _binomial_cdf(n, q)
    low_rank = max((r for r in range(1, n + 1) if cdf[r - 1] <= alpha / 2), default=None)
    high_rank = min((r for r in range(1, n + 1) if cdf[r - 1] >= 1 - alpha / 2), default=None)
    if low_rank is None or high_rank is None:
        return None
    return low_rank, high_rank


@dataclass(frozen=True, slots=True)
class Welch:
    """Welch's test of NEW's mean against BASE's.

    Attributes:
        difference: mean(NEW) - mean(BASE).
        low: The difference's confidence interval, lower end.
        high: Its upper end.
        df: Welch-Satterthwaite degrees of freedom (before rounding down), inf without variance.
        p_value: Two-sided p-value of "no difference" (0 when both sides are constant and
            differ, 1 when they are constant and equal).
        confidence: The interval's confidence.
    """

    difference: float
    low: float
    high: float
    df: float
    p_value: float
    confidence: float

    @property
    def significant(self) -> bool:
        """The interval leaves out 0: the means differ at this confidence."""
        return self.low > 0 or self.high < 0


def welch(
    base: Sequence[float], new: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
) -> Welch | None:
    """Welch's two-sample t-test and interval of mean(new) - mean(base), or None (under 2 each).

    Raises:
        ValueError: `confidence` outside (0, 1).
    """
    _check_confidence(confidence)
    if len(base) < 2 or len(new) < 2:
        return None
    diff = statistics.fmean(new) - statistics.fmean(base)
    vb, vn = statistics.variance(base) / len(base), statistics.variance(new) / len(new)
    se = math.sqrt(vb + vn)
    if se == 0:
        return Welch(diff, diff, diff, math.inf, 0.0 if diff else 1.0, confidence)
    df = (vb + vn) ** 2 / (vb**2 / (len(base) - 1) + vn**2 / (len(new) - 1))
    df = max(df, 1.0)
    margin = t_quantile(0.5 + confidence / 2, df) * se
    p_value = 2 * (1 - t_cdf(abs(diff) / se, df))
    return Welch(diff, diff - margin, diff + margin, df, min(1.0, p_value), confidence)


#: The highest `--confidence` taken.
MAX_CONFIDENCE = 0.999


def parse_confidence(text: str) -> float:
    """`--confidence`: "95%" or "0.95", above 50% and at most `MAX_CONFIDENCE` (99.9%).

    Past 99.9% the t quantile of a few repeats is so wide that nothing is ever significant,
    and the value would print as "100%".

    Raises:
        ValueError: not a number, or outside (0.5, 0.999].
    """
    body = text.strip()
    try:
        value = float(body.rstrip("%").strip())
    except ValueError:
        raise ValueError(f"not a confidence: {text!r} (write 95% or 0.95)") from None
    if body.endswith("%") or value >= 1:
        value /= 100
    if not 0.5 < value <= MAX_CONFIDENCE + 1e-12:  # 99.9 / 100 is 0.9990000000000001
        raise ValueError(f"the confidence must be above 50% and at most 99.9%, got {text!r}")
    return value
