"""The OpenAI Files and Batch APIs: `/v1/files` and `/v1/batches` (docs/batch.md).

Files and batches belong to the key that made them: every other key gets the same 404 as for
an id that does not exist. Errors are OpenAI error objects (`gateway.errors.speaks_openai`).

Over ~300 lines for one reason: the two APIs' endpoints share admission (`_admitted`),
paging and error helpers; one router per API would duplicate them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from gateway.api.auth import PrincipalDep, require_principal
from gateway.api.openai.routes import Completions, Embeddings
from gateway.api.responses.routes import Responses
from gateway.auth.principal import Principal
from gateway.batch.batches import BatchStore, parse_window
from gateway.batch.files import FileGoneError, FileStore
from gateway.batch.records import UnknownCursorError
from gateway.batch.runner import BatchRunner
from gateway.batch.upload import read_form
from gateway.batch.validate import InputChecker
from gateway.deps import RelayDep, SettingsDep
from gateway.errors import BadRequestError, NotFoundError, RateLimitedError
from gateway.policies import UploadLimits
from gateway.relay.pipeline import Relay
from gateway.relay.surface import Endpoint
from gateway.settings import Settings
from gateway.wire.body import read_body
from gateway.wire.json import parse_json

#: The endpoints a batch may run, with the parser and codec each line goes through.
ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Completions("/v1/chat/completions", chat=True),
    "/v1/completions": Completions("/v1/completions", chat=False),
    "/v1/embeddings": Embeddings(),
    "/v1/responses": Responses(),
}

logger = logging.getLogger("gateway.batch")

router = APIRouter(prefix="/v1", dependencies=[Depends(require_principal)])


async def get_files(request: Request) -> FileStore:
    """The file store the lifespan opened."""
    files: FileStore = request.state.files
    return files


async def get_batches(request: Request) -> BatchStore:
    """The batch store the lifespan opened."""
    store: BatchStore = request.state.batches
    return store


async def get_runner(request: Request) -> BatchRunner | None:
    """This process's batch runner, if it runs lines."""
    runner: BatchRunner | None = request.state.batch_runner
    return runner


FilesDep = Annotated[FileStore, Depends(get_files)]
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
    request: Request,
    principal: PrincipalDep,
    files: FilesDep,
    settings: SettingsDep,
    relay: RelayDep,
) -> dict[str, Any]:
    """Upload a batch input (multipart: `file`, `purpose=batch`); OpenAI's file object.

    Counts against the key's RPM and in-flight limits; one upload per key at a time.

    Raises:
        PayloadTooLargeError: over `GATEWAY_BATCH_MAX_FILE_BYTES` + 64 KiB (413).
        BadRequestError: not multipart, no file, a purpose other than `batch`, a file over
            `GATEWAY_BATCH_MAX_FILE_BYTES`, or the key's files would pass
            `GATEWAY_BATCH_MAX_STORED_BYTES_PER_KEY` (400).
        UploadTooSlowError: the body came slower than
            `GATEWAY_BATCH_UPLOAD_MIN_BYTES_PER_SECOND` (408).
        RateLimitedError: the key's limits, or an upload of the key's in progress (429).
        ServiceUnavailableError: every upload slot of the process stayed taken (503).
    """
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadRequestError("send the file as multipart/form-data")
    async with _admitted(relay, principal), files.uploads.slot(principal.key_id):
        return await _store_upload(request, principal, files, settings)


async def _store_upload(
    request: Request, principal: Principal, files: FileStore, settings: Settings
) -> dict[str, Any]:
    """Receive, check and store one upload (under an upload slot); see `upload_file`."""
    upload, purpose, form = await read_form(request, UploadLimits.of(settings))
    try:
        if purpose != "batch":
            raise BadRequestError("purpose must be 'batch'")
        size = upload.size
        if size is None:  # not counted while parsing: the spooled file's end is its size
            size = await anyio.to_thread.run_sync(upload.file.seek, 0, 2)
            await upload.seek(0)
        if size > settings.batch_max_file_bytes:
            raise BadRequestError(f"the file is larger than {settings.batch_max_file_bytes} bytes")
        quota = settings.batch_max_stored_bytes_per_key
        held = await files.stored_bytes(principal.key_id)
        if held + size > quota:
            raise BadRequestError(
                f"this key's files would hold {held + size} bytes, over its {quota}: "
                "delete files it no longer needs (DELETE /v1/files/{id})"
            )
        content = await upload.read()  # once, from the spooled file: what the store writes
    finally:
        await form.close()
    record = await files.create_file(principal.key_id, _filename(upload.filename), "batch", content)
    return record.as_openai()


@router.get("/files")
async def list_files(
    principal: PrincipalDep,
    files: FilesDep,
    relay: RelayDep,
    purpose: str | None = None,
    limit: LimitQuery = 10_000,
    after: str | None = None,
) -> dict[str, Any]:
    """The key's files, newest first (OpenAI's list shape).

    Raises:
        BadRequestError: `after` names none of the key's files (400).
    """
    try:
        async with _admitted(relay, principal):
            found, more = await files.list_files(
                principal.key_id, purpose=purpose, limit=limit, after=after
            )
    except UnknownCursorError:
        raise _unknown_cursor("file") from None
    return _list_page([f.as_openai() for f in found], more)


@router.get("/files/{file_id}")
async def get_file(
    file_id: str, principal: PrincipalDep, files: FilesDep, relay: RelayDep
) -> dict[str, Any]:
    """One of the key's files.

    Raises:
        NotFoundError: no such file, or another key's (404).
    """
    async with _admitted(relay, principal):
        record = await files.get_file(principal.key_id, file_id)
    if record is None:
        raise NotFoundError(f"No such File object: {file_id}")
    return record.as_openai()


