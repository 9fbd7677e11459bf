# ruff: noqa: RUF001 (the Chinese prompts use Chinese punctuation by design)
"""What a benchmark asks: the prompts, the sampling, and the built-in prompt suite.

Owns `Prompt`, `Sampling`, `Workload` (with a digest, so two runs can tell whether they asked
the same thing), the built-in suite `BUILTIN` (short and long prompts in English and Chinese:
short prompts measure decode, long ones prefill; Chinese tokenizes very differently from
English) and `load_workload`, which reads a suite name or a JSONL file. One `Sampling` holds for
the whole run, so a JSONL line may not carry a `max_tokens`; a prompt's own output limit
(`Prompt.max_tokens`) comes only from `gateway.clients.bench.dataset` (a data set's
`output_tokens_count` / `output_length`, or one drawn from a seeded distribution), fixed per
prompt and part of the digest. `Turn` and `Conversation` hold multi-turn workloads.

Over ~300 lines for one reason: about a hundred of them are the built-in suite's prompts
(`BUILTIN`), data that belongs beside the `Prompt`, `Conversation` and `Workload` types whose digest
covers it; the types, the suite and the JSONL reader are one concern, what a run asks.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.clients.bench.jsontext import loads
from gateway.clients.bench.stats import escape_error

BUILTIN = "builtin"
"""The built-in suite's name; `builtin:short`, `builtin:long`, `builtin:en`, `builtin:zh` pick."""


class WorkloadError(ValueError):
    """A workload that cannot be used: an unknown suite, an unreadable or bad JSONL file."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: plain text (generate/completions) or chat messages (chat).

    Attributes:
        id: Stable id, e.g. `en-short-1`, or `<file stem>-<line>` for a JSONL line without one.
        text: The prompt text, or None for a chat prompt.
        messages: OpenAI/Ollama chat messages (`{"role", "content"}`), or None.
        language: `en`, `zh`, or "" when unknown.
        size: `short`, `long`, or "" when unknown.
        max_tokens: This prompt's output limit (a data set's `output_tokens_count` or
            `output_length`, or drawn from `--output-tokens`), or None: the run's.

    Raises:
        WorkloadError: not exactly one of `text` and `messages` is given.
    """

    id: str
    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    language: str = ""
    size: str = ""
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.messages is None):
            raise WorkloadError(f"prompt {self.id!r}: give exactly one of text and messages")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise WorkloadError(f"prompt {self.id!r}: max_tokens must be at least 1")

    def as_messages(self) -> list[dict[str, Any]]:
        """The prompt as chat messages (a text prompt becomes one user message)."""
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.text}]

    def as_text(self) -> str:
        """The prompt as plain text (a chat prompt's message contents, one per line)."""
        if self.text is not None:
            return self.text
        return "\n".join(str(m.get("content", "")) for m in self.messages or ())


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling of every request of a run (greedy and seeded by default, for repeatability).

    Attributes:
        temperature: Sampling temperature, >= 0.
        seed: The sampler's seed.
        max_tokens: The output limit per request (`num_predict`, `max_tokens`), >= 1.

    Raises:
        WorkloadError: `max_tokens` < 1 or `temperature` < 0.
    """

    temperature: float = 0.0
    seed: int = 1234
    max_tokens: int = 128

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise WorkloadError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise WorkloadError(f"temperature must be >= 0, got {self.temperature}")


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn of a conversation.

    Attributes:
        text: What the user says.
        max_tokens: The answer's limit, or None: the run's.
    """

    text: str
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    """A multi-turn conversation: each turn resends the whole history so far.

    Turn t's request is the system message (when there is one), then for every earlier turn
    its user message and the answer the server gave to it, then turn t's user message: the
    prompt grows by one answer and one user message a turn, as a chat client's does.

    Attributes:
        id: Stable id (AIPerf `session_id`, `<file stem>-<line>`, or `conv-<n>`).
        turns: The user turns, in order (at least one).
        system: The system message shared by every turn (and, for a synthetic workload, by
            every conversation: the shared prefix a prefix cache can reuse), or None.
    """

    id: str
    turns: tuple[Turn, ...]
    system: str | None = None

    def __post_init__(self) -> None:
        if not self.turns:
            raise WorkloadError(f"conversation {self.id!r} has no turns")


