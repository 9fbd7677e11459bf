"""The dialects: Target, build_request, and the sans-IO AnswerReader on every byte split."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from gateway.clients.bench.protocol import AnswerReader, Target, build_request, error_text
from gateway.clients.bench.records import RequestRecord
from gateway.clients.bench.workload import Prompt, Sampling
from tests.support.lookalikes import sse

KEY = "gw_abc_supersecretvalue"
TEXT = Prompt("t", text="Why?")
CHAT = Prompt("c", messages=({"role": "user", "content": "Why?"},))
SAMPLING = Sampling(temperature=0.5, seed=7, max_tokens=64)


# --- Target ------------------------------------------------------------------------------------


def test_target_keeps_the_key_out_of_its_repr():
    target = Target("http://127.0.0.1:11434", "ollama", key=KEY)
    assert KEY not in repr(target)
    assert KEY not in str(target)
    assert target.headers()["Authorization"] == f"Bearer {KEY}"


def test_target_splits_the_url():
    target = Target("https://user:pw@example.com/prefix/", "openai")
    assert (target.host, target.port, target.base_path, target.tls) == (
        "example.com",
        443,
        "/prefix",
        True,
    )
    assert target.safe_url == "https://example.com:443/prefix"
    assert "pw" not in target.safe_url
    plain = Target("http://localhost:8080", "ollama")
    assert (plain.port, plain.base_path, plain.tls) == (8080, "", False)
    assert Target("http://h", "ollama").port == 80


@pytest.mark.parametrize("url", ["ftp://host", "host:80", "http://"])
def test_target_refuses_urls_that_are_not_http(url):
    with pytest.raises(ValueError, match="http"):
        Target(url, "ollama")


def test_target_refuses_an_unknown_api_and_timeout():
    with pytest.raises(ValueError, match="api"):
        Target("http://h", "vllm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        Target("http://h", "ollama", timeout=0)


# --- build_request -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "chat", "path"),
    [
        ("ollama", True, "/api/chat"),
        ("ollama", False, "/api/generate"),
        ("openai", True, "/v1/chat/completions"),
        ("openai", False, "/v1/completions"),
    ],
)
def test_build_request_picks_the_endpoint(api, chat, path):
    target = Target("http://h:1/base", api, chat=chat)
    got_path, body = build_request(target, "m", TEXT, SAMPLING)
    assert got_path == "/base" + path
    data = json.loads(body)
    assert data["model"] == "m"
    assert data["stream"] is True
    if chat:
        assert data["messages"] == [{"role": "user", "content": "Why?"}]
    else:
        assert data["prompt"] == "Why?"


def test_build_request_ollama_options_and_keep_alive():
    target = Target("http://h:1", "ollama", chat=True)
    _, body = build_request(target, "m", CHAT, SAMPLING, keep_alive="5m")
    data = json.loads(body)
    assert data["options"] == {"temperature": 0.5, "seed": 7, "num_predict": 64}
    assert data["keep_alive"] == "5m"
    assert "keep_alive" not in json.loads(build_request(target, "m", CHAT, SAMPLING)[1])


def test_build_request_openai_sampling_and_usage():
    target = Target("http://h:1", "openai", chat=False)
    _, body = build_request(target, "m", CHAT, SAMPLING, keep_alive=0)
    data = json.loads(body)
    assert data["prompt"] == "Why?"  # a chat prompt joined for the text endpoint
    assert (data["max_tokens"], data["temperature"], data["seed"]) == (64, 0.5, 7)
    assert data["stream_options"] == {"include_usage": True}
    assert "keep_alive" not in data


def test_build_request_keeps_unicode_readable():
    _, body = build_request(Target("http://h:1", "ollama"), "m", Prompt("z", text="天空"), SAMPLING)
    assert "天空".encode() in body


# --- answers, as the servers write them -------------------------------------------------------

GENERATE = [
    {"model": "m", "response": "Hel", "done": False},
    {"model": "m", "response": "", "done": False},  # an empty chunk is no token
    {"model": "m", "response": "lo", "done": False},
    {"model": "m", "response": "!", "done": False},
    {
        "model": "m",
        "response": "",
        "done": True,
        "done_reason": "stop",
        "eval_count": 3,
        "eval_duration": 1_500_000_000,
        "prompt_eval_count": 12,
        "prompt_eval_duration": 250_000_000,
        "load_duration": 2_000_000,
    },
]
CHAT_THINKING = [
    {"message": {"role": "assistant", "content": "", "thinking": "hmm"}, "done": False},
    {"message": {"role": "assistant", "content": "Yes"}, "done": False},
    {"message": {"role": "assistant", "content": ""}, "done": True, "eval_count": 2},
]
OPENAI_CHAT = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]},
    {"choices": [{"index": 0, "delta": {"reasoning": "so"}}]},
    {"choices": [{"index": 0, "delta": {"content": " there"}}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}},
    "[DONE]",
]
ZERO = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
OPENAI_COMPLETIONS = [
    {"choices": [{"index": 0, "text": "a"}], "usage": ZERO},
    {"choices": [{"index": 0, "text": "b"}], "usage": ZERO},
    {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": ZERO},
    {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}},
    "[DONE]",
]
TIMINGS = {"prompt_n": 5, "prompt_ms": 40.0, "predicted_n": 7, "predicted_ms": 350.0}


def ndjson_parts(lines: list[dict[str, Any]]) -> list[bytes]:
    return [(json.dumps(line) + "\n").encode() for line in lines]


def sse_parts(events: list[dict[str, Any] | str]) -> list[bytes]:
    return [sse(event).encode() for event in events]


def content_ends(parts: list[bytes], contents: list[bool]) -> list[int]:
    """Offsets of the last byte of each part that carries content (where it is recognised)."""
    ends, offset = [], 0
    for part, has_content in zip(parts, contents, strict=True):
        offset += len(part)
        if has_content:
            ends.append(offset - 1)
    return ends


def read(api: str, body: bytes, *pieces_at: tuple[int, float]) -> AnswerReader:
    """Feed `body` cut at the given offsets, each piece stamped with its time; close at 9."""
    reader = AnswerReader(api)  # type: ignore[arg-type]
    cuts = [0, *(cut for cut, _ in pieces_at), len(body)]
    times = [0.5, *(at for _, at in pieces_at)]
    for (low, high), at in zip(itertools.pairwise(cuts), times, strict=True):
        reader.feed(body[low:high], at)
    reader.close(9.0)
    return reader


CASES = {
    "generate": ("ollama", ndjson_parts(GENERATE), [True, False, True, True, False]),
    "chat-thinking": ("ollama", ndjson_parts(CHAT_THINKING), [True, True, False]),
    "openai-chat": ("openai", sse_parts(OPENAI_CHAT), [True, True, True, False, False, False]),
    "openai-completions": (
        "openai",
        sse_parts(OPENAI_COMPLETIONS),
        [True, True, False, False, False],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reader_gives_the_same_answer_at_every_split_point(case):
    api, parts, contents = CASES[case]
    body = b"".join(parts)
    ends = content_ends(parts, contents)
    whole = read(api, body).record(0.0, 10.0, 200)
    for cut in range(len(body) + 1):
        reader = read(api, body, (cut, 1.0))
        record = reader.record(0.0, 10.0, 200)
        expected = tuple(0.5 if end < cut else 1.0 for end in ends)
        assert record.chunk_times == expected, cut
        assert record.first_token == expected[0]
        assert record.ok, (cut, record.error)
        assert (record.output_tokens, record.prompt_tokens) == (
            whole.output_tokens,
            whole.prompt_tokens,
        )
        assert record.decode_seconds == whole.decode_seconds


@pytest.mark.parametrize("case", sorted(CASES))
def test_reader_byte_by_byte_and_with_crlf(case):
    api, parts, contents = CASES[case]
    body = b"".join(parts)
    reader = AnswerReader(api)  # type: ignore[arg-type]
    for index in range(len(body)):
        reader.feed(body[index : index + 1], float(index))
    reader.close(float(len(body)))
    assert tuple(reader.chunk_times) == tuple(float(e) for e in content_ends(parts, contents))
    crlf = read(api, body.replace(b"\n", b"\r\n")).record(0.0, 1.0, 200)
    assert crlf.ok
    assert len(crlf.chunk_times) == sum(contents)


def test_ollama_counters_are_read_from_the_final_chunk():
    record = read("ollama", b"".join(ndjson_parts(GENERATE))).record(0.0, 2.0, 200, "m", "p")
    assert record.ok
    assert (record.output_tokens, record.output_source) == (3, "ollama")
    assert (record.prompt_tokens, record.prompt_source) == (12, "ollama")
    assert record.decode_seconds == pytest.approx(1.5)
    assert record.prefill_seconds == pytest.approx(0.25)
    assert record.load_seconds == pytest.approx(0.002)
    assert record.timing_source == "ollama"
    assert (record.model, record.prompt_id, record.warmup) == ("m", "p", False)


def test_ollama_final_chunk_without_counters_falls_back_to_the_client_count():
    lines = [{"response": "a", "done": False}, {"response": "b", "done": False}, {"done": True}]
    record = read("ollama", b"".join(ndjson_parts(lines))).record(0.0, 1.0, 200)
    assert record.ok
    assert (record.output_tokens, record.output_source) == (2, "client")
    assert record.prompt_tokens is None
    assert record.prompt_source is None
    assert record.timing_source is None


def test_thinking_counts_as_the_first_token():
    parts = ndjson_parts(CHAT_THINKING)
    reader = read("ollama", b"".join(parts), (len(parts[0]), 1.0))
    assert reader.first_token == 0.5  # the thinking-only chunk, before any content
    assert reader.chunk_times == [0.5, 1.0]


def test_openai_usage_counts_and_zero_usage_on_chunks_is_ignored():
    record = read("openai", b"".join(sse_parts(OPENAI_COMPLETIONS))).record(0.0, 1.0, 200)
    assert (record.output_tokens, record.output_source) == (2, "openai.usage")
    assert (record.prompt_tokens, record.prompt_source) == (4, "openai.usage")
    assert record.timing_source is None


def test_llamacpp_timings_win_for_durations_usage_for_counts():
    events = [*OPENAI_CHAT[:4], {**OPENAI_CHAT[4], "timings": TIMINGS}, "[DONE]"]
    record = read("openai", b"".join(sse_parts(events))).record(0.0, 1.0, 200)
    assert (record.output_tokens, record.output_source) == (3, "openai.usage")
    assert record.decode_seconds == pytest.approx(0.35)
    assert record.prefill_seconds == pytest.approx(0.04)
    assert record.load_seconds is None
    assert record.timing_source == "llamacpp.timings"
    only_timings = [*OPENAI_CHAT[:3], {**OPENAI_CHAT[3], "timings": TIMINGS}, "[DONE]"]
    record = read("openai", b"".join(sse_parts(only_timings))).record(0.0, 1.0, 200)
    assert (record.output_tokens, record.output_source) == (7, "llamacpp.timings")
    assert (record.prompt_tokens, record.prompt_source) == (5, "llamacpp.timings")


def test_openai_without_usage_counts_chunks():
    events = [*OPENAI_CHAT[:4], "[DONE]"]
    record = read("openai", b"".join(sse_parts(events))).record(0.0, 1.0, 200)
    assert (record.output_tokens, record.output_source) == (3, "client")


def test_sse_comments_ids_and_multiline_data_are_understood():
    body = (
        b": keep-alive comment\n\nid: 1\nretry: 10\n"
        b'data: {"choices": [{"delta":\ndata: {"content": "x"}}]}\n\n'
        b"data: [DONE]\n\n"
    )
    record = read("openai", body).record(0.0, 1.0, 200)
    assert record.ok
    assert record.chunk_times == (0.5,)


def test_last_line_without_newline_is_read_on_close():
    body = b"".join(ndjson_parts(GENERATE)).rstrip(b"\n")
    reader = AnswerReader("ollama")
    reader.feed(body, 1.0)
    assert not reader.done
    reader.close(2.0)
    assert reader.done
    event = sse("[DONE]").encode().rstrip(b"\n")
    sse_reader = AnswerReader("openai")
    sse_reader.feed(event, 1.0)
    sse_reader.close(2.0)
    assert sse_reader.done


# --- errors ------------------------------------------------------------------------------------


def test_ollama_midstream_error_line_fails_the_request():
    lines = [*GENERATE[:2], {"error": "an error was encountered while running the model"}]
    for cut in range(0, 120, 7):
        record = read("ollama", b"".join(ndjson_parts(lines)), (cut, 1.0)).record(0.0, 1.0, 200)
        assert not record.ok
        assert record.error == "an error was encountered while running the model"
        assert record.output_tokens == 1


def test_sse_error_event_and_error_object_fail_the_request():
    body = sse({"choices": [{"delta": {"content": "a"}}]}).encode()
    body += b'event: error\ndata: {"message": "boom"}\n\n'
    record = read("openai", body).record(0.0, 1.0, 200)
    assert (record.ok, record.error) == (False, "boom")
    body = sse({"error": {"message": "bad thing", "type": "api_error"}}).encode()
    assert read("openai", body).record(0.0, 1.0, 200).error == "bad thing"


def test_a_stream_without_a_final_chunk_is_not_ok():
    # Ollama's OpenAI layer turns a mid-stream error into an empty chunk and no [DONE] (§4.4)
    events = OPENAI_CHAT[:3]
    record = read("openai", b"".join(sse_parts(events))).record(0.0, 1.0, 200)
    assert not record.ok
    assert record.error == "answer ended without a final chunk"
    assert record.output_tokens == 3
    assert record.output_source == "client"


def test_malformed_lines_are_errors_escaped():
    body = b'{"response": "a", "done": false}\nnot json \x1b[31m\n'
    record = read("ollama", body).record(0.0, 1.0, 200)
    assert not record.ok
    assert record.error is not None
    assert record.error.startswith("answer line is not JSON")
    assert "\x1b" not in record.error
    assert "\\x1b" in record.error


def test_failed_status_takes_the_error_text_from_the_body():
    reader = AnswerReader("ollama")
    reader.feed_error(b'{"error": "model \'x\' not found"}')
    reader.close(1.0)
    record = reader.record(0.0, 1.0, 404, "x", "p")
    assert (record.ok, record.status) == (False, 404)
    assert record.error == "HTTP 404: model 'x' not found"
    openai = AnswerReader("openai")
    openai.feed_error(b'{"error": {"message": "no key", "type": "api_error"}}')
    assert openai.record(0.0, 1.0, 401).error == "HTTP 401: no key"
    empty = AnswerReader("ollama").record(0.0, 1.0, 403)
    assert empty.error == "HTTP 403"


def test_error_texts_are_escaped_and_cut():
    long_body = b'{"error": "' + b"x" * 5000 + b'\\n"}'
    text = error_text(long_body)
    assert len(text) == 200
    assert text.endswith("…")
    assert error_text(b"plain\ntext") == "plain\\ntext"
    reader = AnswerReader("ollama")
    reader.feed_error(b"y" * 5000)
    record = reader.record(0.0, 1.0, 500)
    assert record.error is not None
    assert len(record.error) <= 210


def test_client_failure_wins_and_no_status_means_no_answer():
    reader = AnswerReader("ollama")
    reader.feed(ndjson_parts(GENERATE)[0], 1.0)
    record = reader.record(0.0, 2.0, 200, failure="TimeoutError: no end\x00")
    assert (record.ok, record.error) == (False, "TimeoutError: no end\\x00")
    assert record.first_token == 1.0
    assert AnswerReader("openai").record(0.0, 1.0, None).error == "no answer"


def test_a_runaway_line_is_refused():
    reader = AnswerReader("ollama")
    for _ in range(3):
        reader.feed(b"x" * (600 * 1024), 1.0)
    reader.close(2.0)
    assert reader.error is not None
    assert "longer than" in reader.error


@pytest.mark.parametrize(
    "counters",
    [
        {"eval_count": 10**400, "eval_duration": 10**400},
        {"eval_count": -5, "eval_duration": -1},
        {"eval_count": 3.5, "eval_duration": float("nan")},
        {"eval_count": True, "eval_duration": float("inf")},
    ],
)
def test_absurd_server_counters_count_as_unreported(counters):
    lines = [
        {"message": {"role": "assistant", "content": "a"}, "done": False},
        {"message": {"role": "assistant", "content": "b"}, "done": False},
        {"message": {"role": "assistant", "content": ""}, "done": True, **counters},
    ]
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    reader = AnswerReader("ollama")
    reader.feed(body, 1.0)
    reader.close(2.0)
    record = reader.record(0.0, 2.0, 200)
    assert record.output_tokens == 2  # the client's count of chunks, labelled as such
    assert record.output_source == "client"
    assert record.decode_seconds is None
    assert record.tpot is not None  # a finite value, never an overflow


def test_the_first_final_event_ends_an_sse_answer():
    events = [
        {"choices": [{"index": 0, "delta": {"content": "a"}}]},
        {"choices": [], "usage": {"completion_tokens": 1, "prompt_tokens": 3}},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    later = {"choices": [], "usage": {"completion_tokens": 50, "prompt_tokens": 3}}
    body += b"data: [DONE]\n\n" + b"data: " + json.dumps(later).encode() + b"\n\n"
    reader = AnswerReader("openai", max_tokens=16)
    reader.feed(body, 1.0)
    reader.close(2.0)
    record = reader.record(0.0, 2.0, 200)
    assert (record.ok, record.error) == (False, "answer went on after its final chunk")
    assert (record.output_tokens, record.output_source) == (1, "openai.usage")


@pytest.mark.parametrize(("reported", "ok"), [(16, True), (24, True), (25, False), (10**12, False)])
def test_a_server_count_above_what_was_asked_fails_the_answer(reported: int, ok: bool):
    events = [
        {"choices": [{"index": 0, "delta": {"content": "a"}}]},
        {"choices": [], "usage": {"completion_tokens": reported, "prompt_tokens": 3}},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    reader = AnswerReader("openai", max_tokens=16)  # 16 + 8 allowed
    reader.feed(body + b"data: [DONE]\n\n", 1.0)
    reader.close(2.0)
    record = reader.record(0.0, 2.0, 200)
    assert record.ok is ok
    if not ok:
        assert record.error == f"the server reported {reported} output tokens for at most 16 asked"


def test_rates_that_overflow_are_missing_not_infinite():
    record = RequestRecord(
        0.0, 1.0, True, 200, None, 0.5, (0.5, 0.6), 10**12, "ollama",
        prompt_tokens=10**12, prompt_source="ollama", decode_seconds=5e-324,
        prefill_seconds=5e-324, timing_source="ollama",
    )  # fmt: skip
    assert record.prefill_rate is None
    decode = record.decode_rate
    assert decode is not None
    assert decode[1] == "client"
