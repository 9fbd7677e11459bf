"""The workload: prompts and sampling, the built-in suite, JSONL files, digest and cycle."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from gateway.clients.bench.workload import (
    BUILTIN,
    Prompt,
    Sampling,
    Workload,
    WorkloadError,
    load_workload,
)

SAMPLING = Sampling()


def test_prompt_needs_exactly_one_of_text_and_messages():
    with pytest.raises(WorkloadError, match="exactly one"):
        Prompt("p")
    with pytest.raises(WorkloadError, match="exactly one"):
        Prompt("p", text="a", messages=({"role": "user", "content": "a"},))


def test_prompt_converts_between_text_and_messages():
    assert Prompt("p", text="hi").as_messages() == [{"role": "user", "content": "hi"}]
    chat = Prompt(
        "c", messages=({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
    )
    assert chat.as_text() == "s\nu"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.1}, "temperature")],
)
def test_sampling_refuses_impossible_values(kwargs, match):
    with pytest.raises(WorkloadError, match=match):
        Sampling(**kwargs)
    assert issubclass(WorkloadError, ValueError)


def test_builtin_suite_has_short_and_long_prompts_in_both_languages():
    prompts = load_workload(BUILTIN, SAMPLING).prompts
    by = {(p.language, p.size): [] for p in prompts}
    for p in prompts:
        by[(p.language, p.size)].append(p)
    assert len(by[("en", "short")]) >= 4
    assert len(by[("zh", "short")]) >= 4
    assert len(by[("en", "long")]) >= 2
    assert len(by[("zh", "long")]) >= 2
    assert all(len(p.as_text()) >= 1500 for p in by[("en", "long")])
    assert all(len(p.as_text()) >= 400 for p in by[("zh", "long")])  # ~1 token a character
    assert "en-short-1" in {p.id for p in prompts}
    assert len({p.id for p in prompts}) == len(prompts)


@pytest.mark.parametrize(
    ("spec", "field", "value"),
    [
        ("builtin:short", "size", "short"),
        ("builtin:long", "size", "long"),
        ("builtin:en", "language", "en"),
        ("builtin:zh", "language", "zh"),
    ],
)
def test_builtin_selectors_pick_a_size_or_language(spec, field, value):
    workload = load_workload(spec, SAMPLING)
    assert workload.prompts
    assert all(getattr(p, field) == value for p in workload.prompts)
    assert workload.name == spec


def test_unknown_suite_is_refused():
    with pytest.raises(WorkloadError, match="unknown suite builtin:fr"):
        load_workload("builtin:fr", SAMPLING)
    with pytest.raises(WorkloadError, match="neither a built-in suite nor a file"):
        load_workload("no-such-file.jsonl", SAMPLING)


def test_jsonl_file_with_prompts_messages_comments_and_blank_lines(tmp_path: Path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        "# my prompts\n"
        '{"id": "a", "prompt": "hello"}\n'
        "\n"
        '{"messages": [{"role": "user", "content": "hi"}]}\n',
        encoding="utf-8",
    )
    workload = load_workload(str(path), Sampling(max_tokens=16))
    assert [p.id for p in workload.prompts] == ["a", "mine-4"]
    assert workload.prompts[0].text == "hello"
    assert workload.prompts[1].messages == ({"role": "user", "content": "hi"},)
    assert workload.sampling.max_tokens == 16


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"prompt": "x", "max_tokens": 5}', "unsupported keys max_tokens"),
        ('{"id": "a"}', "exactly one of prompt and messages"),
        ('{"prompt": ""}', "non-empty string"),
        ('{"messages": []}', "non-empty list"),
        ('{"messages": [{"role": "user"}]}', "role and content"),
        ('{"id": 5, "prompt": "x"}', "id must be"),
    ],
)
def test_bad_jsonl_lines_name_file_and_line(tmp_path: Path, line: str, match: str):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=match) as caught:
        load_workload(str(path), SAMPLING)
    assert f"{path}:2" in str(caught.value)


def test_duplicate_ids_and_empty_files_are_refused(tmp_path: Path):
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', encoding="utf-8")
    with pytest.raises(WorkloadError, match=f"{dup}:2: duplicate id"):
        load_workload(str(dup), SAMPLING)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("# nothing\n\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match="empty file"):
        load_workload(str(empty), SAMPLING)


def test_digest_follows_prompts_and_sampling_not_the_name():
    prompts = (Prompt("a", text="x"),)
    base = Workload("one", prompts, Sampling())
    assert base.digest == Workload("two", prompts, Sampling()).digest
    assert base.digest != Workload("one", prompts, Sampling(seed=1)).digest
    assert base.digest != Workload("one", (Prompt("a", text="y"),), Sampling()).digest
    assert len(base.digest) == 64
    assert int(base.digest, 16) >= 0


def test_describe_is_plain_json():
    workload = load_workload("builtin:short", Sampling(max_tokens=32))
    described = workload.describe()
    assert described == {
        "name": "builtin:short",
        "prompts": 8,
        "digest": workload.digest,
        "sampling": {"temperature": 0.0, "seed": 1234, "max_tokens": 32},
    }
    json.dumps(described)


def test_cycle_hands_out_prompts_round_robin_in_a_fixed_order():
    workload = load_workload("builtin:long", SAMPLING)
    ids = [p.id for p in itertools.islice(workload.cycle(), 9)]
    order = [p.id for p in workload.prompts]
    assert ids == order + order + order[:1]
    assert [p.id for p in itertools.islice(workload.cycle(), 2)] == order[:2]  # fresh start


def test_a_key_name_with_terminal_escapes_is_shown_escaped(tmp_path: Path):
    path = tmp_path / "esc.jsonl"
    path.write_text('{"prompt": "a", "\\u001b]0;PWNED\\u0007\\u001b[2J": 1}\n', encoding="utf-8")
    with pytest.raises(WorkloadError, match="unsupported keys") as caught:
        load_workload(str(path), SAMPLING)
    message = str(caught.value)
    assert "\x1b" not in message
    assert "\x07" not in message
    assert "\\x1b]0;PWNED\\x07" in message


def test_a_raw_line_separator_inside_a_json_string_is_text(tmp_path: Path):
    path = tmp_path / "u2028.jsonl"
    path.write_text('{"prompt": "one\u2028two"}\r\n{"prompt": "three"}\n', encoding="utf-8")
    workload = load_workload(str(path), SAMPLING)
    assert [p.text for p in workload.prompts] == ["one\u2028two", "three"]