@dataclass(frozen=True, slots=True)
class Workload:
    """A named list of prompts (or conversations) asked with one sampling.

    Attributes:
        name: The suite name or the file path it came from.
        prompts: The prompts, in the order `cycle` hands them out (at least one; for a
            multi-turn workload, each conversation's first turn, for the checks before a run).
        sampling: The sampling of every request (a prompt's or turn's `max_tokens` overrides
            its limit).
        conversations: Multi-turn conversations, played turn after turn by the closed loop;
            empty for a single-turn workload.
    """

    name: str
    prompts: tuple[Prompt, ...]
    sampling: Sampling
    conversations: tuple[Conversation, ...] = ()

    @property
    def digest(self) -> str:
        """sha256 hex of the canonical JSON of the prompts and the sampling (not the name)."""
        prompts: list[dict[str, Any]] = []
        for p in self.prompts:
            item: dict[str, Any] = {
                "id": p.id,
                "text": p.text,
                "messages": None if p.messages is None else list(p.messages),
            }
            if p.max_tokens is not None:  # absent: a run of an older version keeps its digest
                item["max_tokens"] = p.max_tokens
            prompts.append(item)
        canonical: dict[str, Any] = {"prompts": prompts, "sampling": asdict(self.sampling)}
        if self.conversations:
            canonical["conversations"] = [asdict(c) for c in self.conversations]
        text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        """`{"name", "prompts": count, "digest", "sampling": {...}}` for the run document."""
        described: dict[str, Any] = {
            "name": self.name,
            "prompts": len(self.prompts),
            "digest": self.digest,
            "sampling": asdict(self.sampling),
        }
        if self.conversations:
            described["conversations"] = len(self.conversations)
            described["turns"] = sum(len(c.turns) for c in self.conversations)
        return described

    def cycle(self) -> Iterator[Prompt]:
        """The prompts round-robin, forever, always starting with the first."""
        return itertools.cycle(self.prompts)


