"""What one request adds to usage: its row's model name, whether it is an error, its numbers.

Pure rules, no I/O (docs/keys.md, "Usage"). A finished request (`summary_deltas`) adds:
requests 1; errors 1 unless it `completed` with a status below 400 or the client left
(`client_disconnect`: the client's choice, not a failure); input and output tokens as the
summary counts them (what the client was told; for a client that left after its request was
sent upstream, the prompt's estimate and the tokens generated so far), but only when the answer
was sent (status below 400: an error status means the client received none of it) or the client
left (the upstream did the work it was sent, whenever the client hung up); the TTFT when a
first token was sent; its duration into `generation_us_sum` when an upstream request was sent.
A request refused after authentication (`rejection_deltas`) adds the request and, unless its
client left, an error.
"""

from __future__ import annotations

from gateway.model_names import canonical_model as canonical
from gateway.neutral import RequestSummary

#: The model of a request refused before its body named one (a 429 on RPM, a malformed body).
UNKNOWN_MODEL = "-"
#: Longest model name kept (the column's width); longer names are cut.
MODEL_CHARS = 200
#: The summed columns of `gateway_usage`, in the order of a pending row's list.
COLUMNS = (
    "requests",
    "errors",
    "input_tokens",
    "output_tokens",
    "ttft_count",
    "ttft_us_sum",
    "generation_us_sum",
)


def canonical_model(model: str | None) -> str:
    """The model name usage is recorded under: the allow-list's form, at most 200 characters.

    Lower case, trimmed, with Ollama's default tag (`llama3.2` is `llama3.2:latest`, reference
    section 2.1): the same rule `Principal.allows_model` compares names by, so usage rows match
    the key's allow-list. None or blank is `UNKNOWN_MODEL`, which no canonical name equals
    (every one has a tag). A character no database can store as text (a lone surrogate, which
    a client's JSON may escape, or NUL) becomes `?`: one such row would otherwise fail every
    flush of the batch it is in, and so every key's usage after it.
    """
    name = canonical(model or "")[:MODEL_CHARS]
    if not name.isascii():
        name = name.encode("utf-8", "replace").decode("utf-8")
    return name.replace("\x00", "?") if name else UNKNOWN_MODEL


def is_error(outcome: str, status: int) -> bool:
    """Whether a request counts as an error in usage: not completed with a status below 400.

    A client that left (`client_disconnect`, before or during its answer) is not an error.
    """
    if outcome == "client_disconnect":
        return False
    return outcome != "completed" or status >= 400


def summary_deltas(summary: RequestSummary) -> tuple[int, ...]:
    """What a finished request adds, in `COLUMNS` order (durations in whole microseconds)."""
    sent = summary.status < 400  # else the client got an error, none of the answer
    ttft = summary.ttft_s if sent else None
    # A client that left (499 before the first byte) still had the upstream work for it.
    charged = sent or summary.outcome == "client_disconnect"
    return (
        1,
        int(is_error(summary.outcome, summary.status)),
        summary.tokens_in if charged else 0,
        summary.tokens_out if charged else 0,
        0 if ttft is None else 1,
        0 if ttft is None else round(ttft * 1e6),
        0 if summary.queue_wait_s is None else round(summary.duration_s * 1e6),
    )


def rejection_deltas(status: int, outcome: str) -> tuple[int, ...]:
    """What a request refused after authentication adds, in `COLUMNS` order."""
    return (1, int(is_error(outcome, status)), 0, 0, 0, 0, 0)
