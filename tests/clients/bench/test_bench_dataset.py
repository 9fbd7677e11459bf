"""Data set files and length distributions (`gateway.clients.bench.dataset`, `lengths`).

Fast: no server. The formats are those GuideLLM and AIPerf document (module docstring of
`dataset`); each is read from a file as a user would have it, and a bad record names its line.
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from gateway.clients.bench import dataset
from gateway.clients.bench.dataset import (
    MOONCAKE_BLOCK,
    SYNTHETIC,
    DatasetOptions,
    build_workload,
    read_dataset,
    word_count,
)
from gateway.clients.bench.lengths import Lengths, parse_lengths
from gateway.clients.bench.workload import Sampling, WorkloadError

SAMPLING = Sampling(max_tokens=32)


def write(path: Path, *records: object) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


# --- lengths -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "low", "high"),
    [
        ("128", "fixed", 128, 128),
        ("fixed:7", "fixed", 7, 7),
        ("uniform:10,20", "uniform", 10, 20),
        ("normal:100,10", "normal", 1, 140),
        ("normal:100,10,90,110", "normal", 90, 110),
        ("dataset", "dataset", 1, 1),
    ],
)
def test_length_specs_are_parsed(spec, kind, low, high):
    lengths = parse_lengths(spec)
    assert (lengths.kind, lengths.low, lengths.high) == (kind, low, high)
    assert parse_lengths(lengths.text) == lengths


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("0", "whole number >= 1"),
        ("1.5", "whole number"),
        ("uniform:20,10", "low <= high"),
        ("uniform:5", "LOW,HIGH"),
        ("normal:10", "MEAN,SD"),
        ("normal:10,-1", "SD >= 0"),
        ("zipf:1", "use N"),
        ("fixed:x", "not numbers"),
    ],
)
def test_bad_length_specs_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_lengths(spec)


@pytest.mark.parametrize(
    ("spec", "mean", "stdev"),
    [("uniform:10,90", 50.0, 23.38), ("normal:200,40", 200.0, 40.0), ("fixed:9", 9.0, 0.0)],
)
def test_drawn_lengths_follow_the_distribution_and_the_seed(spec, mean, stdev):
    lengths = parse_lengths(spec)
    draws = [lengths.draw(random.Random(5)) for _ in range(3)]  # noqa: S311
    assert draws == [draws[0]] * 3  # the same seed, the same first draw
    rng = random.Random(1234)  # noqa: S311
    sample = [lengths.draw(rng) for _ in range(20000)]
    assert statistics.fmean(sample) == pytest.approx(mean, rel=0.03)
    assert statistics.pstdev(sample) == pytest.approx(stdev, rel=0.03, abs=0.01)
    assert lengths.low <= min(sample)
    assert max(sample) <= lengths.high


def test_a_normal_is_clamped_to_its_bounds():
    lengths = parse_lengths("normal:50,100,40,60")
    rng = random.Random(1)  # noqa: S311
    sample = {lengths.draw(rng) for _ in range(2000)}
    assert min(sample) == 40
    assert max(sample) == 60
    with pytest.raises(ValueError, match="not drawn"):
        Lengths("dataset").draw(rng)


# --- formats -------------------------------------------------------------------------------------


def test_guidellm_jsonl_json_and_csv_files(tmp_path: Path):
    rows = [
        {"prompt": "What is a cache?", "output_tokens_count": 12, "prompt_tokens_count": 5},
        {"prompt": "Name a river.", "output_tokens_count": 3},
    ]
    jsonl = write(tmp_path / "g.jsonl", *rows)
    listed = tmp_path / "g.json"
    listed.write_text(json.dumps(rows), encoding="utf-8")
    table = tmp_path / "g.csv"
    table.write_text(
        "prompt,output_tokens_count,prompt_tokens_count\n"
        '"What is a cache?",12,5\n'
        "Name a river.,3,\n",
        encoding="utf-8",
    )
    for path in (jsonl, listed, table):
        prompts, conversations = read_dataset(path)
        assert conversations == ()
        assert [(p.text, p.max_tokens) for p in prompts] == [
            ("What is a cache?", 12),
            ("Name a river.", 3),
        ], path


@pytest.mark.parametrize("column", ["text", "content", "instruction", "question", "input"])
def test_guidellm_prompt_columns_are_found(tmp_path: Path, column: str):
    prompts, _ = read_dataset(write(tmp_path / "c.jsonl", {column: "hi there", "other": 1}))
    assert prompts[0].text == "hi there"
    assert prompts[0].max_tokens is None


def test_aiperf_single_turn(tmp_path: Path):
    path = write(
        tmp_path / "prompts.jsonl",
        {"text": "Write a haiku about mountains.", "output_length": 50},
        {"text": "Summarize machine learning."},
    )
    workload = build_workload(str(path), SAMPLING, DatasetOptions())
    assert [(p.id, p.text, p.max_tokens) for p in workload.prompts] == [
        ("prompts-1", "Write a haiku about mountains.", 50),
        ("prompts-2", "Summarize machine learning.", None),
    ]
    assert workload.conversations == ()


def test_aiperf_multi_turn_with_a_leading_system_turn(tmp_path: Path):
    path = write(
        tmp_path / "conversations.jsonl",
        {
            "session_id": "chat_1",
            "turns": [
                {"role": "system", "text": "You are terse."},
                {"text": "What is machine learning?", "output_length": 20},
                {"text": "Give me an example."},
            ],
        },
        {"session_id": "chat_2", "turns": [{"text": "Explain neural networks."}]},
    )
    workload = build_workload(str(path), SAMPLING, DatasetOptions())
    first, second = workload.conversations
    assert first.id == "chat_1"
    assert first.system == "You are terse."
    assert [(t.text, t.max_tokens) for t in first.turns] == [
        ("What is machine learning?", 20),
        ("Give me an example.", None),
    ]
    assert second.system is None
    assert len(second.turns) == 1
    assert [p.id for p in workload.prompts] == ["chat_1-1", "chat_2-1"]
    assert workload.describe()["turns"] == 3


def test_aiperf_mooncake_trace_shares_prefixes_by_hash_id(tmp_path: Path):
    path = write(
        tmp_path / "trace.jsonl",
        {"timestamp": 0, "input_length": 600, "output_length": 40, "hash_ids": [7, 8]},
        {"timestamp": 500, "input_length": 700, "output_length": 10, "hash_ids": [7, 9]},
        {"timestamp": 900, "input_length": 30, "output_length": 5},
    )
    prompts, _ = read_dataset(path)
    assert [word_count(p.as_text()) for p in prompts] == [600, 700, 30]
    assert [p.max_tokens for p in prompts] == [40, 10, 5]
    a, b = (p.as_text().split() for p in prompts[:2])
    assert a[:MOONCAKE_BLOCK] == b[:MOONCAKE_BLOCK]  # block 7 is the shared prefix
    assert a[MOONCAKE_BLOCK:600] != b[MOONCAKE_BLOCK:600]


def test_sharegpt_conversations(tmp_path: Path):
    path = write(
        tmp_path / "sharegpt.jsonl",
        {
            "id": "x1",
            "conversations": [
                {"from": "system", "value": "Be kind."},
                {"from": "human", "value": "Hello?"},
                {"from": "gpt", "value": "Hi, how can I help today?"},
                {"from": "human", "value": "Tell me a joke."},
            ],
        },
    )
    workload = build_workload(str(path), SAMPLING, DatasetOptions(output_tokens=Lengths("dataset")))
    (conversation,) = workload.conversations
    assert conversation.system == "Be kind."
    assert [(t.text, t.max_tokens) for t in conversation.turns] == [
        ("Hello?", 6),  # the recorded answer's words
        ("Tell me a joke.", None),
    ]


def test_this_tools_own_format_still_reads(tmp_path: Path):
    path = write(
        tmp_path / "mine.jsonl",
        {"id": "a", "prompt": "hello"},
        {"messages": [{"role": "user", "content": "hi"}]},
    )
    prompts, _ = read_dataset(path)
    assert [p.id for p in prompts] == ["a", "mine-2"]
    assert prompts[1].messages == ({"role": "user", "content": "hi"},)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"prompt": "x", "max_tokens": 5}', "unsupported key max_tokens"),
        ('{"prompt": "x", "output_tokens_count": 0}', "output_tokens_count must be"),
        ('{"text": "x", "output_length": "many"}', "output_length must be"),
        ('{"prompt": ""}', "prompt must be a non-empty string"),
        ('{"answer": "x"}', "no prompt: expected one of prompt"),
        ('{"session_id": "s", "turns": []}', "turns must be a non-empty list"),
        ('{"session_id": "s", "turns": [{"text": ""}]}', "turn 1 needs a non-empty text"),
        ('{"turns": [{"text": "a", "output_length": -1}]}', "turn 1: output_length must be"),
        ('{"input_length": 0}', "input_length must be"),
        ('{"input_length": 5, "hash_ids": ["a"]}', "hash_ids must be"),
        ('{"conversations": [{"from": "gpt", "value": "hi"}]}', "no human message"),
        ('{"conversations": [{"from": "robot", "value": "x"}]}', "expected human or gpt"),
        ('{"conversations": [{"from": "human"}]}', "needs a string value"),
        ('{"messages": [{"role": "user"}]}', "role and content"),
    ],
)
def test_bad_records_name_the_file_and_line(tmp_path: Path, line: str, match: str):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=match) as caught:
        read_dataset(path)
    assert f"{path}:2" in str(caught.value)


def test_bad_csv_rows_and_json_items_are_named(tmp_path: Path):
    table = tmp_path / "bad.csv"
    table.write_text("prompt,output_tokens_count\nfine,3\nalso fine,-2\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=f"{table}:3: output_tokens_count"):
        read_dataset(table)
    listed = tmp_path / "bad.json"
    listed.write_text('[{"prompt": "a"}, {"nothing": 1}]', encoding="utf-8")
    with pytest.raises(WorkloadError, match=f"{listed}:item 2: no prompt"):
        read_dataset(listed)
    mixed = write(tmp_path / "mixed.jsonl", {"prompt": "a"}, {"turns": [{"text": "b"}]})
    with pytest.raises(WorkloadError, match="mixes single prompts and conversations"):
        build_workload(str(mixed), SAMPLING, DatasetOptions())
    dup = write(tmp_path / "dup.jsonl", {"id": "a", "prompt": "x"}, {"id": "a", "text": "y"})
    with pytest.raises(WorkloadError, match=f"{dup}:2: duplicate id"):
        read_dataset(dup)


# --- synthetic workloads and drawn lengths ------------------------------------------------------


def test_synthetic_prompts_have_the_drawn_lengths_and_are_reproducible():
    options = DatasetOptions(
        prompt_words=parse_lengths("uniform:10,30"),
        output_tokens=parse_lengths("normal:20,5,10,30"),
        prompts=200,
        seed=9,
    )
    workload = build_workload(SYNTHETIC, SAMPLING, options)
    words = [word_count(p.as_text()) for p in workload.prompts]
    limits = [p.max_tokens for p in workload.prompts]
    assert len(words) == 200
    assert min(words) >= 10
    assert max(words) <= 30
    assert statistics.fmean(words) == pytest.approx(20, rel=0.05)
    assert all(limit is not None and 10 <= limit <= 30 for limit in limits)
    again = build_workload(SYNTHETIC, SAMPLING, options)
    assert again.digest == workload.digest
    other = build_workload(SYNTHETIC, SAMPLING, DatasetOptions(prompts=200, seed=10))
    assert other.digest != workload.digest


def test_synthetic_conversations_share_one_system_prefix():
    options = DatasetOptions(
        prompt_words=parse_lengths("12"), conversations=3, turns=4, system_words=40
    )
    workload = build_workload(SYNTHETIC, SAMPLING, options)
    systems = {c.system for c in workload.conversations}
    assert len(systems) == 1
    assert word_count(systems.pop() or "") == 40
    assert all(len(c.turns) == 4 for c in workload.conversations)
    assert all(word_count(t.text) == 12 for c in workload.conversations for t in c.turns)


def test_output_lengths_apply_to_files_and_builtins(tmp_path: Path):
    path = write(tmp_path / "p.jsonl", {"prompt": "a", "output_tokens_count": 4}, {"prompt": "b"})
    kept = build_workload(str(path), SAMPLING, DatasetOptions())
    assert [p.max_tokens for p in kept.prompts] == [4, None]
    drawn = build_workload(str(path), SAMPLING, DatasetOptions(output_tokens=parse_lengths("7")))
    assert [p.max_tokens for p in drawn.prompts] == [7, 7]
    builtin = build_workload(
        "builtin:short", SAMPLING, DatasetOptions(output_tokens=Lengths("fixed", 5, 5, 5.0))
    )
    assert {p.max_tokens for p in builtin.prompts} == {5}
    with pytest.raises(WorkloadError, match="--prompt-words applies to a synthetic"):
        build_workload(str(path), SAMPLING, DatasetOptions(prompt_words=parse_lengths("9")))
    with pytest.raises(WorkloadError, match="no data set lengths"):
        build_workload(SYNTHETIC, SAMPLING, DatasetOptions(output_tokens=Lengths("dataset")))
    with pytest.raises(WorkloadError, match="neither a built-in suite"):
        build_workload(str(tmp_path / "missing.jsonl"), SAMPLING, DatasetOptions())


def test_the_digest_of_a_workload_without_lengths_is_unchanged(tmp_path: Path):
    """Runs saved before per-prompt lengths existed still compare as the same workload."""
    from gateway.clients.bench.workload import load_workload

    path = write(tmp_path / "p.jsonl", {"id": "a", "prompt": "x"})
    old = load_workload(str(path), SAMPLING)
    new = build_workload(str(path), SAMPLING, DatasetOptions())
    assert new.digest == old.digest


# --- declared lengths and file sizes are bounded -------------------------------------------------


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"input_length": 100000000000}', "input_length must be at most 1000000"),
        ('{"input_length": 5, "output_length": 1000000000000000000000000000000}',
         "output_length must be at most 1000000"),
        ('{"prompt": "a", "output_tokens_count": "' + "9" * 5000 + '"}',
         "output_tokens_count must be at most"),
    ],
)  # fmt: skip
def test_declared_lengths_past_the_caps_are_refused(tmp_path: Path, line: str, match: str):
    path = tmp_path / "huge.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=match):
        read_dataset(path)


def test_the_words_of_a_whole_data_set_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(dataset, "MAX_TOTAL_WORDS", 2500)
    path = write(tmp_path / "trace.jsonl", *({"input_length": 1000} for _ in range(5)))
    with pytest.raises(WorkloadError, match=f"{path}:3: the data set passes 2500 words"):
        read_dataset(path)


def test_a_data_set_file_past_the_size_cap_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(dataset, "MAX_FILE_BYTES", 1 << 20)
    path = tmp_path / "big.jsonl"
    path.write_text('{"prompt": "a"}\n' * 70_000, encoding="utf-8")
    with pytest.raises(WorkloadError, match="larger than 1 MiB"):
        read_dataset(path)


@pytest.mark.parametrize(("name", "text"), [
    ("bom.jsonl", '{"prompt": "hello there"}\n'),
    ("bom.csv", "prompt,output_tokens_count\nhello there,3\n"),
])  # fmt: skip
def test_a_utf8_bom_is_read_not_refused(tmp_path: Path, name: str, text: str):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    prompts, _ = read_dataset(path)
    assert prompts[0].text == "hello there"
