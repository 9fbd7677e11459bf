"""OpenAI's shapes of the Batch API's rows: the batch object, its log entries, result lines.

Pure functions of rows already read: no database access here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from gateway.db.tables import BatchEventRow, BatchRow


def timestamp(moment: datetime | None) -> int | None:
    """`moment` as Unix seconds (OpenAI's timestamps), None for None."""
    return None if moment is None else int(moment.timestamp())


def batch_object(row: BatchRow, counts: dict[str, int]) -> dict[str, Any]:
    """OpenAI's batch object for `row`, its lines counted by state in `counts`."""
    done = counts.get("succeeded", 0)
    failed = counts.get("failed", 0)
    if row.status in ("cancelled", "expired"):
        failed = row.total - done  # the lines that never ran are in the error file
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "errors": None if not row.errors else {"object": "list", "data": row.errors},
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "created_at": timestamp(row.created_at),
        "in_progress_at": timestamp(row.in_progress_at),
        "expires_at": timestamp(row.expires_at),
        "finalizing_at": timestamp(row.finalizing_at),
        "completed_at": timestamp(row.completed_at),
        "failed_at": timestamp(row.failed_at),
        "expired_at": timestamp(row.expired_at),
        "cancelling_at": timestamp(row.cancelling_at),
        "cancelled_at": timestamp(row.cancelled_at),
        "request_counts": {"total": row.total, "completed": done, "failed": failed},
        "metadata": row.batch_metadata,
    }


def event_object(row: BatchEventRow) -> dict[str, Any]:
    """One entry of a batch's own log (`GET /v1/batches/{id}/events`)."""
    return {
        "at": timestamp(row.at),
        "event": row.event,
        "line": row.line_no,
        "custom_id": row.custom_id,
        "attempt": row.attempt,
        "status_code": row.status_code,
        "message": row.message,
    }


def result_line(batch_id: str, line: Any, final: str) -> tuple[bool, bytes]:
    """One result file line for a line row: (in the output file, the line's bytes)."""
    head = {"id": f"batch_req_{batch_id[6:]}_{line.line_no}", "custom_id": line.custom_id}
    answered = line.state == "succeeded" or (
        line.state == "failed" and line.status_code is not None and line.result
    )
    if answered:
        meta = {"status_code": line.status_code, "request_id": line.request_id}
        # The stored answer is JSON the gateway wrote (a relayed answer or an OpenAI error
        # object): raw CR and LF in valid JSON are only whitespace, so a space keeps it one
        # JSONL line without reading the rest of it.
        body = (line.result or b"null").replace(b"\r", b" ").replace(b"\n", b" ")
        text = (
            open_object(head)
            + b', "response": '
            + open_object(meta)
            + b', "body": '
            + body
            + b'}, "error": null}'
        )
        return line.state == "succeeded", text
    never_ran = {"cancelled": "batch_cancelled", "expired": "batch_expired"}.get(final)
    code = line.error_code if line.state == "failed" else never_ran
    message = (
        line.error_message
        if line.state == "failed"
        else {"cancelled": "the batch was cancelled", "expired": "the batch expired"}[final]
    )
    item = {**head, "response": None, "error": {"code": code or "error", "message": message or ""}}
    return False, json.dumps(item, ensure_ascii=False).encode()


def open_object(value: dict[str, Any]) -> bytes:
    """`value` as JSON without its closing brace, for more members to follow."""
    return json.dumps(value, ensure_ascii=False).encode()[:-1]
