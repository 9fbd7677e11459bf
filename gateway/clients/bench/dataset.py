"""Workloads from data set files and synthetic ones: the formats GuideLLM and AIPerf read.

Owns `DatasetOptions` and `build_workload`, which turns `--workload` and the length and
conversation options into a `gateway.clients.bench.workload.Workload`. A file may be JSONL (one
object a line; blank and `#` lines skipped), JSON (a list of objects, or an object whose `data`
is one) or CSV (a header row; `.csv`). Each record is read by its keys, so a user's existing
files work as they are:

* GuideLLM (docs/guides/datasets.md, `--data-args`): a prompt column, by default the first of
  `prompt`, `text`, `content`, `instruction`, `question`, `input`; optional
  `output_tokens_count` (the answer's length) and `prompt_tokens_count` (informational);
* AIPerf `single_turn` (docs/tutorials/custom-dataset.md): `{"text": ..., "output_length"?}`;
* AIPerf `multi_turn`: `{"session_id", "turns": [{"text", "output_length"?, "role"?}]}`; a
  leading `{"role": "system"}` turn is the conversation's system message, as AIPerf lifts it;
* AIPerf `mooncake_trace`: `{"timestamp", "input_length", "output_length", "hash_ids"}`: a
  prompt of `input_length` words built from one fixed block of `MOONCAKE_BLOCK` words per hash
  id, so records that share hash ids share a prefix, as the trace's requests did (the
  timestamps are not replayed: `--rate`/`--arrivals` set the schedule);
* ShareGPT: `{"conversations": [{"from": "human"|"gpt"|"system", "value"}]}`: the human turns
  become a conversation's user turns, each answer limited to the length (in words) of the
  recorded `gpt` answer when `--output-tokens dataset`;
* this tool's own `{"id"?, "prompt"}` and `{"id"?, "messages": [...]}`.

A bad record fails the whole load with `WorkloadError` naming `file:line` (JSONL, CSV) or
`file:item N` (JSON). Lengths are in words for prompts (this tool holds no tokenizer: most
tokenizers give 1 to 1.5 tokens per English word) and in tokens for answers (`max_tokens`).
Everything drawn (lengths, synthetic words) comes from one `random.Random(seed)`: the same
options give the same workload, and the same digest.

Over ~300 lines for one reason: `build_workload` turns every source into a `Workload` with one
seeded `random.Random`, and the format readers (`_record`, `_multi_turn`, `_sharegpt`, `_mooncake`)
feed the same length rules and draws (`_with_lengths`, `synthetic_text`); split by format, what
makes a workload repeatable would be spread out.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gateway.clients.bench.jsontext import loads
from gateway.clients.bench.lengths import Lengths
from gateway.clients.bench.stats import escape_error
from gateway.clients.bench.workload import (
    BUILTIN,
    Conversation,
    Prompt,
    Sampling,
    Turn,
    Workload,
    WorkloadError,
    chat_messages,
    load_workload,
)

SYNTHETIC = "synthetic"
"""`--workload synthetic`: generated prompts of `--prompt-words` words."""

#: GuideLLM's default prompt columns, in the order tried (plus AIPerf's `text`).
PROMPT_COLUMNS = ("prompt", "text", "content", "instruction", "question", "input")
#: The answer-length fields: GuideLLM's column, AIPerf's field.
OUTPUT_COLUMNS = ("output_tokens_count", "output_length")
#: Words per Mooncake hash block (the trace's block is 512 tokens; a word is about a token).
MOONCAKE_BLOCK = 512
#: The largest data set file read, bytes: the whole file is held (and parsed) in memory.
MAX_FILE_BYTES = 256 << 20
#: The longest prompt a record may declare (Mooncake `input_length`), words: about a million
#: tokens, past any model's context; a 50-byte line must not ask for gigabytes.
MAX_INPUT_WORDS = 1_000_000
#: Words all of a data set's prompts and turns may hold together (about 120 MB of text).
MAX_TOTAL_WORDS = 20_000_000
#: The largest answer length a record may declare (`output_length`, `output_tokens_count`).
MAX_OUTPUT_TOKENS = 1_000_000
#: The synthetic vocabulary: short common words, so a word is close to one token.
_WORDS = tuple(
    (  # noqa: SIM905 - one string reads better than 150 quoted words
        "the of and to in is was for on are with as by at from that this have not but all "
        "can will one time year people way day man thing woman life child world school state "
        "family group country problem hand part place case week company system program "
        "question work number night point home water room mother area money story fact month "
        "lot right study book eye job word business issue side kind head house service "
        "friend father power hour game line end member law car city name team minute idea "
        "body back parent face others level office door health person art war history party "
        "result change morning reason"
    ).split()
)


@dataclass(frozen=True, slots=True)
class DatasetOptions:
    """How a workload is built beyond its source.

    Attributes:
        prompt_words: Synthetic prompts' (and synthetic turns') length in words; None: 64.
        output_tokens: Each prompt's answer limit; None: the run's `--max-tokens` (a data
            set's own lengths still apply); `dataset` keeps the file's and falls back to the
            run's.
        prompts: Synthetic prompts to generate (single-turn).
        conversations: Synthetic conversations (multi-turn; 0: single-turn).
        turns: User turns per synthetic conversation.
        system_words: Words of the system message shared by every synthetic conversation
            (0: none).
        seed: The seed of every length and word drawn.
    """

    prompt_words: Lengths | None = None
    output_tokens: Lengths | None = None
    prompts: int = 64
    conversations: int = 0
    turns: int = 1
    system_words: int = 0
    seed: int = 1234

    def __post_init__(self) -> None:
        """Refuse counts no workload could use.

        Raises:
            WorkloadError: a count below 1 (below 0 for `conversations`, `system_words`).
        """
        if self.prompts < 1 or self.turns < 1:
            raise WorkloadError("--prompts and --turns must be at least 1")
        if self.conversations < 0 or self.system_words < 0:
            raise WorkloadError("--conversations and --system-words must be 0 or more")


def synthetic_text(words: int, rng: random.Random) -> str:
    """`words` words drawn from a fixed vocabulary with `rng` (a prompt of known length)."""
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def word_count(text: str) -> int:
    """Words in `text` (whitespace-separated): the unit of `prompt_words` and records."""
    return len(text.split())


def build_workload(spec: str, sampling: Sampling, options: DatasetOptions) -> Workload:
    """The workload `spec` names, with `options` applied.

    Args:
        spec: `builtin[:sel]`, `synthetic`, or a data set file (module docstring).
        sampling: The sampling of every request (its `max_tokens` is the default limit).
        options: Lengths, synthetic counts, the seed.

    Returns:
        A single-turn workload, or a multi-turn one (`conversations` non-empty) for a
        `multi_turn` or ShareGPT file, or `synthetic` with `conversations` > 0.

    Raises:
        WorkloadError: an unknown suite, an unreadable file, a bad record (`file:line`), or a
            length option that does not fit the source (`dataset` lengths for a synthetic or
            builtin one).
    """
    rng = random.Random(options.seed)  # noqa: S311 - a reproducible workload, not a secret
    if spec == SYNTHETIC:
        return _synthetic(sampling, options, rng)
    if spec == BUILTIN or spec.startswith(f"{BUILTIN}:"):
        dataset = [o for o in (options.prompt_words, options.output_tokens) if o is not None]
        if any(lengths.kind == "dataset" for lengths in dataset):
            # The suites record no answer lengths: saying nothing would run on --max-tokens.
            raise WorkloadError(
                f"the {BUILTIN} workload has no data set lengths: give --output-tokens N (or"
                " uniform:/normal:), or leave it out to use --max-tokens"
            )
        base = load_workload(spec, sampling)
        return _with_lengths(base, options, rng)
    path = Path(spec)
    if not path.is_file():
        raise WorkloadError(
            f"unknown workload {escape_error(spec, 80)!r}: neither a built-in suite,"
            f" {SYNTHETIC}, nor a file"
        )
    prompts, conversations = read_dataset(path)
    if prompts and conversations:
        raise WorkloadError(f"{path}: mixes single prompts and conversations; split the file")
    if conversations:
        firsts = tuple(Prompt(f"{c.id}-1", text=c.turns[0].text) for c in conversations)
        workload = Workload(spec, firsts, sampling, conversations)
    else:
        workload = Workload(spec, prompts, sampling)
    return _with_lengths(workload, options, rng)


def _synthetic(sampling: Sampling, options: DatasetOptions, rng: random.Random) -> Workload:
    words = options.prompt_words or Lengths("fixed", 64, 64, 64.0)
    outputs = options.output_tokens
    if words.kind == "dataset" or (outputs is not None and outputs.kind == "dataset"):
        raise WorkloadError(f"a {SYNTHETIC} workload has no data set lengths")

    def limit() -> int | None:
        return None if outputs is None else outputs.draw(rng)

    if options.conversations == 0:
        prompts = tuple(
            Prompt(f"syn-{n}", text=synthetic_text(words.draw(rng), rng), max_tokens=limit())
            for n in range(1, options.prompts + 1)
        )
        return Workload(SYNTHETIC, prompts, sampling)
    system = synthetic_text(options.system_words, rng) if options.system_words else None
    conversations = tuple(
        Conversation(
            f"conv-{n}",
            tuple(
                Turn(synthetic_text(words.draw(rng), rng), limit()) for _ in range(options.turns)
            ),
            system,
        )
        for n in range(1, options.conversations + 1)
    )
    firsts = tuple(Prompt(f"{c.id}-1", text=c.turns[0].text) for c in conversations)
    return Workload(SYNTHETIC, firsts, sampling, conversations)


def _with_lengths(workload: Workload, options: DatasetOptions, rng: random.Random) -> Workload:
    """Apply `--prompt-words` (refused: a file's prompts are as written) and `--output-tokens`."""
    if options.prompt_words is not None and options.prompt_words.kind != "dataset":
        raise WorkloadError("--prompt-words applies to a synthetic workload only")
    outputs = options.output_tokens
    if outputs is None or outputs.kind == "dataset":
        return workload
    prompts = tuple(replace(p, max_tokens=outputs.draw(rng)) for p in workload.prompts)
    conversations = tuple(
        replace(c, turns=tuple(replace(t, max_tokens=outputs.draw(rng)) for t in c.turns))
        for c in workload.conversations
    )
    return replace(workload, prompts=prompts, conversations=conversations)


# --- reading files -------------------------------------------------------------------------------


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, parsed record) for each record of `path`: JSONL lines, JSON items, CSV rows."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise WorkloadError(f"workload {path} is larger than {MAX_FILE_BYTES >> 20} MiB")
        text = data.decode("utf-8-sig")  # a spreadsheet's BOM is no part of the first key
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc}") from None
    suffix = path.suffix.lower()
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        try:
            for row in reader:
                yield f"{path}:{reader.line_num}", {k: v for k, v in row.items() if k}
        except csv.Error as exc:
            raise WorkloadError(f"{path}:{reader.line_num}: not CSV ({exc})") from None
        return
    if suffix == ".json":
        try:
            data = loads(text)
        except ValueError as exc:
            raise WorkloadError(f"{path}: not readable JSON ({exc})") from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise WorkloadError(f"{path}: expected a JSON list of records")
        for index, item in enumerate(data, start=1):
            yield f"{path}:item {index}", item
        return
    # "\n" only: str.splitlines also splits on U+2028, which JSON allows raw inside a string.
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            yield where, loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not JSON ({exc.msg})") from None
        except ValueError as exc:
            raise WorkloadError(f"{where}: not readable JSON ({exc})") from None


