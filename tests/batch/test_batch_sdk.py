"""The OpenAI Batch API through a real gateway with the real `openai` SDK, on both dialects.

Upload, create, poll, download the output and error files, list, cancel; other keys see 404.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator

import openai
import pytest

from tests.support.batch import (
    FAST,
    TEXT,
    batch_line,
    chat_line,
    read_jsonl,
    upload_lines,
    wait_batch,
)
from tests.support.client import MODEL_ALIAS as MODEL
from tests.support.metrics import metric_value
from tests.support.stack import Gateway


@pytest.fixture(params=["ollama", "openai"])
def gw(request: pytest.FixtureRequest, make_gateway: Callable[..., Gateway]) -> Gateway:
    """A gateway in front of the emulator, once per upstream dialect."""
    return make_gateway(upstream_dialect=request.param, **FAST)


@pytest.fixture
def client(gw: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0) as sdk:
        yield sdk


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_a_batch_runs_to_completion_and_its_output_is_in_openai_shape(
    client: openai.OpenAI, gw: Gateway
) -> None:
    file_id = upload_lines(client, [chat_line(f"req-{i}") for i in range(12)])
    assert client.files.retrieve(file_id).purpose == "batch"
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.status == "in_progress"
    done = wait_batch(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (12, 12)
    assert done.request_counts.failed == 0
    assert done.metadata == {"job": "nightly"}
    assert done.completed_at is not None
    assert done.in_progress_at is not None
    output = read_jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(12))
    for item in output:
        response = item["response"]
        assert isinstance(response, dict)
        assert response["status_code"] == 200
        assert response["body"]["choices"][0]["message"]["content"] == TEXT
        assert item["error"] is None
    assert done.error_file_id is None
    metrics = gw.metrics_text()
    assert metric_value(metrics, "gateway_batch_lines_total", outcome="succeeded") == 12
    assert metric_value(metrics, "gateway_requests_total", route="/v1/batches") == 12
    listed = client.batches.list(limit=5)
    assert [b.id for b in listed.data] == [batch.id]


def test_validation_fails_the_batch_with_line_numbers(client: openai.OpenAI) -> None:
    lines = [
        chat_line("a"),
        "{not json",
        json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}}),
        chat_line("a"),
        batch_line("b", {"model": MODEL, "prompt": "x"}, url="/v1/completions"),
        batch_line("c", {"model": MODEL, "messages": [], "stream": True}),
    ]
    file_id = upload_lines(client, lines)
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data is not None
    found = {(e.line, e.code) for e in batch.errors.data}
    assert (2, "invalid_json_line") in found
    assert (3, "missing_required_parameter") in found
    assert (4, "duplicate_custom_id") in found
    assert (5, "invalid_url") in found
    assert any(line == 6 for line, _ in found)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_another_key_sees_404_for_files_and_batches(client: openai.OpenAI, gw: Gateway) -> None:
    file_id = upload_lines(client, [chat_line("x")])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _, other_key = gw.create_key("other")
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=other_key, max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            other.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            other.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            other.batches.cancel(batch.id)
        with pytest.raises(openai.BadRequestError):
            other.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert other.files.list().data == []
        assert other.batches.list().data == []
    wait_batch(client, batch.id)
    client.files.delete(file_id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)


def test_a_disallowed_model_fails_validation(gw: Gateway) -> None:
    _, key = gw.create_key("narrow", models=["other-model"])
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0) as narrow:
        file_id = upload_lines(narrow, [chat_line("x")])
        batch = narrow.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert batch.status == "failed"
    assert batch.errors is not None
    assert batch.errors.data
    assert batch.errors.data[0].code == "model_not_allowed"
    assert batch.errors.data[0].line == 1


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_lists_page_newest_first_and_a_foreign_or_deleted_cursor_is_refused(
    client: openai.OpenAI, gw: Gateway
) -> None:
    files = [upload_lines(client, [chat_line(f"p{i}")]) for i in range(3)]
    batches = [
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for file_id in files
    ]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == batches[:0:-1]
    assert first.has_more is True
    rest = client.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data] == batches[:1]
    assert rest.has_more is False
    # The SDK's auto-paging follows last_id until has_more is false: each one once, in order.
    assert [b.id for b in client.batches.list(limit=1)] == batches[::-1]
    page = client.files.list(purpose="batch", limit=2)
    assert [f.id for f in page.data] == files[:0:-1]
    assert [f.id for f in client.files.list(purpose="batch", limit=2, after=files[1])] == files[:1]
    _, other_key = gw.create_key("other")
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=other_key, max_retries=0) as other:
        upload_lines(other, [chat_line("o")])
        # Someone else's object as a cursor gets the answer a deleted one gets: 400.
        with pytest.raises(openai.BadRequestError, match="after: no such file"):
            other.files.list(after=files[2])
        with pytest.raises(openai.BadRequestError, match="after: no such batch"):
            other.batches.list(after=batches[2])
    for batch_id in batches:
        wait_batch(client, batch_id)
    gone = client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="batch").id
    client.files.delete(gone)
    # Not the first page again (a paging client would loop): a clear 400.
    with pytest.raises(openai.BadRequestError, match="after: no such file"):
        client.files.list(after=gone)


def test_a_byte_order_mark_and_a_line_separator_in_a_string_are_read_as_json_lines(
    client: openai.OpenAI,
) -> None:
    """Windows editors start files with a BOM; U+2028 is legal unescaped inside JSON strings."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "one\u2028two\u0085three"}]}
    lines = [batch_line("a", body).replace("\\u2028", "\u2028").replace("\\u0085", "\u0085")]
    assert "\u2028" in lines[0]
    data = ("\ufeff" + "\r\n".join([*lines, chat_line("b")]) + "\r\n").encode()
    file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "in_progress", batch.errors
    done = wait_batch(client, batch.id)
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (2, 2)
