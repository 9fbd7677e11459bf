"""The OpenAI Files and Batch APIs: `/v1/files` and `/v1/batches` (docs/batch.md).

Files and batches belong to the key that made them: every other key gets the same 404 as for
an id that does not exist. Errors are OpenAI error objects (`gateway.errors.speaks_openai`).
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from gateway.api.body import parse_json
from gateway.api.openai.routes import Completions, Embeddings
from gateway.auth.dependencies import PrincipalDep, require_principal
from gateway.auth.principal import Principal
from gateway.batch.runner import BatchRunner
from gateway.batch.store import BatchStore, UnknownCursorError, parse_window
from gateway.batch.validate import check_input
from gateway.deps import SettingsDep
from gateway.errors import BadRequestError, NotFoundError, RateLimitedError
from gateway.relay.body import read_body
from gateway.relay.surface import Endpoint
from gateway.settings import Settings

#: The endpoints a batch may run, with the parser and codec each line goes through.
ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Completions("/v1/chat/completions", chat=True),
    "/v1/completions": Completions("/v1/completions", chat=False),
    "/v1/embeddings": Embeddings(),
}

router = APIRouter(prefix="/v1", dependencies=[Depends(require_principal)])


async def get_batches(request: Request) -> BatchStore:
    """The batch store the lifespan opened."""
    store: BatchStore = request.state.batches
    return store


async def get_runner(request: Request) -> BatchRunner | None:
    """This process's batch runner, if it runs lines."""
    runner: BatchRunner | None = request.state.batch_runner
    return runner


BatchesDep = Annotated[BatchStore, Depends(get_batches)]
RunnerDep = Annotated[BatchRunner | None, Depends(get_runner)]
LimitQuery = Annotated[int, Query(ge=1, le=10_000)]


def _json_object(raw: bytes) -> dict[str, Any]:
    # A batch's fields are flat (`metadata` holds strings): a few levels suffice.
    try:
        value = parse_json(raw, max_depth=8, max_values=10_000)
    except ValueError as exc:
        raise BadRequestError(f"the body {exc}") from exc
    if not isinstance(value, dict):
        raise BadRequestError("the body must be a JSON object")
    return value


@router.post("/files")
async def upload_file(
    request: Request, principal: PrincipalDep, store: BatchesDep, settings: SettingsDep
) -> dict[str, Any]:
    """Upload a batch input (multipart: `file`, `purpose=batch`); OpenAI's file object.

    Raises:
        PayloadTooLargeError: over `GATEWAY_BATCH_MAX_FILE_BYTES` (413).
        BadRequestError: not multipart, no file, a purpose other than `batch`, or the key's
            files would pass `GATEWAY_BATCH_MAX_STORED_BYTES_PER_KEY` (400).
    """
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadRequestError("send the file as multipart/form-data")
    async with store.heavy:  # a few uploads at once: each holds the file several times
        return await _store_upload(request, principal, store, settings)


async def _store_upload(
    request: Request, principal: Principal, store: BatchStore, settings: Settings
) -> dict[str, Any]:
    """Read, check and store one upload (under `store.heavy`); see `upload_file`."""
    raw = await read_body(request, settings.batch_max_file_bytes + 64 * 1024)

    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=1, max_fields=10)
    except Exception as exc:  # python-multipart's errors: a malformed body
        raise BadRequestError("the multipart body could not be read") from exc
    upload = form.get("file")
    purpose = form.get("purpose")
    if not isinstance(upload, UploadFile):
        raise BadRequestError("the form has no file field 'file'")
    if purpose != "batch":
        raise BadRequestError("purpose must be 'batch'")
    content = await upload.read()
    await form.close()
    if len(content) > settings.batch_max_file_bytes:
        raise BadRequestError(f"the file is larger than {settings.batch_max_file_bytes} bytes")
    quota = settings.batch_max_stored_bytes_per_key
    held = await store.stored_bytes(principal.key_id)
    if held + len(content) > quota:
        raise BadRequestError(
            f"this key's files would hold {held + len(content)} bytes, over its {quota}: "
            "delete files it no longer needs (DELETE /v1/files/{id})"
        )
    record = await store.create_file(principal.key_id, _filename(upload.filename), "batch", content)
    return record.as_openai()


@router.get("/files")
async def list_files(
    principal: PrincipalDep,
    store: BatchesDep,
    purpose: str | None = None,
    limit: LimitQuery = 10_000,
    after: str | None = None,
) -> dict[str, Any]:
    """The key's files, newest first (OpenAI's list shape).

    Raises:
        BadRequestError: `after` names none of the key's files (400).
    """
    try:
        files, more = await store.list_files(
            principal.key_id, purpose=purpose, limit=limit, after=after
        )
    except UnknownCursorError:
        raise _unknown_cursor("file") from None
    return _list_page([f.as_openai() for f in files], more)


@router.get("/files/{file_id}")
async def get_file(file_id: str, principal: PrincipalDep, store: BatchesDep) -> dict[str, Any]:
    """One of the key's files.

    Raises:
        NotFoundError: no such file, or another key's (404).
    """
    record = await store.get_file(principal.key_id, file_id)
    if record is None:
        raise NotFoundError(f"No such File object: {file_id}")
    return record.as_openai()


@router.get("/files/{file_id}/content")
async def file_content(file_id: str, principal: PrincipalDep, store: BatchesDep) -> Response:
    """A file's bytes (JSONL)."""
    content = await store.file_content(principal.key_id, file_id)
    if content is None:
        raise NotFoundError(f"No such File object: {file_id}")
    return Response(content, media_type="application/jsonl")


