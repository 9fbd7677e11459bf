"""The new workloads, arrival modes and endpoints measured against the emulator's known truth.

Issue 30's "Done when": every workload (drawn lengths, a data set file, multi-turn
conversations) and arrival mode (closed loop, constant rate, Poisson) measured within 3% of
the configured truth, a Poisson run's achieved rate within 5% of the requested one, the
multi-turn prompts growing as specified, and `/v1/responses` and `/v1/messages` read with the
same TTFT/ITL/usage definitions as chat.

The truth: an emulator process with unlimited slots and no batch slowdown answers every request
after `TTFT` seconds with one token every `T_I` seconds, as many tokens as the request's limit
(its answer is `BIG` tokens long, so the limit always binds). So TTFT is `TTFT`, every
inter-token gap `T_I`, every answer exactly its limit, whatever the load; the one cost left out
is the loopback's wake-up after a silence (`wake`, as in test_bench_driver.py), which a first
token may pay once. The rates are statistical, not timing checks: the achieved rate is compared
with the realised schedule of the same seed, over enough arrivals that the schedule itself is
within 2% of the requested rate.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.clients.bench.cli import main
from gateway.clients.bench.dataset import SYNTHETIC, DatasetOptions, build_workload, word_count
from gateway.clients.bench.driver import achieved_rate, arrival_offsets, run_concurrency, run_rate
from gateway.clients.bench.lengths import parse_lengths
from gateway.clients.bench.protocol import AnswerReader, Target, build_request
from gateway.clients.bench.shapes import Measurement, ShapeOptions, run_fixed
from gateway.clients.bench.stats import summarize
from gateway.clients.bench.workload import Prompt, Sampling, Workload
from gateway.testing.emulator.app import EmulatorConfig
from tests.support.client import MODEL
from tests.support.emulator import emulator_process
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.anyio

TTFT, T_I, BIG = 0.3, 0.02, 100_000
SAMPLING = Sampling(max_tokens=32)
RELAY = 0.015  # seconds an in-process gateway may add to TTFT (the surfaces' test)
SEED = 3  # of the Poisson schedule whose achieved rate is checked


@pytest.fixture(scope="module")
def truth_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The emulator as a process: unlimited slots, `TTFT`, `T_I` per token, `BIG` tokens."""
    log = tmp_path_factory.mktemp("truth_url") / "emulator.log"
    with emulator_process(
        log, "--ttft", str(TTFT), "--inter-token", str(T_I), "--tokens", str(BIG)
    ) as emulator:
        yield emulator.url


@pytest.fixture(scope="module")
def wake(truth_url: str) -> float:
    """Seconds a loopback round trip costs after `TTFT` of silence (test_bench_driver.wake)."""
    host, port = truth_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    trips = []
    try:
        for _ in range(5):
            time.sleep(TTFT)
            start = time.perf_counter()
            connection.request("GET", "/api/version", headers={"Host": host})
            connection.getresponse().read()
            trips.append(time.perf_counter() - start)
    finally:
        connection.close()
    return statistics.median(trips)


def within(value: float, low: float, high: float, rel: float = 0.03) -> bool:
    return low * (1 - rel) <= value <= high * (1 + rel)


def check_truth(
    run: Measurement, wake: float, limits: dict[str, int], relay: float = 0.0
) -> dict[str, float]:
    """Every counted answer is its limit long; TTFT (p50) and ITL (mean) within 3% of the truth.

    `limits` maps a prompt id to the limit it asked. A first token may come up to `wake`
    late, which also shortens the answer's first gap by as much: mean ITL at most
    wake x answers / gaps below `T_I`. `relay`: seconds a gateway in between may add to TTFT.
    Returns the TTFT p50, mean ITL and mean TPOT measured.
    """
    counted = [r for r in run.records if not r.warmup]
    assert counted
    assert all(r.ok for r in counted), [r.error for r in counted if not r.ok]
    assert [r.output_tokens for r in counted] == [limits[r.prompt_id] for r in counted]
    repeat = summarize(run.records, run.window_start, run.window_end)
    metrics = repeat["metrics"]
    gaps = sum(len(r.chunk_times) - 1 for r in counted)
    # TTFT's median: on a loaded 2-core machine one request in a dozen can be held up by
    # another process for tens of ms, which moves a mean of 12 by more than 3%. ITL's mean
    # is the answer's span over its gaps, which such a stall hardly moves.
    ttft, itl = metrics["ttft_seconds"]["p50"], metrics["itl_seconds"]["mean"]
    assert within(ttft, TTFT, TTFT + wake + relay), (ttft, wake)
    assert within(itl, T_I - wake * len(counted) / gaps, T_I), (itl, wake)
    outputs = sum(r.output_tokens or 0 for r in counted)
    assert metrics["output_tokens"]["mean"] * len(counted) == pytest.approx(outputs)
    return {"ttft": ttft, "itl": itl, "tpot": metrics["tpot_seconds"]["mean"]}


