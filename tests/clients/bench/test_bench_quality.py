"""The quality probe: the scoring rule on crafted answers, and round trips over real sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.clients.bench.quality import probe_quality
from gateway.clients.bench.questions import QUESTION_SET, QUESTIONS, is_correct, normalise
from gateway.testing.server import LoopbackServer
from gateway.testing.stack import free_port


@pytest.mark.parametrize(
    ("answer", "accepted", "correct"),
    [
        ("12", ("12",), True),
        ("The answer is 12.", ("12",), True),
        ("**Twelve**", ("12", "twelve"), True),
        ("112", ("12",), False),
        ("12.5", ("12",), False),
        ("0.12", ("12",), False),
        ("3.14", ("3.14",), True),
        ("1,000 grams", ("1000",), True),
        ("1000.", ("1000",), True),
        ("PARIS", ("Paris",), True),
        ("Paris, France", ("Paris",), True),
        ("Parisian", ("Paris",), False),
        ("Au", ("Au",), True),
        ("Australia", ("Au",), False),
        ("<think>Maybe Lyon? No: Paris.</think>Lyon", ("Paris",), False),
        ("<think>7 + 5 = 12</think>12", ("12",), True),
        ("北京", ("北京", "Beijing"), True),
        ("中国的首都是北京。", ("北京", "Beijing"), True),
        ("首都是上海", ("北京", "Beijing"), False),
        ("三加四等于7", ("7", "七"), True),
        ("三加四等于七。", ("7", "七"), True),
        ("三加四等于17", ("7", "七"), False),
        ("Ｔｏｋｙｏ", ("Tokyo",), True),  # full-width letters (NFKC)  # noqa: RUF001
        ("seventy-two", ("72", "seventy-two"), True),
        ("", ("12",), False),
        ("tok0 tok1 tok2", ("12",), False),
    ],
)
def test_answers_are_scored_by_normalised_whole_word_containment(
    answer: str, accepted: tuple[str, ...], correct: bool
) -> None:
    assert is_correct(answer, accepted) is correct


def test_normalise() -> None:
    assert normalise("  The answer: 3.14, or 1,000!\n") == "the answer 3.14 or 1000"
    assert normalise("<think>hmm</think> Paris.") == "paris"


def test_the_builtin_set_is_small_fixed_and_self_consistent() -> None:
    assert 10 <= len(QUESTIONS) <= 20
    assert f"builtin-{len(QUESTIONS)}" == QUESTION_SET
    assert len({q.id for q in QUESTIONS}) == len(QUESTIONS)
    assert any("中国" in q.prompt for q in QUESTIONS)
    for question in QUESTIONS:
        assert is_correct(f"The answer is {question.answers[0]}.", question.answers)
        assert not is_correct("I do not know.", question.answers)


def _oracle_app(wrong: set[str]) -> Starlette:
    """A server answering each question right (in a sentence), except the prompts in `wrong`."""
    by_prompt = {q.prompt: q.answers[0] for q in QUESTIONS}
    seen: list[dict[str, Any]] = []

    def reply(prompt: str) -> str:
        return "no idea" if prompt in wrong else f"Sure! It is {by_prompt[prompt]}."

    async def generate(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        seen.append(body)
        return JSONResponse(
            {"model": body["model"], "response": reply(body["prompt"]), "done": True}
        )

    async def chat(request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        seen.append(body)
        message = {"role": "assistant", "content": reply(body["messages"][0]["content"])}
        return JSONResponse({"choices": [{"index": 0, "message": message}]})

    routes = [
        Route("/api/generate", generate, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.seen = seen
    return app


@pytest.mark.anyio
@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_round_trip_scores_the_right_answers(api: Any) -> None:
    app = _oracle_app(wrong={QUESTIONS[0].prompt, QUESTIONS[-1].prompt})
    with LoopbackServer(app) as server:
        result = await probe_quality(server.url, "m", api=api, seed=7, max_tokens=16)
    total = len(QUESTIONS)
    assert result["set"] == QUESTION_SET
    assert (result["correct"], result["total"], result["errors"]) == (total - 2, total, 0)
    assert result["score"] == pytest.approx((total - 2) / total)
    assert [a["correct"] for a in result["answers"]] == [False] + [True] * (total - 2) + [False]
    assert result["answers"][1]["answer"] == f"Sure! It is {QUESTIONS[1].answers[0]}."
    seen = app.state.seen
    assert len(seen) == total
    if api == "ollama":
        assert seen[0]["stream"] is False
        assert seen[0]["options"] == {"temperature": 0.0, "seed": 7, "num_predict": 16}
    else:
        assert (seen[0]["temperature"], seen[0]["seed"], seen[0]["max_tokens"]) == (0.0, 7, 16)
        assert seen[0]["stream"] is False


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.anyio
@pytest.mark.parametrize("api", ["ollama", "openai"])
async def test_round_trip_against_the_emulator(emulator: Any, api: Any) -> None:
    notes: list[str] = []
    result = await probe_quality(emulator.url, "llama3.2", api=api, key="gw_k", notes=notes)
    # The emulator's canned text ("tok0 tok1 ...") answers nothing right.
    assert (result["score"], result["correct"], result["errors"]) == (0.0, 0, 0)
    assert result["total"] == len(QUESTIONS)
    assert all(a["answer"].startswith("tok0 ") for a in result["answers"])
    assert notes == []
    records = [r for r in emulator.state.records if r.method == "POST"]
    assert len(records) == len(QUESTIONS)
    assert records[0].headers["authorization"] == "Bearer gw_k"
    assert "gw_k" not in json.dumps(result)


@pytest.mark.anyio
async def test_failed_requests_count_as_wrong_with_a_note(emulator: Any) -> None:
    emulator.config.fault = "status_before"
    notes: list[str] = []
    result = await probe_quality(emulator.url, "llama3.2", notes=notes)
    assert (result["correct"], result["errors"], result["score"]) == (0, len(QUESTIONS), 0.0)
    assert all(a["answer"] is None and a["error"].startswith("HTTP 500") for a in result["answers"])
    assert len(notes) == 1
    assert notes[0].startswith(f"quality probe of llama3.2: {len(QUESTIONS)} of {len(QUESTIONS)}")
    assert notes[0].endswith("counted as wrong")


@pytest.mark.anyio
async def test_an_unreachable_server_scores_zero_without_raising() -> None:
    result = await probe_quality(f"http://127.0.0.1:{free_port()}", "m", api="openai")
    assert result["errors"] == result["total"] == len(QUESTIONS)
    assert result["answers"][0]["error"].startswith("ConnectError")


@pytest.mark.anyio
async def test_an_echoed_key_cut_short_is_redacted(emulator: Any) -> None:
    key = "gw_SECRETKEY0123456789abcdef"
    emulator.config.fault = "status_before"
    emulator.config.fault_message = "p" * 170 + key  # the body's 200-character cut is in the key
    notes: list[str] = []
    result = await probe_quality(emulator.url, "llama3.2", key=key, notes=notes)
    shown = json.dumps(result) + "".join(notes)
    assert key[:8] not in shown
    assert "[key" in result["answers"][0]["error"]  # the mark itself may be cut
