"""The quality probe: a small fixed question set with short, unambiguous answers, and its score.

Owns `QUESTIONS` (the set `builtin-12`), `is_correct` (the scoring rule) and `probe_quality`
(asks every question and scores the answers). The probe does not rank models; it catches the
quantization that broke a model (a 2-bit build that no longer knows 7 + 5) in the same table as
its speed. The questions are asked one at a time with greedy sampling (temperature 0, a fixed
seed, a short `max_tokens`), non-streaming, so the answers are repeatable.

Scoring rule (`is_correct`): both the answer and each accepted form of the expected answer are
normalised (`normalise`: Unicode NFKC, case-folded, a `<think>...</think>` block dropped,
thousands separators between digits removed, every other character that is neither a letter, a
digit nor a decimal point between digits turned into a space, spaces collapsed). The answer is
correct when it contains an accepted form as a whole word: not preceded or followed by a letter
or a digit, nor by a decimal part, so `4` is not found in `14`, `40` or `4.5`, and `au` not in
`aus`. Chinese has no spaces between words, so an accepted form in CJK script is matched as a
plain substring, and each CJK character of the answer counts as a word boundary for the other
forms (`7` in `三加四等于7`). An answer that names several candidates is counted correct when one
of them is right: the probe is a smoke test of a model's knowledge, not a test of its reasoning.

Changing a question or an accepted form changes the set's name (`builtin-12` -> `builtin-13`),
so scores are only compared between runs of the same set.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from gateway.clients.bench.jsontext import loads
from gateway.clients.bench.stats import escape_error
from gateway.clients.keyfile import redact_key

QUESTION_SET = "builtin-12"
#: How the probe asks: through the chat template, or as plain text (`ask`).
Endpoint = Literal["chat", "completions"]
#: Where a plain completion is cut: a base model goes on with the next question.
STOP = ("\nQuestion:", "\n问题")

_EN = "Answer with only the answer, in as few words as possible.\nQuestion: {}\nAnswer:"
_ZH = "只用最简短的答案回答，不要解释。\n问题：{}\n答案："  # noqa: RUF001 - Chinese punctuation


@dataclass(frozen=True, slots=True)
class Question:
    """One question of the set.

    Attributes:
        id: Stable id, e.g. `arith-add`.
        prompt: The full prompt sent (the instruction to answer briefly included).
        answers: The accepted forms of the answer; the first is the one reported as expected.
    """

    id: str
    prompt: str
    answers: tuple[str, ...]


QUESTIONS: tuple[Question, ...] = (
    Question("arith-add", _EN.format("What is 7 + 5?"), ("12", "twelve")),
    Question("arith-mul", _EN.format("What is 9 times 8?"), ("72", "seventy-two")),
    Question("arith-sub", _EN.format("What is 100 minus 37?"), ("63", "sixty-three")),
    Question("capital-france", _EN.format("What is the capital of France?"), ("Paris",)),
    Question("capital-japan", _EN.format("What is the capital of Japan?"), ("Tokyo",)),
    Question("capital-australia", _EN.format("What is the capital of Australia?"), ("Canberra",)),
    Question(
        "unit-cm", _EN.format("How many centimetres are in one metre?"), ("100", "one hundred")
    ),
    Question("unit-minutes", _EN.format("How many minutes are in one hour?"), ("60", "sixty")),
    Question(
        "unit-grams", _EN.format("How many grams are in one kilogram?"), ("1000", "one thousand")
    ),
    Question("symbol-gold", _EN.format("What is the chemical symbol for gold?"), ("Au",)),
    Question("zh-capital", _ZH.format("中国的首都是哪个城市？"), ("北京", "Beijing")),  # noqa: RUF001
    Question("zh-arith", _ZH.format("三加四等于几？"), ("7", "七")),  # noqa: RUF001
)


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


#: A question file larger than this, or with more questions, is no probe (a probe asks them
#: one at a time after the load; thousands would take longer than the benchmark).
MAX_QUESTION_FILE = 8 * 1024 * 1024
MAX_QUESTIONS = 2000


class QuestionFileError(ValueError):
    """A question file that cannot be read; the message names the file and the line."""


def _accepted(line: dict[str, Any]) -> tuple[str, ...]:
    """The accepted answers of a question line (`load_questions`)."""
    found = line.get("answers", line.get("answer"))
    if isinstance(found, dict):
        forms = [found.get("value"), *(found.get("aliases") or [])]
    elif isinstance(found, list):
        forms = list(found)
    else:
        forms = [found]
    texts = [str(f) for f in forms if isinstance(f, str | int | float) and not isinstance(f, bool)]
    return tuple(t for t in (t.strip() for t in texts) if t)


def load_questions(path: str | Path) -> tuple[tuple[Question, ...], str]:
    """Read a question-and-answer JSONL file: one question per line.

    Each line is an object with `question` (sent inside the builtin set's instruction to
    answer briefly) or `prompt` (sent as it is), and `answer` (a text, a number, a list of
    accepted texts, or an object with `value` and `aliases` as TriviaQA writes it) or
    `answers` (a list); `id` is optional (default: the line number). Blank lines are skipped.
    Answers are scored by the builtin rule (`is_correct`).

    Returns:
        The questions and the set's name, `file:<name>@<first 12 hex of its SHA-256>`: a
        changed file is another set, and scores are only compared within one.

    Raises:
        QuestionFileError: unreadable, too large (`MAX_QUESTION_FILE`, `MAX_QUESTIONS`), a
            line that is not a JSON object with a question and an answer, or no question.
    """
    where = Path(path)
    try:
        if where.stat().st_size > MAX_QUESTION_FILE:
            raise QuestionFileError(f"{where}: larger than {MAX_QUESTION_FILE // 2**20} MiB")
        raw = where.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise QuestionFileError(f"{where}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise QuestionFileError(f"{where}: not UTF-8 text") from None
    questions: list[Question] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            raise QuestionFileError(f"{where} line {number}: not JSON") from None
        if not isinstance(item, dict):
            raise QuestionFileError(f"{where} line {number}: not a JSON object")
        asked = item.get("prompt")
        if not isinstance(asked, str) or not asked.strip():
            question = item.get("question")
            if not isinstance(question, str) or not question.strip():
                raise QuestionFileError(f"{where} line {number}: no 'question' or 'prompt'")
            asked = _EN.format(question.strip())
        accepted = _accepted(item)
        if not accepted:
            raise QuestionFileError(f"{where} line {number}: no 'answer' or 'answers'")
        ident = item.get("id")
        questions.append(
            Question(str(ident) if ident is not None else str(number), asked, accepted)
        )
        if len(questions) > MAX_QUESTIONS:
            raise QuestionFileError(f"{where}: more than {MAX_QUESTIONS} questions")
    if not questions:
        raise QuestionFileError(f"{where}: no question")
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return tuple(questions), f"file:{where.name}@{digest}"


_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_SEPARATORS = re.compile(r"(?!(?<=\d)\.(?=\d))[^\w]|_")
_SPACES = re.compile(r"\s+")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def normalise(text: str) -> str:
    """Normalise an answer or an expected form for comparison (the module docstring's rule)."""
    text = _THINK.sub(" ", unicodedata.normalize("NFKC", text).casefold())
    text = _SEPARATORS.sub(" ", _THOUSANDS.sub("", text))
    return _SPACES.sub(" ", text).strip()


def is_correct(answer: str, accepted: Sequence[str]) -> bool:
    """Tell whether an answer contains one of the accepted forms (the module docstring's rule).

    Args:
        answer: The model's answer text.
        accepted: The accepted forms of the expected answer.
    """
    said = normalise(answer)
    # Each CJK character is a word of its own for a Latin or digit form: `7` in `等于7`.
    spaced = _CJK.sub(r" \g<0> ", said)
    for form in map(normalise, accepted):
        if not form:
            continue
        if _CJK.search(form):
            if form in said:
                return True
        elif re.search(rf"(?<![^\W_])(?<!\d\.){re.escape(form)}(?![^\W_]|\.\d)", spaced):
            return True
    return False


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