def limits_of(workload: Workload) -> dict[str, int]:
    return {p.id: p.max_tokens or workload.sampling.max_tokens for p in workload.prompts}


# --- workloads in a closed loop ------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.parametrize("spec", ["uniform:20,60", "normal:40,10,20,60"])
async def test_drawn_answer_lengths_are_measured_as_configured(truth_url, wake, spec):
    options = DatasetOptions(
        prompt_words=parse_lengths("uniform:5,50"), output_tokens=parse_lengths(spec), prompts=12
    )
    workload = build_workload(SYNTHETIC, SAMPLING, options)
    target = Target(truth_url, "openai")
    run = await run_concurrency(target, workload, MODEL, 3, requests=12, warmup=3)
    check_truth(run, wake, limits_of(workload))
    # the drawn lengths are the distribution's: their mean within 10% of 40 over 12 draws
    assert statistics.fmean(limits_of(workload).values()) == pytest.approx(40, rel=0.1)


@pytest.mark.processes
async def test_a_data_set_file_is_measured_as_configured(truth_url, wake, tmp_path: Path):
    path = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 300, "output_length": 25, "hash_ids": [1]},
        {"timestamp": 9, "input_length": 80, "output_length": 45},
        {"timestamp": 20, "input_length": 500, "output_length": 35, "hash_ids": [1, 2]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines), encoding="utf-8")
    workload = build_workload(str(path), SAMPLING, DatasetOptions())
    target = Target(truth_url, "ollama")
    run = await run_concurrency(target, workload, MODEL, 2, requests=9, warmup=2)
    check_truth(run, wake, limits_of(workload))
    counted = [r for r in run.records if not r.warmup]
    assert {r.prompt_words for r in counted} == {300, 80, 500}


@pytest.mark.processes
async def test_multi_turn_conversations_resend_their_growing_history(truth_url, wake):
    system, words, answer, turns = 50, 10, 20, 4
    options = DatasetOptions(
        prompt_words=parse_lengths(str(words)),
        output_tokens=parse_lengths(str(answer)),
        conversations=4,
        turns=turns,
        system_words=system,
    )
    workload = build_workload(SYNTHETIC, SAMPLING, options)
    target = Target(truth_url, "openai")
    run = await run_concurrency(target, workload, MODEL, 2, requests=16, warmup=0)
    counted = [r for r in run.records if not r.warmup]
    assert len(counted) == 16
    assert all(r.ok for r in counted)
    # turn t holds the system message, t user messages of `words` and t - 1 answers of
    # `answer` words (the emulator's "tok0 tok1 ..." as it came back)
    for record in counted:
        assert record.turn is not None
        expected = system + record.turn * words + (record.turn - 1) * answer
        assert record.prompt_words == expected, (record.prompt_id, record.prompt_words)
    assert sorted(r.turn for r in counted) == sorted(list(range(1, turns + 1)) * 4)
    limits = {r.prompt_id: answer for r in counted}
    check_truth(run, wake, limits)
    # the summary per turn shows the growth too
    result = await run_fixed(
        lambda _level: run_concurrency(target, workload, MODEL, 2, requests=8, warmup=0),
        2,
        options=ShapeOptions(),
    )
    per_turn = result.points[0]["repeats"][0]["turns"]
    assert [t["prompt_words_mean"] for t in per_turn] == [
        system + t * words + (t - 1) * answer for t in range(1, turns + 1)
    ]


