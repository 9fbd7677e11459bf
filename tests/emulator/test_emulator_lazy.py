"""The emulator makes an answer's tokens as it sends them (issue 16: a suite that holds under
load): a huge answer starts at once, and the counts and `done_reason` are those of the list."""

from __future__ import annotations

import itertools

from gateway.testing.emulator.config import EmulatorConfig
from gateway.testing.emulator.content import PLAIN, plan


def test_a_huge_answer_is_planned_without_being_built():
    pieces, reason = plan(EmulatorConfig(tokens=10**12), None, PLAIN)
    assert reason == "stop"
    assert [p.content for p in itertools.islice(pieces, 3)] == ["tok0 ", "tok1 ", "tok2 "]


def test_a_limit_cuts_the_answer_and_says_length():
    config = EmulatorConfig(tokens=5, thinking_tokens=2)
    pieces, reason = plan(config, 3, PLAIN)
    assert reason == "length"
    assert [(p.thinking, p.content) for p in pieces] == [
        ("think0 ", ""),
        ("think1 ", ""),
        ("", "tok0 "),
    ]
    pieces, reason = plan(config, 7, PLAIN)
    assert (reason, len(list(pieces))) == ("stop", 7)