def read_dataset(path: Path) -> tuple[tuple[Prompt, ...], tuple[Conversation, ...]]:
    """The prompts and conversations of a data set file (module docstring for the formats).

    Raises:
        WorkloadError: unreadable, empty, or a bad record (named `file:line`), or a duplicate id.
    """
    prompts: list[Prompt] = []
    conversations: list[Conversation] = []
    seen: set[str] = set()
    total = 0
    for where, item in _records(path):
        if not isinstance(item, dict):
            raise WorkloadError(f"{where}: expected a JSON object")
        number = where.rsplit(":", 1)[1].removeprefix("item ")
        default_id = f"{path.stem}-{number}"
        found = _record(where, item, default_id)
        total += _words(found)
        if total > MAX_TOTAL_WORDS:
            raise WorkloadError(f"{where}: the data set passes {MAX_TOTAL_WORDS} words in all")
        if found.id in seen:
            raise WorkloadError(f"{where}: duplicate id {escape_error(found.id, 60)!r}")
        seen.add(found.id)
        if isinstance(found, Conversation):
            conversations.append(found)
        else:
            prompts.append(found)
    if not prompts and not conversations:
        raise WorkloadError(f"{path}: no prompts (empty file)")
    return tuple(prompts), tuple(conversations)


def _words(found: Prompt | Conversation) -> int:
    """Words of a record's prompt or turns (their sum is held to `MAX_TOTAL_WORDS`)."""
    if isinstance(found, Conversation):
        return sum(word_count(turn.text) for turn in found.turns)
    return word_count(found.text or "") + sum(
        word_count(str(m.get("content", ""))) for m in found.messages or ()
    )