async def test_each_turn_carries_the_previous_answer_and_the_shared_system(emulator: Emulator):
    emulator.state.config = EmulatorConfig(ttft=0.005, inter_token=0.001, tokens=3)
    options = DatasetOptions(
        conversations=2, turns=3, system_words=7, prompt_words=parse_lengths("4")
    )
    workload = build_workload(SYNTHETIC, SAMPLING, options)
    for api in ("ollama", "openai"):
        emulator.state.records.clear()
        run = await run_concurrency(Target(emulator.url, api), workload, MODEL, 1, requests=3)
        assert all(r.ok for r in run.records)
        bodies = [r.body for r in emulator.state.records[-3:]]
        histories = [body["messages"] for body in bodies]
        assert [len(h) for h in histories] == [2, 4, 6]
        assert (
            histories[2][:4]
            == histories[1][:4]
            == [*histories[0], histories[1][2], histories[1][3]][:4]
        )
        assert histories[1][2] == {"role": "assistant", "content": "tok0 tok1 tok2 "}
        assert {h[0]["content"] for h in histories} == {workload.conversations[0].system}
    with pytest.raises(ValueError, match="closed loop"):
        await run_rate(Target(emulator.url, "ollama"), workload, MODEL, 5.0, requests=2)


# --- arrival modes -------------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.parametrize("arrivals", ["constant", "poisson"])
async def test_open_loop_arrivals_measure_the_truth(truth_url, wake, arrivals):
    workload = build_workload(
        SYNTHETIC, SAMPLING, DatasetOptions(output_tokens=parse_lengths("uniform:10,30"), prompts=8)
    )
    target = Target(truth_url, "openai")
    run = await run_rate(
        target, workload, MODEL, 8.0, requests=24, warmup=1, seed=5, arrivals=arrivals
    )
    check_truth(run, wake, limits_of(workload))
    assert run.offered_rate == 8.0
    assert run.achieved_rate is not None


def realised(rate: float, seed: int, count: int, arrivals: str = "poisson") -> float:
    """The rate the first `count` arrivals of a schedule make: (count - 1) over the span."""
    offsets = list(itertools.islice(arrival_offsets(rate, seed, arrivals), count))  # type: ignore[arg-type]
    return (count - 1) / offsets[-1]


def test_the_schedules_realise_their_rate():
    # 400 exponential gaps spread their sum by 5% (1 sd): seed 3 realises 50/s within 1%,
    # 1234 (the default) 2.4% below it; the achieved-rate test uses seed 3
    assert realised(50.0, SEED, 400) == pytest.approx(50.0, rel=0.01)
    assert realised(50.0, 1234, 400) == pytest.approx(48.79, rel=0.001)
    assert realised(50.0, SEED, 400, "constant") == pytest.approx(50.0, rel=1e-9)
    offsets = list(itertools.islice(arrival_offsets(4.0, arrivals="constant"), 4))
    assert offsets == [0.0, 0.25, 0.5, 0.75]
    with pytest.raises(ValueError, match="poisson or constant"):
        arrival_offsets(1.0, arrivals="bursty")  # type: ignore[arg-type]
    assert achieved_rate([1.0]) is None
    assert achieved_rate([1.0, 1.5, 2.0]) == pytest.approx(2.0)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("arrivals", ["poisson", "constant"])
