"""The quality probe: asks a target the question set and scores the answers.

Owns `QualityProbe` (how the probe asks) and `probe_quality` (asks every question, one at a
time, and scores the answers with `gateway.clients.bench.questions.is_correct`). The probe does
not rank models; it catches the quantization that broke a model (a 2-bit build that no longer
knows 7 + 5) in the same table as its speed. The questions are asked with greedy sampling
(temperature 0, a fixed seed, a short `max_tokens`), non-streaming, so the answers are
repeatable. The questions and the scoring rule are `gateway.clients.bench.questions`'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from gateway.clients.bench.jsontext import loads
from gateway.clients.bench.questions import QUESTION_SET, QUESTIONS, Question, is_correct
from gateway.clients.bench.stats import escape_error
from gateway.clients.keyfile import redact_key

#: How the probe asks: through the chat template, or as plain text (`ask`).
Endpoint = Literal["chat", "completions"]
#: Where a plain completion is cut: a base model goes on with the next question.
STOP = ("\nQuestion:", "\n问题")


@dataclass(frozen=True, slots=True)
class QualityProbe:
    """How the probe asks: the endpoint, the question set, the answer length.

    Attributes:
        endpoint: `chat` (through the chat template, as an application asks) or
            `completions` (the prompt as plain text: a base model, or a template that breaks
            a small model's answers).
        questions: The set (`QUESTIONS`, or a file's: `load_questions`).
        question_set: The set's name, reported as `set` (`builtin-12`, `file:qa.jsonl@<hash>`).
        max_tokens: The most tokens per answer.
    """

    endpoint: Endpoint = "chat"
    questions: tuple[Question, ...] = field(default=QUESTIONS)
    question_set: str = QUESTION_SET
    max_tokens: int = 32


#: Bytes of an answer read; an answer of 32 tokens is well under 1 KiB, and a larger one is
#: refused before it fills memory (httpx alone reads any answer whole).
MAX_ANSWER = 1024 * 1024


class AnswerStatusError(ValueError):
    """The target answered an error status; the message holds it and the body's start."""


async def _read(response: httpx.Response) -> bytes:
    """The body of a streamed answer, at most `MAX_ANSWER` bytes.

    Raises:
        ValueError: The body is longer.
    """
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > MAX_ANSWER:
            raise ValueError(f"the answer is longer than {MAX_ANSWER} bytes")
    return bytes(body)


async def ask(
    client: httpx.AsyncClient,
    api: Literal["ollama", "openai"],
    model: str,
    prompt: str,
    *,
    seed: int = 1234,
    max_tokens: int = 32,
    endpoint: Endpoint = "chat",
) -> str:
    """Ask one question, non-streaming, greedy (temperature 0).

    `chat` asks as an application would, through the model's chat template: Ollama
    `POST /api/generate` with `stream: false` and `options` `temperature`, `seed`,
    `num_predict` (its `response`); OpenAI `POST /v1/chat/completions` with `temperature`,
    `seed`, `max_tokens` (`choices[0].message.content`). `completions` sends the prompt as
    plain text, no template: Ollama `/api/generate` with `raw: true`, OpenAI
    `POST /v1/completions` (`choices[0].text`), both stopped at a new `Question:` line (`STOP`)
    so a base model's continuation is not scored. At most `MAX_ANSWER` bytes are read.

    Args:
        client: A client whose `base_url` is the target (with the key in its headers).
        api: The target's API.
        model: The model.
        prompt: The question's prompt.
        seed: The sampling seed.
        max_tokens: The most tokens to generate.
        endpoint: `chat` (through the chat template) or `completions` (plain text).

    Returns:
        The answer text.

    Raises:
        httpx.HTTPError: Unreachable, or a read timed out.
        AnswerStatusError: An error status.
        ValueError: The answer is longer than `MAX_ANSWER` bytes or not the API's JSON shape.
    """
    plain = endpoint == "completions"
    if api == "ollama":
        options: dict[str, Any] = {"temperature": 0.0, "seed": seed, "num_predict": max_tokens}
        body: dict[str, Any] = {"model": model, "prompt": prompt, "stream": False}
        if plain:
            body["raw"] = True  # Ollama's API: no template applied
            options["stop"] = list(STOP)
        path, body = "/api/generate", body | {"options": options}
    else:
        sampling = {"temperature": 0.0, "seed": seed, "max_tokens": max_tokens, "stream": False}
        if plain:
            body = {"model": model, "prompt": prompt, "stop": list(STOP)} | sampling
            path = "/v1/completions"
        else:
            body = {"model": model, "messages": [{"role": "user", "content": prompt}]} | sampling
            path = "/v1/chat/completions"
    async with client.stream("POST", path, json=body) as response:
        if response.is_error:
            start = b""
            async for piece in response.aiter_bytes():
                start += piece
                if len(start) >= 200:
                    break
            text = start[:200].decode("utf-8", "replace")
            raise AnswerStatusError(f"HTTP {response.status_code}: {text}")
        raw = await _read(response)
    data = loads(raw)
    try:
        if api == "ollama":
            text = data["response"]
        elif plain:
            text = data["choices"][0]["text"]
        else:
            text = data["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no answer text in the {api} response") from exc
    if not isinstance(text, str):
        raise ValueError(f"the {api} answer text is not a string")
    return text


def _failure(exc: Exception, key: str | None) -> str:
    """The failure for the record: the status and the start of the body, escaped and cut.

    `key` is redacted before any cut (`stats.escape_error`), so none of it survives one.
    """
    if isinstance(exc, AnswerStatusError):
        return escape_error(redact_key(str(exc), key), key=key)
    return escape_error(f"{type(exc).__name__}: {exc}", key=key)


async def probe_quality(
    url: str,
    model: str,
    *,
    api: Literal["ollama", "openai"] = "ollama",
    key: str | None = None,
    seed: int = 1234,
    max_tokens: int = 32,
    request_timeout: float = 120.0,
    questions: Sequence[Question] = QUESTIONS,
    question_set: str = QUESTION_SET,
    notes: list[str] | None = None,
    endpoint: Endpoint = "chat",
) -> dict[str, Any]:
    """Ask every question of the set, one at a time, and score the answers.

    A question whose request fails (error status, timeout, no answer text) is counted as wrong
    with its error recorded, and one note summarises the failures. After a question timed out
    the rest are not asked (counted wrong, `not asked: ...`): the probe takes at most one
    `request_timeout` beyond the answers that came.

    Args:
        url: The target's base URL (the upstream, or the gateway).
        model: The model.
        api: The target's API (`ollama`: `/api/generate`; `openai`: `/v1/chat/completions`).
        key: Sent as `Authorization: Bearer` (never stored in the result).
        seed: The sampling seed.
        max_tokens: The most tokens per answer.
        request_timeout: Seconds allowed per question in all, however slowly the answer
            arrives (the first may include the model's load).
        questions: The set; `QUESTIONS` by default.
        question_set: The set's name, reported as `set`.
        notes: When given, the failure note is appended to it.
        endpoint: `chat` (through the chat template) or `completions` (plain text): `ask`.

    Returns:
        The run's `quality` object: `{"score": correct / total (None for an empty set),
        "correct", "total", "errors", "set", "endpoint", "answers": [{"id", "expected",
        "answer", "correct", "error"}, ...]}` (`answer` None when the request failed).
    """
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answers: list[dict[str, Any]] = []
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(request_timeout)
    ) as client:
        stalled: str | None = None  # why the questions left are not asked
        for question in questions:
            text: str | None = None
            error: str | None = None
            if stalled is not None:
                error = f"not asked: {stalled}"
            else:
                try:
                    # httpx's timeout bounds each read, not the answer: a server trickling a
                    # byte at a time would hold the probe for ever without a deadline of its own.
                    async with asyncio.timeout(request_timeout):
                        text = await ask(
                            client,
                            api,
                            model,
                            question.prompt,
                            seed=seed,
                            max_tokens=max_tokens,
                            endpoint=endpoint,
                        )
                except (TimeoutError, httpx.TimeoutException) as exc:
                    error = f"no answer within {request_timeout:g} s"
                    if isinstance(exc, httpx.TimeoutException):
                        error = _failure(exc, key)
                    # A server that cannot answer one short question in time will not answer
                    # the next: asking them all would hold the run for one timeout each.
                    stalled = f"an earlier question got no answer within {request_timeout:g} s"
                except (httpx.HTTPError, ValueError) as exc:
                    error = _failure(exc, key)
            answers.append(
                {
                    "id": question.id,
                    "expected": question.answers[0],
                    "answer": text,
                    "correct": text is not None and is_correct(text, question.answers),
                    "error": error,
                }
            )
    correct = sum(answer["correct"] for answer in answers)
    errors = [answer for answer in answers if answer["error"] is not None]
    if errors and notes is not None:
        notes.append(
            f"quality probe of {model}: {len(errors)} of {len(answers)} questions failed "
            f"(first: {errors[0]['error']}), counted as wrong"
        )
    return {
        "score": correct / len(answers) if answers else None,
        "correct": correct,
        "total": len(answers),
        "errors": len(errors),
        "set": question_set,
        "endpoint": endpoint,
        "answers": answers,
    }
