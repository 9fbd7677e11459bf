"""Model aliases (`GATEWAY_MODEL_ALIASES`): which name wins, and what is refused at start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.model_names import ModelAliases
from gateway.settings import Settings

ALIASES = {
    "claude-*": "qwen3-coder:30b",
    "claude-3-5-haiku*": "qwen2.5:7b",
    "claude-opus-4": "llama3.2:latest",
    "gpt-5-codex": "qwen2.5:7b",
    "*-mini": "small:1b",
    "o*-mini": "tiny:1b",
}


@pytest.mark.parametrize(
    ("asked", "runs"),
    [
        ("claude-sonnet-4-5-20250929", "qwen3-coder:30b"),  # the one pattern that matches
        ("claude-3-5-haiku-20241022", "qwen2.5:7b"),  # the longer of two patterns
        ("claude-opus-4", "llama3.2:latest"),  # an exact name over both patterns
        ("Claude-Opus-4:latest", "llama3.2:latest"),  # compared as allow-lists compare
        ("claude-opus-4-1", "qwen3-coder:30b"),  # not the exact name: the pattern
        ("GPT-5-Codex", "qwen2.5:7b"),
        ("gpt-5-codex-mini", "small:1b"),
        ("o4-mini", "tiny:1b"),  # `o*-mini` (7 characters) is longer than `*-mini` (6)
        ("llama3.2", "llama3.2"),  # no alias: the name as sent
        ("claude", "claude"),  # `claude-*` needs the dash
    ],
)
def test_an_exact_name_wins_then_the_longest_pattern(asked: str, runs: str) -> None:
    assert ModelAliases(ALIASES).resolve(asked) == runs


def test_between_patterns_of_one_length_the_first_listed_wins() -> None:
    assert ModelAliases({"a*": "first", "*b": "second"}).resolve("ab") == "first"
    assert ModelAliases({"*b": "second", "a*": "first"}).resolve("ab") == "second"


def test_a_pattern_matches_the_name_with_its_default_tag_and_only_star_is_special() -> None:
    aliases = ModelAliases({"*:latest": "x:1b", "what?[1]*": "y:1b"})
    assert aliases.resolve("llama3") == "x:1b"  # llama3 is llama3:latest
    assert aliases.resolve("what?[1]-model") == "y:1b"
    assert aliases.resolve("whatx1-model:7b") == "whatx1-model:7b"


def test_no_aliases_resolve_nothing() -> None:
    aliases = ModelAliases({})
    assert not aliases
    assert aliases.target("claude-sonnet-4") is None
    assert Settings().aliases.resolve("claude-sonnet-4") == "claude-sonnet-4"


def test_the_setting_reads_a_json_object_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_MODEL_ALIASES", '{"claude-*": "qwen3-coder:30b"}')
    settings = Settings()
    assert settings.model_aliases == {"claude-*": "qwen3-coder:30b"}
    assert settings.aliases.resolve("claude-haiku-4-5") == "qwen3-coder:30b"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"claude-*": qwen}', "GATEWAY_MODEL_ALIASES is not valid JSON"),
        ('["claude-*"]', "GATEWAY_MODEL_ALIASES must be a JSON object"),
        ('{"claude-*": 3}', "GATEWAY_MODEL_ALIASES must be a JSON object"),
        ('{"claude-*": ""}', "non-empty name and target"),
        ('{"  ": "qwen2.5:7b"}', "non-empty name and target"),
        ('{"a": "b*"}', "must be a model, not a pattern"),
        ('{"a": "b", "b": "c"}', "'b', is itself an alias"),
        ('{"q*": "qwen2.5:7b"}', "is itself an alias"),  # a pattern that takes its own target
        ('{"gpt-5": "a:1b", "GPT-5:latest": "b:1b"}', "listed twice"),
    ],
)
def test_a_bad_setting_is_a_clear_error_at_start(monkeypatch, value: str, message: str) -> None:
    monkeypatch.setenv("GATEWAY_MODEL_ALIASES", value)
    with pytest.raises(ValidationError, match="GATEWAY_MODEL_ALIASES") as raised:
        Settings()
    assert message in str(raised.value)