async def test_the_achieved_rate_is_the_requested_one(emulator: Emulator, arrivals):
    """400 arrivals at 50/s (8 s): the realised schedule is within 1% of 50/s for this seed
    (`test_the_schedules_realise_their_rate`), what was really sent within 3% of that, so
    within 5% of the requested rate: late sends on a loaded machine are what is measured."""
    emulator.state.config = EmulatorConfig(ttft=0.002, inter_token=0.001, tokens=2)
    workload = build_workload("builtin:short", SAMPLING, DatasetOptions())
    target = Target(emulator.url, "ollama")
    run = await run_rate(target, workload, MODEL, 50.0, requests=400, seed=1234, arrivals=arrivals)
    assert sum(r.ok for r in run.records) == 400
    assert run.achieved_rate is not None
    assert run.achieved_rate == pytest.approx(realised(50.0, SEED, 400, arrivals), rel=0.03)
    assert run.achieved_rate == pytest.approx(50.0, rel=0.05)
    result = await run_fixed(
        lambda rate: run_rate(target, workload, MODEL, rate, requests=40, arrivals=arrivals),
        20.0,
        shape="rate",
        options=ShapeOptions(),
    )
    point = result.points[0]
    assert point["repeats"][0]["arrival_rate"]["offered"] == 20.0
    assert point["summary"]["achieved_rate"]["median"] == pytest.approx(
        realised(20.0, 1234, 40, arrivals), rel=0.05
    )


# --- the agent surfaces --------------------------------------------------------------------------


@pytest.fixture
def truth_gateway(make_gateway, truth_url: str) -> Gateway:
    """A gateway in front of the truth emulator process."""
    return make_gateway(upstream_url=truth_url)


@pytest.mark.processes
@pytest.mark.parametrize("surface", ["responses", "messages"])
async def test_agent_surfaces_measure_the_truth_through_the_gateway(
    truth_gateway: Gateway, wake, surface
):
    """Through a real gateway: the truth as chat measures it, usage from the final event.

    The gateway runs in this test's process (beside the load generator) and relays each
    chunk: on a loaded 2-core machine it adds up to about 15 ms to TTFT (`RELAY`), the same
    for chat and the surface: their ITL and TPOT are compared with each other within 3%, their
    TTFT within `RELAY`.
    """
    gateway = truth_gateway
    workload = build_workload(
        "builtin:short", SAMPLING, DatasetOptions(output_tokens=parse_lengths("20"))
    )
    got = {}
    for name, target in {
        "chat": Target(gateway.url, "openai", key=gateway.key),
        surface: Target(gateway.url, "openai", key=gateway.key, surface=surface),
    }.items():
        run = await run_concurrency(target, workload, MODEL, 2, requests=8, warmup=2)
        got[name] = check_truth(run, wake, limits_of(workload), relay=RELAY)
        repeat = summarize(run.records, run.window_start, run.window_end)
        assert repeat["sources"]["output_tokens"] == (
            "openai.usage" if name == "chat" else f"{surface}.usage"
        )
    for metric in ("itl", "tpot"):
        assert got[surface][metric] == pytest.approx(got["chat"][metric], rel=0.03), got
    assert got[surface]["ttft"] == pytest.approx(got["chat"]["ttft"], abs=RELAY), got


@pytest.mark.parametrize("surface", ["responses", "messages"])
async def test_agent_surfaces_read_usage_and_a_cut_answer(gateway: Gateway, emulator, surface):
    """The counts are the final event's; an answer cut by its limit is a complete one."""
    emulator.state.config = EmulatorConfig(
        ttft=0.005, inter_token=0.001, tokens=50, prompt_eval_count=11
    )
    workload = build_workload("builtin:short", Sampling(max_tokens=5), DatasetOptions())
    target = Target(gateway.url, "openai", key=gateway.key, surface=surface)
    run = await run_concurrency(target, workload, MODEL, 1, requests=2)
    for record in run.records:
        assert record.ok, record.error  # `response.incomplete` / `max_tokens`: still complete
        assert (record.output_tokens, record.prompt_tokens) == (5, 11)
        assert record.output_source == f"{surface}.usage"
        assert len(record.chunk_times) == 5
    received = emulator.state.records[-1]
    assert received.path == "/api/chat"  # the gateway translated the surface to its upstream
    assert received.body["options"]["num_predict"] == 5


def test_a_surface_is_an_openai_chat_surface():
    with pytest.raises(ValueError, match="OpenAI-API chat surface"):
        Target("http://127.0.0.1:1", "ollama", surface="responses")
    with pytest.raises(ValueError, match="surface must be"):
        Target("http://127.0.0.1:1", "openai", surface="embeddings")  # type: ignore[arg-type]
    assert (
        Target("http://127.0.0.1:1", "openai", surface="messages").headers()["anthropic-version"]
        == "2023-06-01"
    )


