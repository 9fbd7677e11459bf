"""The OpenAI Batch API as a test drives it with the `openai` SDK: input lines, upload, wait."""

from __future__ import annotations

import io
import json
import time

import openai

from tests.support.client import MODEL_ALIAS

#: What the emulator generates by default, the content of each answer.
TEXT = "".join(f"tok{i} " for i in range(16))
#: Batch settings that make a test quick: poll, retry and lease in tenths of a second.
FAST = {"batch_poll_seconds": 0.1, "batch_retry_base_seconds": 0.05, "batch_lease_seconds": 3}


def batch_line(custom_id: str, body: dict[str, object], url: str = "/v1/chat/completions") -> str:
    """One line of a batch input file: a POST of `body` to `url`, named `custom_id`."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def chat_line(custom_id: str, model: str = MODEL_ALIAS) -> str:
    """A batch line asking `model` for a chat completion of "hi"."""
    return batch_line(custom_id, {"model": model, "messages": [{"role": "user", "content": "hi"}]})


def upload_lines(client: openai.OpenAI, lines: list[str]) -> str:
    """Upload `lines` as a batch input file; returns its file id."""
    data = ("\n".join(lines) + "\n").encode()
    return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def wait_batch(client: openai.OpenAI, batch_id: str, timeout: float = 30.0) -> openai.types.Batch:
    """The batch once it has ended (completed, failed, expired, cancelled), within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} did not end: {batch.status}")


def read_jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, object]]:
    """The lines of the file `file_id` (an output or error file), parsed; none for no file."""
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]