@router.delete("/files/{file_id}")
async def delete_file(file_id: str, principal: PrincipalDep, store: BatchesDep) -> dict[str, Any]:
    """Delete one of the key's files."""
    if not await store.delete_file(principal.key_id, file_id):
        raise NotFoundError(f"No such File object: {file_id}")
    return {"id": file_id, "object": "file", "deleted": True}


@router.post("/batches")
async def create_batch(
    request: Request,
    principal: PrincipalDep,
    store: BatchesDep,
    runner: RunnerDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """Create a batch from an uploaded file; every line is checked first (docs/batch.md).

    A file that fails the checks makes a `failed` batch with its `errors` (200, as OpenAI).

    Raises:
        BadRequestError: a missing or wrong `input_file_id`, `endpoint`, `completion_window`
            or `metadata` (400).
        RateLimitedError: the key's queued lines would pass
            `GATEWAY_BATCH_MAX_QUEUED_LINES_PER_KEY` (429).
    """
    body = _json_object(await read_body(request, 64 * 1024))
    endpoint_path = body.get("endpoint")
    if endpoint_path not in ENDPOINTS:
        raise BadRequestError(f"endpoint must be one of {', '.join(ENDPOINTS)}")
    window = body.get("completion_window")
    seconds = parse_window(window) if isinstance(window, str) else None
    if seconds is None or not isinstance(window, str):
        raise BadRequestError(
            "completion_window must be '24h', or a shorter window as <n>s, <n>m or <n>h"
            " (at most 24 hours)"
        )
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= 64
            and len(v) <= 512
            and "\x00" not in k + v
            for k, v in metadata.items()
        )
    ):
        raise BadRequestError("metadata: at most 16 string pairs (keys 64, values 512 chars)")
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str):
        raise BadRequestError("input_file_id is required")
    record = await store.get_file(principal.key_id, file_id)
    if record is None or record.purpose != "batch":
        raise BadRequestError(f"input_file_id {file_id!r} is not one of this key's batch files")
    async with store.heavy:  # a few at once: the file and its checked lines are in memory
        content = await store.file_content(principal.key_id, file_id) or b""
        # Every line is parsed and checked: up to a second for a large file, off the event loop.
        lines, errors = await anyio.to_thread.run_sync(
            functools.partial(
                check_input,
                content,
                endpoint_path=endpoint_path,
                endpoint=ENDPOINTS[endpoint_path],
                principal=principal,
                settings=settings,
            )
        )
        del content
        quota = settings.batch_max_queued_lines_per_key
        queued = 0 if errors else await store.queued_lines(principal.key_id)
        if queued + len(lines) > quota:
            raise RateLimitedError(
                f"this key has {queued} batch lines waiting; {len(lines)} more would pass its "
                f"{quota}: wait for its batches to finish",
                headers={"Retry-After": "60"},
            )
        batch = await store.create_batch(
            principal.key_id,
            endpoint=endpoint_path,
            input_file_id=file_id,
            window=window,
            window_seconds=seconds,
            metadata=metadata,
            lines=lines,
            errors=errors,
        )
    if runner is not None:
        runner.wake()
    return batch


@router.get("/batches")
async def list_batches(
    principal: PrincipalDep,
    store: BatchesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> dict[str, Any]:
    """The key's batches, newest first, `limit` at a time after `after` (cursor paging).

    Raises:
        BadRequestError: `after` names none of the key's batches (400).
    """
    try:
        data, more = await store.list_batches(principal.key_id, limit=limit, after=after)
    except UnknownCursorError:
        raise _unknown_cursor("batch") from None
    return _list_page(data, more)


@router.get("/batches/{batch_id}")
async def get_batch(batch_id: str, principal: PrincipalDep, store: BatchesDep) -> dict[str, Any]:
    """One of the key's batches, with its `request_counts`."""
    batch = await store.get_batch(principal.key_id, batch_id)
    if batch is None:
        raise NotFoundError(f"No such Batch object: {batch_id}")
    return batch


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(
    batch_id: str, principal: PrincipalDep, store: BatchesDep, runner: RunnerDep
) -> dict[str, Any]:
    """Cancel a batch: no new line starts, running ones finish, partial results are kept."""
    batch = await store.cancel(principal.key_id, batch_id)
    if batch is None:
        raise NotFoundError(f"No such Batch object: {batch_id}")
    if runner is not None:
        runner.wake()
    return batch


@router.get("/batches/{batch_id}/events")
async def batch_events(
    batch_id: str,
    principal: PrincipalDep,
    store: BatchesDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    """The batch's own log (a gateway extension): retries, failures, state changes."""
    events = await store.events(principal.key_id, batch_id, limit)
    if events is None:
        raise NotFoundError(f"No such Batch object: {batch_id}")
    return {"object": "list", "data": events}


def _list_page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's list envelope: `data`, `first_id`, `last_id` (None when empty), `has_more`."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def _unknown_cursor(kind: str) -> BadRequestError:
    """The 400 for an `after` that names no object of the key (OpenAI's `param: after`)."""
    return BadRequestError(
        f"after: no such {kind} (deleted, or never listed to this key); list from the start"
    )


def _filename(name: str | None) -> str:
    """The upload's name as stored: printable characters only (no NUL, no control codes)."""
    kept = "".join(ch for ch in name or "" if ch.isprintable())
    return kept or "upload.jsonl"
