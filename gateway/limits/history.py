"""What a key's recent answers on a model needed: the output part of its TPM reservation.

A coding agent declares a bound far above what it uses (Claude Code sends `max_tokens: 32000`
on every turn for answers of a few hundred tokens). Reserving the bound would hold 32,000 tokens
of the key's window per request; reserving what the key's last answers on that model needed
holds what the request will most likely use (`gateway.limits.limiter`, docs/keys.md#limits).

Kept in this process only (each replica learns on its own; a restart forgets), bounded: the
last `ANSWERS` answers per (key, model), for the `PAIRS` pairs used most recently.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from gateway.model_names import canonical_model

#: Answers remembered per key and model; the expectation is their maximum.
ANSWERS = 20
#: (key, model) pairs remembered; the least recently used is forgotten first.
PAIRS = 10_000


class AnswerHistory:
    """The output tokens of each key's last `ANSWERS` completed answers per model."""

    def __init__(self, answers: int = ANSWERS, pairs: int = PAIRS) -> None:
        self._answers = answers
        self._pairs = pairs
        self._seen: OrderedDict[tuple[str, str], deque[int]] = OrderedDict()

    def expected(self, key_id: str, model: str) -> int | None:
        """The most output tokens one of the key's last answers on `model` used, or None.

        None until the key has a completed answer on the model (names compared as
        allow-lists compare them).
        """
        answers = self._seen.get((key_id, canonical_model(model)))
        return None if not answers else max(answers)

    def record(self, key_id: str, model: str, output_tokens: int) -> None:
        """Remember one completed answer's output tokens (negative counts as 0)."""
        pair = (key_id, canonical_model(model))
        answers = self._seen.get(pair)
        if answers is None:
            answers = self._seen[pair] = deque(maxlen=self._answers)
            if len(self._seen) > self._pairs:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(pair)
        answers.append(max(output_tokens, 0))