_LONG_EN_1 = (
    "Read the following report and summarise it in three sentences.\n\n"
    "The municipal water utility of a mid-sized river town spent the last decade replacing "
    "its cast-iron mains, many of which were laid before 1930. Engineers found that most "
    "breaks happened in the coldest weeks of January, when the ground froze unevenly and "
    "the old pipes, already thinned by corrosion, cracked along their joints. The utility "
    "first tried lining the pipes from the inside with an epoxy resin, which avoided digging "
    "up streets but failed on sections with sharp bends. It then moved to replacing whole "
    "blocks with ductile iron and, later, with high-density polyethylene, which bends "
    "rather than snaps when the soil moves. Each replacement was scheduled together with "
    "road resurfacing, so that a street was opened only once, and residents were warned "
    "two weeks ahead with leaflets and text messages. The cost was shared between water "
    "rates and a regional infrastructure fund. By the end of the programme the number of "
    "breaks per year had fallen from about ninety to fewer than fifteen, and the share of "
    "treated water lost to leaks dropped from a quarter to under a tenth. The utility also "
    "installed acoustic sensors on the remaining old mains; these listen for the hiss of "
    "small leaks at night, when demand is low, and let crews repair them before they grow. "
    "Critics pointed out that the programme raised bills by roughly eight percent and that "
    "the polyethylene pipes have a shorter track record than iron. Supporters answered that "
    "each avoided break saves not only the repair but also the lost water, the traffic "
    "disruption and the damage to basements, and that the sensor data will guide the next "
    "decade of work. The council has asked for an independent review of the results before "
    "approving the second phase, which would cover the industrial district by the harbour."
)
_LONG_EN_2 = (
    "You are given notes from a team meeting. List the decisions that were made and the "
    "open questions that remain.\n\n"
    "Notes: The team met to plan the migration of the billing service to the new cluster. "
    "Priya opened by reminding everyone that the old cluster's hardware support ends in "
    "March, so the migration has to be finished by the end of February at the latest. Tom "
    "said the database is the hardest part: it holds eleven years of invoices, and the "
    "replication tool they tested copies about forty gigabytes an hour, so a full copy takes "
    "most of two days. The team agreed to copy the archive of closed invoices ahead of time, "
    "during the quiet weeks of January, and to move only the open invoices during a short "
    "maintenance window on a Sunday night. Lena asked who would tell the customers; the "
    "support lead will draft a notice, and legal has to approve the wording because some "
    "contracts promise ninety-nine point nine percent availability. There was a long "
    "discussion about whether to keep the old cluster running in read-only mode for a month "
    "after the switch. Tom was in favour, since it makes rolling back easy; Priya worried "
    "about paying for two clusters at once. No decision was reached, and Priya will ask "
    "finance for the exact monthly cost. The team also decided to freeze new features in the "
    "billing service from mid-January until the migration is done, except for fixes to "
    "security problems. Marco will write the runbook for the maintenance window, with a "
    "step-by-step rollback plan, and the team will rehearse it twice on a copy of the "
    "production data. Finally, someone asked whether the monitoring dashboards will survive "
    "the move; nobody knew, and Lena took the action to check with the platform team."
)
_LONG_ZH_1 = (
    "阅读下面的短文，用三句话概括它的主要内容。\n\n"
    "这座江南小城有一条老街，街两边是明清时期留下来的木结构房屋。二十年前，老街上的居民大多搬进了"
    "新区的楼房，留下的老房子年久失修，有的屋顶漏雨，有的墙壁开裂。当地政府起初打算把整条街拆掉，"
    "建一个现代化的商业区，但许多老居民和学者表示反对，认为老街是城市记忆的一部分，一旦拆除就再也"
    "无法恢复。经过几年的讨论，政府改变了计划，决定对老街进行保护性修缮。修缮工作由专门的古建筑团队"
    "负责，他们尽量使用传统的材料和工艺，比如用杉木替换腐朽的梁柱，用石灰和糯米浆修补墙面。每一栋"
    "房子在动工之前都要测绘存档，拆下来的旧构件也要编号保存，能用的尽量放回原处。修缮完成以后，一部"
    "分房子租给了手工艺人，开设了竹编、刺绣和木雕的作坊；另一部分改成了小型博物馆和茶馆，游客可以"
    "在里面休息，了解小城的历史。老街的人气渐渐回来了，周末常常挤满了来自周边城市的游客。不过，"
    "也有居民抱怨游客太多，噪音太大，房租上涨，原来的邻里生活被打乱了。为了平衡各方的利益，街道"
    "办事处成立了一个由居民、商户和专家组成的委员会，定期讨论老街的管理问题，比如限制夜间营业的时间，"
    "控制商铺的数量，并且保留一部分房子给原来的居民居住。现在，这条老街已经成为小城的一张名片，"
    "也成为其他城市研究旧城保护时经常提到的例子。"
)
_LONG_ZH_2 = (
    "下面是一封客户来信，请先判断客户的主要诉求，再替客服写一段礼貌的回复。\n\n"
    "你们好！我上个月在你们的网店买了一台咖啡机，型号是家用半自动的那一款。收到货的时候包装完好，"
    "我也按照说明书的步骤清洗了水箱和冲煮头。前两个星期用得很好，每天早上做两杯拿铁，味道也不错。"
    "可是从第三个星期开始，机器在加热的时候会发出很响的咔咔声，蒸汽棒出来的蒸汽也越来越少，打奶泡"
    "要花以前两倍的时间。我在网上查了一些资料，有人说可能是水垢太多，于是我用柠檬酸做了一次除垢，"
    "但是情况没有任何改善。上周末机器突然完全不加热了，指示灯一直在闪，说明书上说这是温控器故障，"
    "需要联系售后。我给客服热线打了三次电话，每次都要等二十多分钟，最后一次终于接通了，客服说要我"
    "把机器寄回去检测，检测需要十五个工作日，运费还要我自己先垫付。我觉得这样很不合理，机器才用了"
    "不到一个月就坏了，明显是质量问题，而且我每天都要用，等一个月实在太久了。我希望你们能直接给我"
    "换一台新的，或者至少先寄一台备用机给我用，运费也应该由你们承担。如果这些要求不能满足，我只能"
    "申请退货退款，并且在评价里如实写下这次的经历。期待你们尽快回复，谢谢！"
)

_BUILTIN_PROMPTS: tuple[Prompt, ...] = (
    Prompt("en-short-1", "Why is the sky blue?", language="en", size="short"),
    Prompt("en-short-2", "Write a haiku about autumn rain.", language="en", size="short"),
    Prompt("en-short-3", "Explain what a hash table is.", language="en", size="short"),
    Prompt("en-short-4", "Give three tips for a job interview.", language="en", size="short"),
    Prompt("zh-short-1", "天空为什么是蓝色的？", language="zh", size="short"),
    Prompt("zh-short-2", "写一首关于秋雨的短诗。", language="zh", size="short"),
    Prompt("zh-short-3", "请解释什么是哈希表。", language="zh", size="short"),
    Prompt("zh-short-4", "给出三条面试的建议。", language="zh", size="short"),
    Prompt("en-long-1", _LONG_EN_1, language="en", size="long"),
    Prompt("en-long-2", _LONG_EN_2, language="en", size="long"),
    Prompt("zh-long-1", _LONG_ZH_1, language="zh", size="long"),
    Prompt("zh-long-2", _LONG_ZH_2, language="zh", size="long"),
)
_SELECTORS = {"short": "size", "long": "size", "en": "language", "zh": "language"}


