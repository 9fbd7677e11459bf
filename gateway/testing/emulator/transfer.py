"""The emulator's long-running model routes: `POST /api/pull`, `/api/push`, `/api/create` (§6.7).

Owns their NDJSON progress streams, one `{"status": ...}` object a line every `inter_token`
seconds, with `digest`, `total` and `completed` on layer lines and zero fields omitted (Go
`omitempty`), ending in `{"status": "success"}`; the `stream: false` answer (`waitForStream`: the
last progress object, or the error with status 500, as `application/json`); the refusals sent
before any byte (400); and the mid-stream `{"error": ...}` line for a model the registry lacks
(§4.3). A pull or create installs its model through `EmulatorState` just before `success`; a
client that leaves earlier (recorded as `client_disconnect`) installs nothing, as a cancelled
pull does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
from starlette.routing import Route

from gateway.testing.emulator.catalog import canonical, layers, resolve
from gateway.testing.emulator.engine import Endpoint, run_cancellable
from gateway.testing.emulator.state import request_context
from gateway.testing.emulator.wire import encode_json, json_response, read_json, wrong_type

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.types import ASGIApp, Receive, Scope, Send

    from gateway.testing.emulator.config import EmulatorConfig
    from gateway.testing.emulator.state import Outcome, ReceivedRequest

_SUCCESS = {"status": "success"}
_MISSING_MANIFEST = "pull model manifest: file does not exist"


def _progress(status: str, digest: str = "", total: int = 0, completed: int = 0) -> dict[str, Any]:
    """One `api.ProgressResponse` line; zero fields are omitted (`omitempty`)."""
    line = {"status": status, "digest": digest, "total": total, "completed": completed}
    return {key: value for key, value in line.items() if value}


class _ProgressStream:
    """A progress answer as a raw ASGI app; `run_cancellable` notices a client leaving."""

    def __init__(
        self,
        record: ReceivedRequest,
        events: list[dict[str, Any]],
        *,
        stream: bool,
        pace: float,
        on_success: Callable[[], None],
    ) -> None:
        self._record = record
        self._events = events
        self._stream = stream
        self._pace = pace
        self._on_success = on_success

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG002
        produce = self._streamed if self._stream else self._whole
        await run_cancellable(self._record, receive, partial(produce, send))

    async def _streamed(self, send: Send) -> Outcome:
        for index, event in enumerate(self._events):
            if index:
                await anyio.sleep(self._pace)
            else:  # the headers go out with the first line (§1)
                headers = [(b"content-type", b"application/x-ndjson")]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
            if event == _SUCCESS:
                self._on_success()
            more = index < len(self._events) - 1
            body = (encode_json(event) + "\n").encode()
            await send({"type": "http.response.body", "body": body, "more_body": more})
        return "completed"

    async def _whole(self, send: Send) -> Outcome:
        status, answer = 200, {}
        for event in self._events:
            await anyio.sleep(self._pace)
            if "error" in event:
                status, answer = 500, event
                break
            if event == _SUCCESS:
                self._on_success()
            answer = event
        body = encode_json(answer).encode()
        # waitForStream sets a bare `application/json` before gin's c.JSON, which keeps it.
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return "completed"


def _name_of(body: dict[str, Any]) -> str:
    name = body.get("model") or body.get("name") or ""
    return name.strip() if isinstance(name, str) else ""


def _pull_events(name: str, config: EmulatorConfig) -> list[dict[str, Any]]:
    """`PullModel`: manifest, each layer's download progress, verify, write, success."""
    events = [_progress("pulling manifest")]
    if config.registry is not None and resolve(name, config.registry) is None:
        return [*events, {"error": _MISSING_MANIFEST}]
    for digest, size in layers(name):
        steps = (0, size // 2, size) if size > 1_000_000 else (0, size)
        events += [_progress(f"pulling {digest[7:19]}", digest, size, done) for done in steps]
    return [*events, _progress("verifying sha256 digest"), _progress("writing manifest"), _SUCCESS]


def _manifest_path(name: str) -> str:
    base, _, tag = canonical(name).rpartition(":")
    parts = base.split("/")
    parts = ["registry.ollama.ai", "library", *parts][-max(3, len(parts)) :]
    return f"/root/.ollama/models/manifests/{'/'.join(parts)}/{tag}"


async def _pull(request: Request) -> ASGIApp:
    """`POST /api/pull`: any name the registry has is installed when it finishes."""
    state, config, record = request_context(request)
    error = await read_json(request, record, "api.PullRequest", "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    name = _name_of(record.body)
    if not name:
        return json_response(400, {"error": "model is required"})
    installed = resolve(name, config.models) or canonical(name)
    return _ProgressStream(
        record,
        _pull_events(name, config),
        stream=record.body.get("stream") is not False,
        pace=config.inter_token,
        on_success=partial(state.install, installed),
    )


async def _push(request: Request) -> ASGIApp:
    """`POST /api/push`: each layer's upload progress; a model not installed fails mid-stream."""
    _, config, record = request_context(request)
    error = await read_json(request, record, "api.PushRequest", "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    name = _name_of(record.body)
    if not name:
        return json_response(400, {"error": "model is required"})
    events = [_progress("retrieving manifest")]
    model = resolve(name, config.models)
    if model is None:
        missing = f"open {_manifest_path(name)}: no such file or directory"
        events += [_progress("couldn't retrieve manifest"), {"error": missing}]
    else:
        for digest, size in layers(model):
            status = f"pushing {digest[7:19]}"
            events += [_progress(status, digest, size), _progress(status, digest, size, size)]
        events += [_progress("pushing manifest"), _SUCCESS]
    stream = record.body.get("stream") is not False
    return _ProgressStream(
        record, events, stream=stream, pace=config.inter_token, on_success=_nothing
    )


def _nothing() -> None:
    """A push changes nothing locally."""


async def _create(request: Request) -> ASGIApp:
    """`POST /api/create` from an installed model (`from`) or uploaded blobs (`files`)."""
    state, config, record = request_context(request)
    error = await read_json(request, record, "api.CreateRequest", "missing request body")
    if error is not None:
        return json_response(400, {"error": error})
    body: dict[str, Any] = record.body
    name, source, files = _name_of(body), body.get("from") or "", body.get("files")
    if not isinstance(source, str):
        return json_response(
            400, {"error": wrong_type("api.CreateRequest", "from", source, "string")}
        )
    if files is not None and not isinstance(files, dict):
        kind = "map[string]string"
        return json_response(400, {"error": wrong_type("api.CreateRequest", "files", files, kind)})
    if not name:
        return json_response(400, {"error": "invalid model name"})
    if not source and files is None:
        return json_response(400, {"error": "neither 'from' or 'files' was specified"})
    installs = [canonical(name)]
    if source and resolve(source, config.models) is None:
        installs.insert(0, canonical(source))  # parseFromModel pulls a missing base first

    def install() -> None:
        for model in installs:
            state.install(model)

    events = _create_events(body, source, files or {}, state.blobs, config)
    stream = body.get("stream") is not False
    return _ProgressStream(
        record, events, stream=stream, pace=config.inter_token, on_success=install
    )


def _create_events(
    body: dict[str, Any],
    source: str,
    files: dict[str, Any],
    blobs: set[str],
    config: EmulatorConfig,
) -> list[dict[str, Any]]:
    """`CreateHandler`: the base's layers (pulled first if missing), each file, new layers."""
    events: list[dict[str, Any]] = []
    if source:
        if resolve(source, config.models) is None:
            pulled = _pull_events(source, config)
            events += [_progress("pulling model"), *pulled[:-1]]
            if "error" in pulled[-1]:
                return [*events, pulled[-1]]
        events += [_progress(f"using existing layer {digest}") for digest, _ in layers(source)]
    for digest in files.values():
        key = f"sha256:{str(digest)[7:].lower()}"
        events.append(_progress("parsing GGUF"))
        if key not in blobs:
            blob = key.replace(":", "-")
            missing = f"open /root/.ollama/models/blobs/{blob}: no such file or directory"
            return [*events, {"error": missing}]
        events.append(_progress(f"using existing layer {key}"))
    for field in ("template", "system", "license", "parameters", "messages"):
        if body.get(field):
            digest = hashlib.sha256(encode_json(body[field]).encode()).hexdigest()
            events.append(_progress(f"creating new layer sha256:{digest}"))
    return [*events, _progress("writing manifest"), _SUCCESS]


ROUTES = (
    Route("/api/pull", Endpoint(_pull), methods=["POST"]),
    Route("/api/push", Endpoint(_push), methods=["POST"]),
    Route("/api/create", Endpoint(_create), methods=["POST"]),
)
"""The progress-streaming model routes, in the order `create_emulator_app` mounts them."""
