"""One output bound per request: what the TPM reservation counts is what every upstream obeys.

An OpenAI body can name its bound three ways (`max_tokens`, `max_completion_tokens`, llama.cpp's
`n_predict`); servers read different ones. The surface takes the largest, and each dialect sends
that one bound under every name, so no name the reservation ignored can lift it (found by the
attack on issue 12: `max_completion_tokens: 1` beside `max_tokens: 100000`).
"""

from __future__ import annotations

import json

import pytest

from gateway.api.ollama.schema import parse_generation
from gateway.api.openai.schema import parse_chat
from gateway.errors import UnprocessableError
from gateway.settings import Settings
from gateway.upstream.dialects.ollama import OllamaDialect
from gateway.upstream.dialects.openai import OpenAIDialect

MESSAGES = [{"role": "user", "content": "hi"}]


def _chat(**fields: object):
    raw = json.dumps({"model": "m", "messages": MESSAGES, **fields}).encode()
    return parse_chat(raw, Settings())


@pytest.mark.parametrize(
    "fields",
    [
        {"max_completion_tokens": 1, "max_tokens": 100_000},
        {"max_tokens": 1, "n_predict": 100_000},
        {"max_completion_tokens": None, "max_tokens": 100_000},
        {"max_tokens": 1e5},
    ],
)
def test_the_largest_bound_is_reserved_and_sent_under_every_name(fields: dict) -> None:
    request = _chat(**fields)
    assert request.max_output_tokens == 100_000
    sent = json.loads(OpenAIDialect().build_request(request, {}).content)
    assert sent["max_tokens"] == 100_000
    for name in fields:
        if fields[name] is not None:
            assert sent[name] == 100_000
    native = json.loads(OllamaDialect().build_request(request, {}).content)
    assert native["options"]["num_predict"] == 100_000


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"n_predict": -1}, "n_predict must be a positive integer"),
        ({"best_of": 4}, "best_of must be 1"),
        ({"n": 2}, "n must be 1"),
        ({"lora": [{"id": 0, "scale": 1.0}]}, "lora"),
    ],
)
def test_fields_that_would_multiply_the_output_or_change_the_model_are_refused(
    fields: dict, message: str
) -> None:
    with pytest.raises(UnprocessableError, match=message):
        _chat(**fields)


def test_a_slot_choice_does_not_reach_the_upstream() -> None:
    sent = json.loads(OpenAIDialect().build_request(_chat(id_slot=0), {}).content)
    assert "id_slot" not in sent


def test_an_integral_float_num_predict_is_the_bound_ollama_will_obey() -> None:
    raw = b'{"model":"m","prompt":"x","options":{"num_predict":1e5}}'
    assert parse_generation(raw, "generate", Settings()).max_output_tokens == 100_000