def builtin_prompts(selector: str = "") -> tuple[Prompt, ...]:
    """The built-in prompts, all or those of one size (`short`, `long`) or language (`en`, `zh`).

    Raises:
        WorkloadError: an unknown selector.
    """
    if not selector:
        return _BUILTIN_PROMPTS
    field_name = _SELECTORS.get(selector)
    if field_name is None:
        known = ", ".join(f"{BUILTIN}:{s}" for s in _SELECTORS)
        raise WorkloadError(f"unknown suite {BUILTIN}:{selector} (known: {BUILTIN}, {known})")
    return tuple(p for p in _BUILTIN_PROMPTS if getattr(p, field_name) == selector)


def _line_prompt(where: str, stem: str, number: int, line: str) -> Prompt:
    try:
        item = loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: not JSON ({exc.msg})") from None
    except ValueError as exc:  # nested too deeply, an integer of too many digits
        raise WorkloadError(f"{where}: not readable JSON ({exc})") from None
    if not isinstance(item, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
    unknown = set(item) - {"id", "prompt", "messages"}
    if unknown:
        # The keys are the file's text: escaped, as all outside text the tool prints.
        names = ", ".join(escape_error(name, 60) for name in sorted(unknown))
        raise WorkloadError(f"{where}: unsupported keys {names} (one sampling per run)")
    prompt_id = item.get("id", f"{stem}-{number}")
    if not isinstance(prompt_id, str) or not prompt_id:
        raise WorkloadError(f"{where}: id must be a non-empty string")
    text, messages = item.get("prompt"), item.get("messages")
    if (text is None) == (messages is None):
        raise WorkloadError(f"{where}: give exactly one of prompt and messages")
    if text is not None:
        if not isinstance(text, str) or not text:
            raise WorkloadError(f"{where}: prompt must be a non-empty string")
        return Prompt(prompt_id, text=text)
    return Prompt(prompt_id, messages=chat_messages(where, messages))


def chat_messages(where: str, messages: object) -> tuple[dict[str, Any], ...]:
    """A record's `messages`, checked: a non-empty list of `{"role": str, "content": str}`.

    Raises:
        WorkloadError: naming `where` (`file:line`) when it is anything else.
    """
    if not isinstance(messages, list) or not messages:
        raise WorkloadError(f"{where}: messages must be a non-empty list")
    for message in messages:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise WorkloadError(f"{where}: each message needs string role and content")
    return tuple(messages)


def _read_jsonl(path: Path) -> tuple[Prompt, ...]:
    try:
        # "\n" only: str.splitlines also splits on U+2028 and others, which JSON allows raw
        # inside a string (the line's own "\r" is stripped below).
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read workload {path}: {exc}") from None
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        prompt = _line_prompt(where, path.stem, number, line)
        if prompt.id in seen:
            raise WorkloadError(f"{where}: duplicate id {prompt.id!r}")
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise WorkloadError(f"{path}: no prompts (empty file)")
    return tuple(prompts)


def load_workload(spec: str, sampling: Sampling) -> Workload:
    """The workload `spec` names: a built-in suite, or a JSONL file of prompts.

    Args:
        spec: `builtin`, `builtin:short`, `builtin:long`, `builtin:en`, `builtin:zh`, or a
            path to a JSONL file with one `{"id"?: str, "prompt": str}` or
            `{"id"?: str, "messages": [...]}` object a line (blank and `#` lines skipped).
        sampling: The sampling of every request.

    Returns:
        The workload, named `spec`.

    Raises:
        WorkloadError: an unknown suite, an unreadable or empty file, or a bad line (the
            message names `file:line`).
    """
    if spec == BUILTIN or spec.startswith(f"{BUILTIN}:"):
        _, _, selector = spec.partition(":")
        return Workload(spec, builtin_prompts(selector), sampling)
    path = Path(spec)
    if not path.is_file():
        raise WorkloadError(f"unknown workload {spec!r}: neither a built-in suite nor a file")
    return Workload(spec, _read_jsonl(path), sampling)