def test_word_count_counts_whitespace_separated_words():
    assert word_count(" a  b\nc ") == 3


async def test_a_failed_turn_ends_its_conversation(emulator: Emulator):
    emulator.state.config = EmulatorConfig(
        ttft=0.002, inter_token=0.001, tokens=2, fault="status_before", fault_status=500
    )
    options = DatasetOptions(conversations=2, turns=3, prompt_words=parse_lengths("3"))
    workload = build_workload(SYNTHETIC, SAMPLING, options)
    run = await run_concurrency(Target(emulator.url, "ollama"), workload, MODEL, 1, requests=2)
    assert [(r.ok, r.turn, r.prompt_id) for r in run.records] == [
        (False, 1, "conv-1-1"),
        (False, 1, "conv-2-1"),
    ]


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_command_line_runs_each_new_mode(emulator: Emulator, tmp_path: Path, capsys):
    emulator.state.config = EmulatorConfig(ttft=0.002, inter_token=0.001, tokens=1000)
    base = ["run", "--target", emulator.url, "--model", MODEL, "--no-gpu"]
    data = tmp_path / "data.csv"
    data.write_text("prompt,output_tokens_count\nhello there,7\nhow are you,9\n", encoding="utf-8")
    out = tmp_path / "run.json"
    assert main([*base, "--workload", str(data), "--requests", "4", "--out", str(out)]) == 0
    repeat = json.loads(out.read_text())["models"][0]["points"][0]["repeats"][0]
    assert repeat["metrics"]["output_tokens"]["mean"] == 8.0
    code = main([
        *base, "--workload", "synthetic", "--conversations", "2", "--turns", "2",
        "--system-words", "5", "--prompt-words", "4", "--output-tokens", "3",
        "--requests", "4", "--warmup", "0", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    turns = doc["models"][0]["points"][0]["repeats"][0]["turns"]
    assert [t["prompt_words_mean"] for t in turns] == [9, 16]  # 5 + 4; 5 + 4 + 3 + 4
    assert doc["parameters"]["workload"]["conversations"] == 2
    code = main([
        *base, "--rate", "20", "--arrivals", "constant", "--requests", "10", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["parameters"]["arrivals"] == "constant"
    rate = doc["models"][0]["points"][0]["repeats"][0]["arrival_rate"]
    assert rate["offered"] == 20.0
    assert rate["achieved"] == pytest.approx(20.0, rel=0.2)  # 10 arrivals: no timing claim
    assert "sent " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--output-tokens", "uniform:9,1"], "low <= high"),
        (["--workload", "synthetic", "--conversations", "2", "--rate", "1"], "closed loop"),
        (["--prompt-words", "10"], "--prompt-words applies to a synthetic workload"),
        (["--arrivals", "bursty"], "invalid choice"),
    ],
)
def test_bad_workload_options_are_usage_errors(capsys, args, message):
    with contextlib.suppress(SystemExit):
        code = main(["run", "--target", "http://127.0.0.1:1", "--api", "ollama", "--model", "m",
                     "--no-save", *args])  # fmt: skip
        assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_surface_endpoint_speaks_the_openai_api_without_detection(gateway: Gateway, tmp_path):
    out = tmp_path / "run.json"
    env_key = {"GATEWAY_BENCH_API_KEY": gateway.key}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env_key.items():
            patch.setenv(name, value)
        code = main([
            "run", "--target", gateway.url, "--model", MODEL, "--endpoint", "messages",
            "--requests", "2", "--no-gpu", "--out", str(out),
        ])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["parameters"]["api"] == "openai"
    assert doc["parameters"]["surface"] == "messages"
    repeat = doc["models"][0]["points"][0]["repeats"][0]
    assert repeat["sources"]["output_tokens"] == "messages.usage"


# --- reading the surfaces' streams (sans-IO) ---------------------------------------------------


def sse(*events: dict) -> bytes:
    """An SSE stream of `events`, each named by its `type`, as both surfaces send them."""
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def ev(kind: str, **fields: object) -> dict:
    return {"type": kind, **fields}


def usage(prompt: int, output: int, names: tuple[str, str] = ("input_tokens", "output_tokens")):
    return {names[0]: prompt, names[1]: output}


TEXT = "response.output_text.delta"
RESPONSES = sse(
    ev("response.created", response={"status": "in_progress"}),
    ev("response.reasoning_summary_text.delta", delta="hmm"),
    ev(TEXT, delta="Hel"),
    ev(TEXT, delta=""),
    ev(TEXT, delta="lo"),
    ev("response.completed", response={"usage": usage(7, 3)}),
)
MESSAGES = sse(
    ev("message_start", message={"usage": usage(0, 0)}),
    ev("content_block_delta", delta={"type": "thinking_delta", "thinking": "hmm"}),
    ev("content_block_delta", delta={"type": "text_delta", "text": "Hel"}),
    ev("ping"),
    ev("content_block_delta", delta={"type": "text_delta", "text": "lo"}),
    ev("message_delta", usage=usage(7, 3)),
    ev("message_stop"),
)


@pytest.mark.parametrize(("surface", "stream"), [("responses", RESPONSES), ("messages", MESSAGES)])
def test_the_surfaces_streams_are_read_at_every_byte_split(surface, stream):
    for cut in range(0, len(stream), 7):
        reader = AnswerReader("openai", surface=surface, keep_text=True)
        reader.feed(stream[:cut], 1.0)
        reader.feed(stream[cut:], 2.0)
        reader.close(3.0)
        record = reader.record(0.0, 3.0, 200)
        assert record.ok, (cut, record.error)
        assert len(record.chunk_times) == 3  # thinking, "Hel", "lo": the empty delta is none
        assert (record.output_tokens, record.prompt_tokens) == (3, 7)
        assert record.output_source == f"{surface}.usage"
        assert reader.text == "Hello"  # the content only: a conversation resends no thinking


@pytest.mark.parametrize(
    ("surface", "stream", "error"),
    [
        ("responses", sse(ev("response.failed", response={"error": {"message": "boom"}})), "boom"),
        ("responses", sse(ev("error", message="bad")), "bad"),
        (
            "messages",
            sse(ev("error", error={"type": "overloaded_error", "message": "busy"})),
            "busy",
        ),
        ("messages", RESPONSES, "answer ended without a final chunk"),
        ("responses", RESPONSES + RESPONSES, "went on after its final chunk"),
    ],
)
def test_the_surfaces_failures_fail_the_record(surface, stream, error):
    reader = AnswerReader("openai", surface=surface)
    reader.feed(stream, 1.0)
    reader.close(2.0)
    record = reader.record(0.0, 2.0, 200)
    assert not record.ok
    assert error in (record.error or "")


def test_the_surfaces_requests():
    system, user = {"role": "system", "content": "S"}, {"role": "user", "content": "U"}
    prompt = Prompt("p", messages=(system, user), max_tokens=9)
    sampling = Sampling(max_tokens=32, temperature=0.5)
    responses = Target("http://h:1/pre", "openai", surface="responses")
    path, body = build_request(responses, "m", prompt, sampling)
    assert path == "/pre/v1/responses"
    assert json.loads(body) == {
        "model": "m", "stream": True, "temperature": 0.5, "max_output_tokens": 9,
        "input": [system, user],
    }  # fmt: skip
    messages = Target("http://h:1", "openai", surface="messages")
    path, body = build_request(messages, "m", prompt, sampling)
    assert path == "/v1/messages"
    assert json.loads(body) == {
        "model": "m", "stream": True, "temperature": 0.5, "max_tokens": 9, "system": "S",
        "messages": [user],
    }  # fmt: skip
    _, body = build_request(Target("http://h:1", "ollama"), "m", Prompt("q", text="x"), sampling)
    assert json.loads(body)["options"]["num_predict"] == 32  # no prompt limit: the run's