@router.get("/files/{file_id}/content")
async def file_content(
    file_id: str, principal: PrincipalDep, files: FilesDep, relay: RelayDep
) -> Response:
    """A file's bytes (JSONL), streamed."""
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(_admitted(relay, principal))
        record = await files.get_file(principal.key_id, file_id)
        if record is None:
            raise NotFoundError(f"No such File object: {file_id}")
        await stack.enter_async_context(files.downloads.slot(principal.key_id))
        # The admission and the slot are the response's from here: held until it ends.
        return FileDownload(
            files.content(record), record.size, stack.pop_all(), relay.settings.idle_timeout
        )
    raise AssertionError("unreachable")  # pragma: no cover - mypy: the block returns


@router.delete("/files/{file_id}")
async def delete_file(
    file_id: str, principal: PrincipalDep, files: FilesDep, relay: RelayDep
) -> dict[str, Any]:
    """Delete one of the key's files."""
    async with _admitted(relay, principal):
        deleted = await files.delete_file(principal.key_id, file_id)
    if not deleted:
        raise NotFoundError(f"No such File object: {file_id}")
    return {"id": file_id, "object": "file", "deleted": True}


@router.post("/batches")
async def create_batch(
    request: Request,
    principal: PrincipalDep,
    files: FilesDep,
    store: BatchesDep,
    runner: RunnerDep,
    settings: SettingsDep,
    relay: RelayDep,
) -> dict[str, Any]:
    """Create a batch from an uploaded file; every line is checked first (docs/batch.md).

    A file that fails the checks makes a `failed` batch with its `errors` (200, as OpenAI).

    Raises:
        BadRequestError: a missing or wrong `input_file_id`, `endpoint`, `completion_window`
            or `metadata` (400).
        RateLimitedError: the key's queued lines would pass
            `GATEWAY_BATCH_MAX_QUEUED_LINES_PER_KEY`, its RPM or in-flight limit, or a batch
            creation of the key's in progress (429).
        ServiceUnavailableError: every batch creation slot of the process stayed taken (503).
    """
    async with _admitted(relay, principal):
        batch = await _create_batch(request, principal, files, store, settings)
    if runner is not None:
        runner.wake()
    return batch


async def _create_batch(
    request: Request,
    principal: Principal,
    files: FileStore,
    store: BatchStore,
    settings: Settings,
) -> dict[str, Any]:
    """Check the request and the file's every line, then create the batch; see `create_batch`."""
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
    record = await files.get_file(principal.key_id, file_id)
    if record is None or record.purpose != "batch":
        raise BadRequestError(f"input_file_id {file_id!r} is not one of this key's batch files")
    async with store.checks.slot(principal.key_id):  # the checked lines are in memory
        checker = InputChecker(
            endpoint_path=endpoint_path,
            endpoint=ENDPOINTS[endpoint_path],
            principal=principal,
            settings=settings,
        )
        try:
            async with aclosing(files.content(record)) as parts:
                async for part in parts:
                    # Off the event loop, a piece at a time: the GIL changes hands between
                    # lines, and no single step is bigger than one line's parse.
                    await anyio.to_thread.run_sync(checker.feed, part)
        except FileGoneError:
            raise BadRequestError(f"input_file_id {file_id!r} was deleted") from None
        lines, errors = await anyio.to_thread.run_sync(checker.finish)
        quota = settings.batch_max_queued_lines_per_key
        queued = 0 if errors else await store.queued_lines(principal.key_id)
        if queued + len(lines) > quota:
            raise RateLimitedError(
                f"this key has {queued} batch lines waiting; {len(lines)} more would pass its "
                f"{quota}: wait for its batches to finish",
                headers={"Retry-After": "60"},
            )
        return await store.create_batch(
            principal.key_id,
            endpoint=endpoint_path,
            input_file_id=file_id,
            window=window,
            window_seconds=seconds,
            metadata=metadata,
            lines=lines,
            errors=errors,
        )


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


@asynccontextmanager
async def _admitted(relay: Relay, principal: Principal) -> AsyncIterator[None]:
    """Count the request against the key's RPM and in-flight limits for the block.

    The Files and Batch APIs' writes and reads of file bytes cost the gateway memory, disk and
    CPU: they count like any other request (they did not, and one key listed 7.2 GB).

    Raises:
        RateLimitedError: the key's RPM or in-flight limit is reached (429).
    """
    admission = await relay.limiter.admit(principal)
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await relay.limiter.release(admission, 0)


class FileDownload(StreamingResponse):
    """A file's bytes as they are read, `Content-Length` set; `done` closes when it ends.

    `done` (the request's admission and download slot) is closed however the response ends,
    sent, cut short or never started: a `StreamingResponse`'s body iterator alone may never
    run its `finally` on a disconnect. A client that reads nothing for `idle` seconds (each
    piece waits that long at most for the socket to take it) has its download closed, so a
    download never read does not hold its slot forever.
    """

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        size: int,
        done: AsyncExitStack,
        idle: float,
    ) -> None:
        super().__init__(chunks, media_type="application/jsonl")
        self.headers["content-length"] = str(size)
        self._chunks = chunks
        self._done = done
        self._idle = idle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the file, then release what the download held."""

        async def write(message: Message) -> None:
            with anyio.fail_after(self._idle):
                await send(message)

        try:
            await super().__call__(scope, receive, write)
        except TimeoutError:
            logger.warning("client read nothing for %g s; its download is closed", self._idle)
        finally:
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()
                await self._done.aclose()