def _count(
    where: str, item: dict[str, Any], names: tuple[str, ...], most: int = MAX_OUTPUT_TOKENS
) -> int | None:
    """The first of `names` present as a whole number within 1 and `most` (CSV gives text).

    None when none is present.

    Raises:
        WorkloadError: the value is no whole number, below 1 or above `most`.
    """
    for name in names:
        value = item.get(name)
        if value is None or value == "":
            continue
        if isinstance(value, str) and value.strip().isdecimal():
            digits = value.strip()
            value = int(digits) if len(digits) <= 18 else most + 1  # no 4300-digit int()
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkloadError(f"{where}: {name} must be a whole number >= 1")
        if value > most:
            raise WorkloadError(f"{where}: {name} must be at most {most}")
        return value
    return None


def _id(where: str, item: dict[str, Any], names: tuple[str, ...], default: str) -> str:
    for name in names:
        if name in item:
            value = item[name]
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str) or not value:
                raise WorkloadError(f"{where}: {name} must be a non-empty string")
            return value
    return default


def _record(where: str, item: dict[str, Any], default_id: str) -> Prompt | Conversation:
    if "max_tokens" in item:
        raise WorkloadError(
            f"{where}: unsupported key max_tokens (give output_tokens_count or output_length)"
        )
    if "turns" in item:
        return _multi_turn(where, item, default_id)
    if "conversations" in item:
        return _sharegpt(where, item, default_id)
    if "input_length" in item:
        return _mooncake(where, item, default_id)
    prompt_id = _id(where, item, ("id",), default_id)
    limit = _count(where, item, OUTPUT_COLUMNS)
    if "messages" in item:
        return Prompt(prompt_id, messages=chat_messages(where, item["messages"]), max_tokens=limit)
    for column in PROMPT_COLUMNS:
        if column in item:
            text = item[column]
            if not isinstance(text, str) or not text.strip():
                raise WorkloadError(f"{where}: {column} must be a non-empty string")
            return Prompt(prompt_id, text=text, max_tokens=limit)
    names = ", ".join(escape_error(str(k), 40) for k in sorted(item)) or "none"
    raise WorkloadError(
        f"{where}: no prompt: expected one of {', '.join(PROMPT_COLUMNS)}, messages, turns,"
        f" conversations or input_length (keys: {names})"
    )


