"""`gateway.context`: one `RequestContext` per request, and which outcome a request ended with.

Pure units: no app, no sockets.
"""

from __future__ import annotations

import time
import typing

import pytest

from gateway.auth.principal import Principal
from gateway.context import CONTEXT_KEY, RequestContext, ending, request_context
from gateway.neutral import Outcome, RequestSummary


def _summary(outcome: Outcome) -> RequestSummary:
    return RequestSummary("/api/chat", "m", "all", None, outcome, 200, 0.1)


def test_request_context_is_made_once_and_kept_at_one_scope_key() -> None:
    scope: dict[str, typing.Any] = {"type": "http"}
    before = time.perf_counter()
    context = request_context(scope)
    assert list(scope) == ["type", CONTEXT_KEY]
    assert request_context(scope) is context
    assert before <= context.arrival <= time.perf_counter()
    assert context.request_id == "-"
    assert context.key_id is None
    assert context.outcome is None
    assert not context.metered


def test_each_scope_has_its_own_context() -> None:
    assert request_context({}) is not request_context({})


def test_key_id_is_the_principals() -> None:
    context = RequestContext("r1", principal=Principal("abc", "team", None))
    assert context.key_id == "abc"


def test_the_last_outcome_set_wins_without_a_summary() -> None:
    context = RequestContext()
    context.set_outcome("rate_limited")
    assert context.outcome == "rate_limited"
    context.set_outcome("error")  # e.g. an unexpected exception after a handled refusal
    assert context.outcome == "error"
    assert not context.metered


def test_the_summary_outcome_wins_over_any_set_before_or_after() -> None:
    context = RequestContext()
    context.set_outcome("bad_request")
    context.finish(_summary("upstream_error"))
    assert context.outcome == "upstream_error"
    context.set_outcome("timeout")  # the error handler sees the relay's raised failure
    assert context.outcome == "upstream_error"
    assert context.metered


@pytest.mark.parametrize("relayed", ["completed", "upstream_error", "timeout"])
@pytest.mark.parametrize("shutdown", [False, True])
def test_an_answer_that_ended_by_itself_keeps_its_own_outcome(
    relayed: Outcome, shutdown: bool
) -> None:
    assert ending(relayed, shutdown=shutdown) == relayed


def test_a_cut_short_answer_is_a_shutdown_only_when_the_gateway_stopped_it() -> None:
    assert ending(None, shutdown=True) == "shutdown"
    assert ending(None, shutdown=False) == "client_disconnect"


def test_outcome_labels_are_the_documented_ones() -> None:
    # docs/metrics.md's table, plus the batch line's own two (docs/batch.md).
    documented = {
        "completed",
        "client_disconnect",
        "shutdown",
        "upstream_error",
        "timeout",
        "client_error",
        "rejected_auth",
        "forbidden",
        "rate_limited",
        "rejected_busy",
        "bad_request",
        "not_found",
        "error",
        "preempted",
        "deferred",
    }
    assert set(typing.get_args(Outcome)) == documented
