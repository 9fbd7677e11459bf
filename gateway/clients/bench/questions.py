"""The quality probe's questions: the built-in set, question files, and the scoring rule.

Owns `QUESTIONS` (the set `builtin-12`), `load_questions` (a JSON Lines file of questions, each
with its accepted answers) and `is_correct` (the scoring rule, below). No I/O but reading a
question file: asking a target is `gateway.clients.bench.quality`'s.

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

import hashlib
import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUESTION_SET = "builtin-12"
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
