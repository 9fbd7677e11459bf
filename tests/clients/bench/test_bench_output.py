"""Issue 30 items 3 and 5: sizes, the probe's endpoints and files, progress, the HTML report.

Sizes come from servers on loopback ports (a fake llama.cpp `/v1/models` and `/props`) and
from what a user gives; the probe is scored against the emulator, whose answers are known
(`tok0 tok1 ...`): the builtin set scores 0 there, a question file asking for `tok0` does not;
the HTML report is parsed and searched for anything that would reach the network.
"""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.clients.bench.cli import main
from gateway.clients.bench.html import render_html, write_report
from gateway.clients.bench.progress import LevelProgress, level_label
from gateway.clients.bench.protocol import Target
from gateway.clients.bench.quality import probe_quality
from gateway.clients.bench.questions import QUESTION_SET, QuestionFileError, load_questions
from gateway.clients.bench.runner import Plan, run_benchmark
from gateway.clients.bench.sizes import SizeHint, model_size, parse_size
from gateway.clients.bench.workload import Sampling, load_workload
from gateway.testing.server import LoopbackServer
from tests.clients.bench.bench_docs import model_entry, run_doc

FAST = {"ttft": 0.01, "inter_token": 0.002, "tokens": 6}

# --- progress ------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_shows_the_total_only_when_known() -> None:
    said: list[str] = []
    clock = _Clock()
    known = LevelProgress(
        "m", level_label("concurrency", 4), duration=None, say=said.append, clock=clock
    )
    clock.now += 10
    known(40, 120, 2)
    assert said[-1] == "\r  m: concurrency 4  40/120 requests, 4.0/s  2 failed (5%)  10 s"

    unknown = LevelProgress(
        "m", level_label("rate", 2.5), duration=30, say=said.append, clock=clock
    )
    clock.now += 4
    unknown(88, 0, 0)
    assert said[-1] == "\r  m: rate 2.5 req/s  88 requests, 22.0/s  0 failed  4 s of 30 s"
    assert "/0" not in said[-1]


def test_a_rate_shows_the_rate_sent_and_says_when_it_drains() -> None:
    said: list[str] = []
    clock = _Clock()
    rate = LevelProgress("m", level_label("rate", 2), duration=6, say=said.append, clock=clock)
    clock.now += 4
    rate(1, 0, 0, sent=8)
    assert said[-1] == "\r  m: rate 2 req/s  1 request, sent 2.0 req/s  0 failed  4 s of 6 s"
    clock.now += 3  # past the planned 6 s: arrivals stopped, answers still awaited
    rate(10, 0, 0, sent=12)
    assert said[-1].endswith("sent 2.0 req/s  0 failed  6 s of 6 s, draining 2")
    assert "7 s" not in said[-1]


def test_progress_at_its_first_instant_and_with_a_hostile_model_name() -> None:
    said: list[str] = []
    progress = LevelProgress(
        "evil\x1b[2Jname", "concurrency 1", duration=None, say=said.append, clock=_Clock()
    )
    progress(0, 0, 0)
    assert "0 requests, -/s" in said[-1]  # no division by a zero elapsed time
    assert "\x1b" not in said[-1]


# --- sizes ---------------------------------------------------------------------------------


