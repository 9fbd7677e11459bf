"""Length distributions for prompts and answers: fixed, uniform, normal, or the data set's own.

Owns `Lengths` and `parse_lengths`. A distribution draws whole numbers >= 1 from a
`random.Random` the caller seeds, so the same text and seed give the same lengths in the same
order (a run is reproducible, and two runs with the same seed asked the same thing). The text
forms, as `--prompt-words` and `--output-tokens` take them:

* `128` or `fixed:128`: always 128;
* `uniform:64,256`: uniform over 64..256, both ends included (`Random.randint`);
* `normal:128,32`: normal with mean 128 and standard deviation 32 (`Random.gauss`), rounded
  and clamped to 1..mean + 4 sd; `normal:128,32,16,512` clamps to 16..512 instead;
* `dataset`: each prompt keeps the length its data set line gives (GuideLLM
  `output_tokens_count`, AIPerf `output_length`; for prompt words, the text as written).

GuideLLM's synthetic data (`prompt_tokens`, `prompt_tokens_stdev`, `prompt_tokens_min`,
`prompt_tokens_max`) and AIPerf's `--isl`/`--isl-stddev` draw the same clamped normal shape;
the clamp keeps a heavy tail from asking for 0 or 100,000 tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Kind = Literal["fixed", "uniform", "normal", "dataset"]


@dataclass(frozen=True, slots=True)
class Lengths:
    """A distribution of whole lengths >= 1.

    Attributes:
        kind: `fixed`, `uniform`, `normal` or `dataset` (the data set's own; `draw` refuses).
        low: `fixed`: the value; `uniform`: the lowest; `normal`: the clamp's lowest.
        high: `uniform`: the highest; `normal`: the clamp's highest; `fixed`: = low.
        mean: `normal`: the mean (else the distribution's mean, for reports).
        stddev: `normal`: the standard deviation (else 0, or the uniform's).

    Raises:
        ValueError: a bound below 1, low above high, a negative standard deviation.
    """

    kind: Kind
    low: int = 1
    high: int = 1
    mean: float = 1.0
    stddev: float = 0.0

    def __post_init__(self) -> None:
        """Refuse a distribution that could draw nothing or a length below 1."""
        if self.kind == "dataset":
            return
        if self.low < 1 or self.high < self.low:
            raise ValueError(f"lengths need 1 <= low <= high, got {self.low} and {self.high}")
        if self.stddev < 0:
            raise ValueError(f"a standard deviation is >= 0, got {self.stddev:g}")

    @property
    def text(self) -> str:
        """The distribution as `parse_lengths` reads it back."""
        if self.kind == "fixed":
            return f"fixed:{self.low}"
        if self.kind == "uniform":
            return f"uniform:{self.low},{self.high}"
        if self.kind == "normal":
            return f"normal:{self.mean:g},{self.stddev:g},{self.low},{self.high}"
        return "dataset"

    def draw(self, rng: random.Random) -> int:
        """One length from `rng`.

        Raises:
            ValueError: a `dataset` distribution (the caller keeps the line's own length).
        """
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        if self.kind == "normal":
            return min(self.high, max(self.low, round(rng.gauss(self.mean, self.stddev))))
        raise ValueError("the data set's lengths are not drawn")


def _numbers(text: str, spec: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"lengths {spec!r}: not numbers separated by commas") from None


def _whole(value: float, spec: str) -> int:
    if value != int(value) or value < 1:
        raise ValueError(f"lengths {spec!r}: {value:g} is not a whole number >= 1")
    return int(value)


def parse_lengths(spec: str) -> Lengths:
    """The distribution `spec` names (module docstring for the forms).

    Raises:
        ValueError: an unknown kind, a wrong count of numbers, or numbers no distribution takes
            (the message quotes `spec`).
    """
    text = spec.strip()
    if text == "dataset":
        return Lengths("dataset")
    kind, _, rest = text.partition(":")
    if not rest:
        kind, rest = "fixed", kind
    if kind not in ("fixed", "uniform", "normal"):
        raise ValueError(f"lengths {spec!r}: use N, fixed:N, uniform:LOW,HIGH, normal:MEAN,SD")
    numbers = _numbers(rest, spec)
    if kind == "fixed":
        if len(numbers) != 1:
            raise ValueError(f"lengths {spec!r}: fixed takes one number")
        value = _whole(numbers[0], spec)
        return Lengths("fixed", value, value, float(value))
    if kind == "uniform":
        if len(numbers) != 2:
            raise ValueError(f"lengths {spec!r}: uniform takes LOW,HIGH")
        low, high = (_whole(n, spec) for n in numbers)
        spread = ((high - low + 1) ** 2 - 1) / 12  # the discrete uniform's variance
        try:
            return Lengths("uniform", low, high, (low + high) / 2, spread**0.5)
        except ValueError as exc:
            raise ValueError(f"lengths {spec!r}: {exc}") from None
    if len(numbers) not in (2, 4):
        raise ValueError(f"lengths {spec!r}: normal takes MEAN,SD or MEAN,SD,MIN,MAX")
    mean, sd = numbers[0], numbers[1]
    if mean < 1 or sd < 0:
        raise ValueError(f"lengths {spec!r}: normal needs a mean >= 1 and an SD >= 0")
    if len(numbers) == 4:
        low, high = _whole(numbers[2], spec), _whole(numbers[3], spec)
    else:
        low, high = 1, max(1, round(mean + 4 * sd))
    try:
        return Lengths("normal", low, high, mean, sd)
    except ValueError as exc:
        raise ValueError(f"lengths {spec!r}: {exc}") from None