def _multi_turn(where: str, item: dict[str, Any], default_id: str) -> Conversation:
    """AIPerf `multi_turn`: `session_id`, `turns` of `{"text", "output_length"?, "role"?}`."""
    conversation_id = _id(where, item, ("session_id", "id"), default_id)
    raw = item["turns"]
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{where}: turns must be a non-empty list")
    system: str | None = None
    turns: list[Turn] = []
    for index, turn in enumerate(raw, start=1):
        if not isinstance(turn, dict):
            raise WorkloadError(f"{where}: turn {index} is not an object")
        text = turn.get("text")
        if text is None and isinstance(turn.get("texts"), list) and turn["texts"]:
            text = turn["texts"][0]  # AIPerf allows a list of texts; the first is the turn
        if not isinstance(text, str) or not text.strip():
            raise WorkloadError(f"{where}: turn {index} needs a non-empty text")
        if index == 1 and turn.get("role") == "system" and len(raw) > 1:
            system = text  # AIPerf lifts a leading system turn into the system message
            continue
        turns.append(Turn(text, _count(f"{where}: turn {index}", turn, OUTPUT_COLUMNS)))
    return Conversation(conversation_id, tuple(turns), system)


def _sharegpt(where: str, item: dict[str, Any], default_id: str) -> Conversation:
    """ShareGPT: `conversations` of `{"from": "human"|"gpt"|"system", "value"}`."""
    conversation_id = _id(where, item, ("id",), default_id)
    raw = item["conversations"]
    if not isinstance(raw, list) or not raw:
        raise WorkloadError(f"{where}: conversations must be a non-empty list")
    system: str | None = None
    users: list[str] = []
    answers: list[int | None] = []
    for index, message in enumerate(raw, start=1):
        if not isinstance(message, dict) or not isinstance(message.get("value"), str):
            raise WorkloadError(f"{where}: message {index} needs a string value")
        speaker, value = message.get("from"), message["value"]
        if speaker in ("human", "user"):
            users.append(value)
            answers.append(None)
        elif speaker in ("gpt", "assistant", "chatgpt", "bard"):
            if users and answers[-1] is None:
                answers[-1] = max(1, len(value.split()))
        elif speaker == "system" and not users:
            system = value
        else:
            shown = escape_error(str(speaker), 40)
            raise WorkloadError(f"{where}: message {index} from {shown!r}: expected human or gpt")
    if not users:
        raise WorkloadError(f"{where}: no human message")
    turns = tuple(Turn(u, a) for u, a in zip(users, answers, strict=True))
    return Conversation(conversation_id, turns, system)


def _mooncake(where: str, item: dict[str, Any], default_id: str) -> Prompt:
    """AIPerf `mooncake_trace`: a prompt of `input_length` words from its `hash_ids` blocks."""
    length = _count(where, item, ("input_length",), MAX_INPUT_WORDS)
    if length is None:
        raise WorkloadError(f"{where}: input_length must be a whole number >= 1")
    hash_ids = item.get("hash_ids") or []
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
    ):
        raise WorkloadError(f"{where}: hash_ids must be a list of whole numbers")
    words: list[str] = []
    for block in hash_ids:
        if len(words) >= length:
            break
        words += synthetic_text(MOONCAKE_BLOCK, random.Random(block)).split()  # noqa: S311
    if len(words) < length:  # no (or too few) blocks: the rest is the record's own text
        filler = random.Random(f"{default_id}:{length}")  # noqa: S311
        words += synthetic_text(length - len(words), filler).split()
    # Not `session_id`: a trace gives several records of one session, each its own request.
    prompt_id = _id(where, item, ("id",), default_id)
    limit = _count(where, item, ("output_length",))
    return Prompt(prompt_id, text=" ".join(words[:length]), max_tokens=limit)