def test_a_size_given_as_a_number_or_a_file(tmp_path: Path) -> None:
    assert parse_size("m=4.1GB") == ("m", SizeHint(4_100_000_000, "--size"))
    assert parse_size("253 MB") == (None, SizeHint(253_000_000, "--size"))
    assert parse_size("a:b=2GiB") == ("a:b", SizeHint(2 * 2**30, "--size"))
    assert parse_size("m=1200") == ("m", SizeHint(1200, "--size"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(1000))
    assert parse_size(f"m={model}") == ("m", SizeHint(1004, "--size file model.gguf"))
    with pytest.raises(ValueError, match="neither an amount"):
        parse_size(f"m={tmp_path / 'missing.gguf'}")
    with pytest.raises(ValueError, match="neither an amount"):
        parse_size("m=4.1 parsecs")


def _llamacpp_app(*, meta: dict[str, Any] | None, model_path: str | None) -> Starlette:
    """A fake `llama-server`: `/v1/models` with `meta` (as tools/server writes it), `/props`."""

    async def models(_request: Request) -> JSONResponse:
        entry: dict[str, Any] = {"id": "g.gguf", "object": "model", "owned_by": "llamacpp"}
        if meta is not None:
            entry["meta"] = meta
        return JSONResponse({"object": "list", "data": [entry]})

    async def props(request: Request) -> JSONResponse:
        props.seen.append(request.query_params.get("model"))  # type: ignore[attr-defined]
        return JSONResponse({"model_path": model_path, "total_slots": 1})

    props.seen = []  # type: ignore[attr-defined]
    app = Starlette(routes=[Route("/v1/models", models), Route("/props", props)])
    app.state.props = props
    return app


async def _size_of(app: Starlette, **kwargs: Any) -> dict[str, Any]:
    with LoopbackServer(app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=5.0) as client:
            return await model_size(client, "openai", "g.gguf", url=server.url, **kwargs)


@pytest.mark.anyio
async def test_sizes_from_llamacpp_v1_models_meta() -> None:
    app = _llamacpp_app(meta={"n_params": 268_098_176, "size": 253_104_640}, model_path=None)
    notes: list[str] = []
    size = await _size_of(app, hint=SizeHint(1, "--size"), notes=notes)
    assert size["disk_bytes"] == 253_104_640
    assert size["parameters"] == 268_098_176
    assert size["source"] == "llama.cpp /v1/models meta.size"
    assert len(notes) == 1
    assert "not --size" in notes[0]  # the server's number wins, and says so


@pytest.mark.anyio
async def test_sizes_from_llamacpp_props_model_path_on_this_machine(tmp_path: Path) -> None:
    weights = tmp_path / "g.gguf"
    weights.write_bytes(b"GGUF" + bytes(4092))
    app = _llamacpp_app(meta=None, model_path=str(weights))
    size = await _size_of(app)
    assert size["disk_bytes"] == 4096
    assert size["source"] == "llama.cpp /props model_path (g.gguf)"
    assert app.state.props.seen == ["g.gguf"]


@pytest.mark.anyio
async def test_a_server_that_tells_nothing_leaves_the_users_size(tmp_path: Path) -> None:
    app = _llamacpp_app(meta=None, model_path=str(tmp_path / "elsewhere.gguf"))
    size = await _size_of(app, hint=SizeHint(4_100_000_000, "--size"))
    assert (size["disk_bytes"], size["source"]) == (4_100_000_000, "--size")
    assert (await _size_of(app))["disk_bytes"] is None


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["no magic", "not .gguf", "directory", "fifo"])
async def test_a_props_model_path_that_is_no_gguf_file_is_ignored_with_a_note(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / ("g.bin" if kind == "not .gguf" else "g.gguf")
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # opened blocking, it would hang the run until a writer came
    else:
        path.write_bytes((b"GGUF" if kind == "not .gguf" else b"\x7fELF") + bytes(4092))
    notes: list[str] = []
    size = await _size_of(_llamacpp_app(meta=None, model_path=str(path)), notes=notes)
    assert (size["disk_bytes"], size["source"]) == (None, None)
    assert len(notes) == 1
    assert "is not a GGUF file" in notes[0]


@pytest.mark.parametrize("value", ["m=" + "9" * 400 + "GB", "2000TB"])
def test_an_absurd_size_is_refused_not_a_traceback(value: str) -> None:
    with pytest.raises(ValueError, match="larger than any model"):
        parse_size(value)


# --- the quality probe ---------------------------------------------------------------------


def _qa_file(tmp_path: Path) -> Path:
    path = tmp_path / "qa.jsonl"
    lines = [
        {"id": "first", "question": "What does the emulator say first?", "answer": "tok0"},
        {"prompt": "Count: tok0 tok1", "answers": ["tok2", "token two"]},
        {"question": "What is the capital of France?", "answer": {"value": "Paris"}},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    return path


def test_a_question_file_is_read_with_its_name_and_digest(tmp_path: Path) -> None:
    questions, name = load_questions(_qa_file(tmp_path))
    assert [q.id for q in questions] == ["first", "2", "3"]
    assert questions[0].prompt.endswith("Question: What does the emulator say first?\nAnswer:")
    assert questions[1].prompt == "Count: tok0 tok1"  # a prompt is sent as it is
    assert questions[1].answers == ("tok2", "token two")
    assert name.startswith("file:qa.jsonl@")
    assert len(name) == len("file:qa.jsonl@") + 12
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no answer"}\n')
    with pytest.raises(QuestionFileError, match="line 1: no 'answer'"):
        load_questions(bad)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.anyio
@pytest.mark.parametrize(("api", "endpoint"), [("openai", "completions"), ("ollama", "completions"),
                                               ("openai", "chat")])  # fmt: skip
async def test_the_probe_scores_the_emulators_known_answers(
    emulator: Any, tmp_path: Path, api: Any, endpoint: Any
) -> None:
    for name, value in FAST.items():
        setattr(emulator.config, name, value)
    model = emulator.config.models[0]
    builtin = await probe_quality(emulator.url, model, api=api, endpoint=endpoint)
    assert (builtin["set"], builtin["correct"], builtin["errors"]) == (QUESTION_SET, 0, 0)
    questions, name = load_questions(_qa_file(tmp_path))
    result = await probe_quality(
        emulator.url, model, api=api, endpoint=endpoint, questions=questions, question_set=name
    )
    # The emulator answers `tok0 tok1 ... tok5`: the first two questions are right, not Paris.
    assert [a["correct"] for a in result["answers"]] == [True, True, False]
    assert (result["correct"], result["total"], result["errors"]) == (2, 3, 0)
    assert result["endpoint"] == endpoint
    assert result["set"] == name


# --- the HTML report -----------------------------------------------------------------------


class _Page(HTMLParser):
    """Collects every URL-bearing attribute, the text, and whether tags balance enough."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_cell = tag in ("td", "th")
        if self._in_cell:
            self.cells.append("")
        for name, value in attrs:
            if name in ("src", "href", "action", "srcset", "poster", "data") and value:
                self.urls.append((tag, name, value))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_cell:
            self.cells[-1] += data


def _parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_html_report_is_self_contained_and_holds_the_tables() -> None:
    pytest.importorskip("matplotlib")
    hostile = 'x<script>alert(1)</script><img src="https://evil.example/p.png">'
    doc = run_doc([model_entry("gemma3-270m"), model_entry(hostile, quality=0.5)])
    doc["models"][0]["size"] = {"disk_bytes": 253_000_000, "source": "--size"}
    page = render_html(doc)
    parsed = _parse(page)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page
    assert "<link" not in page
    assert "default-src 'none'" in page  # the browser is told: nothing outside
    # Every URL in the page is an embedded PNG: no http(s), no protocol-relative //host.
    assert parsed.urls, "the plots are embedded"
    for tag, _name, value in parsed.urls:
        assert tag == "img"
        assert value.startswith("data:image/png;base64,"), value[:40]
    assert "https://evil" in "".join(parsed.text)  # shown as text, never as an attribute
    # The tables: the matrix with the size and the quality, each model's points.
    assert "gemma3-270m" in parsed.cells
    assert "0.253" in parsed.cells  # disk (GB)
    assert "92% (11/12)" in parsed.cells or any("11/12" in c for c in parsed.cells)
    assert parsed.cells.count("concurrency") == 2
    assert {"TTFT p50 (ms)", "output (tok/s)", "quality"} <= set(parsed.cells)


def test_the_html_report_without_matplotlib_still_holds_the_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.clients.bench import plots

    def missing() -> Any:
        raise plots.PlotsUnavailable("matplotlib is not installed: " + plots.INSTALL_HINT)

    monkeypatch.setattr(plots, "_figure_classes", missing)
    out = tmp_path / "sub" / "r.html"
    notes = write_report(run_doc(), out)
    page = out.read_text(encoding="utf-8")
    assert notes == ["no plots: matplotlib is not installed: " + plots.INSTALL_HINT]
    assert "llm-gateway[bench]" in page
    assert not _parse(page).urls
    assert "TTFT p50 (ms)" in _parse(page).cells


# --- the tutorial's table in one command ---------------------------------------------------


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_two_builds_in_one_command_show_size_speed_knee_and_quality(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    for name, value in FAST.items():
        setattr(emulator.config, name, value)
    first, second = emulator.config.models[:2]
    weights = tmp_path / "second.gguf"
    weights.write_bytes(bytes(2_000_000))
    out, page = tmp_path / "run.json", tmp_path / "report.html"
    code = main([
        "run", "--target", emulator.url, "--api", "openai", "--models", f"{first},{second}",
        "--concurrency", "1,2", "--requests", "4", "--warmup", "1", "--no-gpu",
        "--quality-file", str(_qa_file(tmp_path)), "--quality-endpoint", "completions",
        "--size", f"{first}=1.5GB", "--size", f"{second}={weights}",
        "--out", str(out), "--html", str(page),
    ])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    sizes = [entry["size"]["disk_bytes"] for entry in doc["models"]]
    assert sizes == [1_500_000_000, 2_000_000]
    assert [entry["quality"]["correct"] for entry in doc["models"]] == [2, 2]
    matrix = capsys.readouterr().out.split("\n\n")[1]
    lines = matrix.splitlines()
    assert lines[0].split()[:3] == ["model", "disk", "(GB)"]
    assert lines[2].split()[1] == "1.50"
    assert lines[3].split()[1] == "0.002"
    assert all(line.rstrip().endswith("67% (2/3)") for line in lines[2:4])
    parsed = _parse(page.read_text(encoding="utf-8"))
    assert any("67% (2/3)" in cell for cell in parsed.cells)
    assert all(value.startswith("data:image/png") for _, _, value in parsed.urls)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_report_writes_the_html_from_a_saved_run(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    run.write_text(json.dumps(run_doc()))
    page = tmp_path / "out.html"
    assert main(["report", str(run), "--html", str(page)]) == 0
    assert "TTFT p50 (ms)" in _parse(page.read_text(encoding="utf-8")).cells


def test_compare_judges_quality_only_on_the_same_questions_asked_the_same_way() -> None:
    from gateway.clients.bench.compare import compare

    def quality(doc: dict[str, Any]) -> str:
        (row,) = [r for r in compare(base, doc).rows if r.metric.key == "quality"]
        return row.verdict

    base = run_doc([model_entry("m", quality=11 / 12)])
    worse = run_doc([model_entry("m", quality=6 / 12)])
    assert quality(worse) == "worse"
    worse["models"][0]["quality"]["endpoint"] = "completions"
    assert quality(worse) == "missing"  # asked through another endpoint: not comparable
    worse["models"][0]["quality"] |= {"endpoint": "chat", "set": "file:qa.jsonl@0123456789ab"}
    assert quality(worse) == "missing"  # other questions


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--size", "m=4.1 parsecs", "neither an amount"),
        ("--size", "m=/nonexistent/model.gguf", "neither an amount"),
        ("--quality-file", "/nonexistent/qa.jsonl", "cannot read"),
        ("--size", "other=4GB", "not among --models"),
    ],
)
def test_a_bad_size_or_question_file_is_a_usage_error_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, said: str
) -> None:
    # Port 1 refuses: were anything sent, the exit would be 1 (unreachable), not 2.
    code = main([
        "run", "--target", "http://127.0.0.1:1", "--api", "openai", "--model", "m",
        option, value, "--no-save", "--no-gpu",
    ])  # fmt: skip
    assert code == 2
    assert said in capsys.readouterr().err


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.anyio
async def test_the_runner_reports_progress_per_level_with_what_it_knows(emulator: Any) -> None:
    for name, value in FAST.items():
        setattr(emulator.config, name, value)
    workload = load_workload("builtin", Sampling(max_tokens=8))
    common = {"models": (emulator.config.models[0],), "workload": workload, "gpu": False}
    said: list[str] = []
    counted = Plan(
        target=Target(emulator.url, "openai"), mode="sweep", shape="concurrency",
        levels=(1, 2), duration=None, requests=3, **common,
    )  # fmt: skip
    await run_benchmark(counted, say=said.append)
    live = [line for line in said if line.startswith("\r") and not line.endswith("\n")]
    model = emulator.config.models[0]
    for done, line in enumerate(live[-3:], start=1):
        assert line.startswith(f"\r  {model}: concurrency 2  {done}/3 requests, ")
    assert all("0 failed" in line for line in live)
    timed = Plan(
        target=Target(emulator.url, "openai"), mode="fixed", shape="concurrency",
        levels=(1,), duration=0.3, requests=None, **common,
    )  # fmt: skip
    said.clear()
    await run_benchmark(timed, say=said.append)
    live = [line for line in said if line.startswith("\r") and not line.endswith("\n")]
    assert live
    assert all(re.search(r": concurrency 1  \d+ requests?, ", line) for line in live)  # no total
    # Duration mode: the planned seconds, and after them the in-flight answers being drained.
    assert all(line.endswith((" of 0.3 s", "0.3 s of 0.3 s, draining")) for line in live)


@pytest.mark.anyio
async def test_sizes_from_ollama_tags_ps_and_show(emulator: Any) -> None:
    model = emulator.config.models[0]
    async with httpx.AsyncClient(base_url=emulator.url, timeout=5.0) as client:
        await client.post("/api/generate", json={"model": model, "prompt": "hi", "stream": False})
        size = await model_size(client, "ollama", model, url=emulator.url)
        tags = (await client.get("/api/tags")).json()["models"]
        show = (await client.post("/api/show", json={"model": model})).json()
    listed = next(m for m in tags if m["name"] == model)
    assert size["disk_bytes"] == listed["size"]
    assert size["source"] == "ollama /api/tags"
    assert size["parameters"] == show["model_info"]["general.parameter_count"]
    assert size["parameters"] > 0
    assert size["loaded_bytes"] is not None  # /api/ps, the model answered just now
