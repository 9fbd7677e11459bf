"""Ollama's other endpoints at Ollama's paths, over a real gateway in front of the emulator.

`/`, `/api/version`, `/api/tags`, `/api/show`, `/api/ps` (`gateway.api.ollama.models`) and the
model management routes (`gateway.api.ollama.manage`), in front of one or two Ollama upstreams
and of an OpenAI-style one; then the same through the real `ollama` client.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import ollama
import pytest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from tests.support.client import MODEL
from tests.support.lookalikes import OllamaLookalike, served
from tests.support.metrics import metric_value, wait_polled
from tests.support.stack import Emulator, Gateway

OTHER = "qwen2.5:7b"  # the emulator's second model
KEYED_ROUTES = [
    ("GET", "/api/version"),
    ("HEAD", "/api/version"),
    ("GET", "/api/tags"),
    ("HEAD", "/api/tags"),
    ("GET", "/api/ps"),
    ("POST", "/api/show"),
    ("POST", "/api/pull"),
    ("POST", "/api/push"),
    ("POST", "/api/create"),
    ("POST", "/api/copy"),
    ("DELETE", "/api/delete"),
    ("HEAD", f"/api/blobs/sha256:{'0' * 64}"),
    ("POST", f"/api/blobs/sha256:{'0' * 64}"),
]
MANAGEMENT = KEYED_ROUTES[6:]
#: What the gateway's upstream monitor polls on its own.
MONITORED = {("GET", "/api/version"), ("GET", "/api/tags"), ("GET", "/api/ps")}


@pytest.fixture
def second() -> Iterator[Emulator]:
    """A second Ollama emulator, as another GPU node."""
    app = create_emulator_app(EmulatorConfig())
    with LoopbackServer(app) as server:
        yield Emulator(server.url, app.state.emulator)


@pytest.fixture
def admin(gateway: Gateway) -> str:
    """A key with the model-management permission."""
    return gateway.create_key("admin", manage_models=True)[1]


def _call(gw: Gateway, method: str, path: str, key: str | None = None, **kwargs) -> httpx.Response:
    headers = gw.headers(key) if key != "" else {}
    return httpx.request(method, f"{gw.url}{path}", headers=headers, timeout=30, **kwargs)


def _paths(emulator: Emulator) -> list[str]:
    return [record.path for record in emulator.state.records]


def _sent(emulator: Emulator, method: str, path: str) -> bool:
    """Whether the emulator got `method path` (not counting the monitor's own polls)."""
    if (method, path) in MONITORED:
        return False
    return any((r.method, r.path) == (method, path) for r in emulator.state.records)


def _name(upstream: Emulator) -> str:
    return upstream.url.removeprefix("http://")


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


# --- without a key --------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_root_answers_ollama_is_running_without_a_key(gateway: Gateway, method: str):
    response = httpx.request(method, f"{gateway.url}/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["content-length"] == "17"
    assert response.content == (b"Ollama is running" if method == "GET" else b"")


@pytest.mark.parametrize(("method", "path"), KEYED_ROUTES)
def test_every_other_route_needs_a_key(gateway: Gateway, emulator: Emulator, method, path):
    response = _call(gateway, method, path, key="", content=b'{"model": "llama3.2"}')
    assert response.status_code == 401
    if method != "HEAD":
        assert response.json() == {"error": "missing API key: send Authorization: Bearer <key>"}
    assert not _sent(emulator, method, path)


# --- version, tags, ps, show ----------------------------------------------------------------


def test_version_is_the_ollama_release_the_gateway_matches(gateway: Gateway):
    response = _call(gateway, "GET", "/api/version")
    assert response.json() == {"version": "0.33.0"}
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert _call(gateway, "HEAD", "/api/version").status_code == 200


def test_tags_keep_the_upstream_entries_and_follow_the_allow_list(gateway: Gateway, emulator):
    everything = _call(gateway, "GET", "/api/tags").json()["models"]
    assert [m["name"] for m in everything] == emulator.config.models
    first = everything[0]
    assert {"name", "model", "modified_at", "size", "digest", "details"} <= set(first)
    assert first["size"] > 0
    assert len(first["digest"]) == 64
    assert first["details"]["format"] == "gguf"
    _, narrow = gateway.create_key("narrow", models=["llama3.2"])
    assert _call(gateway, "GET", "/api/tags", narrow).json() == {"models": [first]}
    _, none = gateway.create_key("none", models=["absent"])
    assert _call(gateway, "GET", "/api/tags", none).json() == {"models": []}
    assert _call(gateway, "HEAD", "/api/tags").status_code == 200


def test_tags_are_the_union_over_the_upstreams(make_gateway, emulator: Emulator, second):
    emulator.config.models = ["alpha:latest", MODEL]
    second.config.models = [MODEL, "beta:latest"]
    gw = make_gateway(upstreams=[{"url": emulator.url}, {"url": second.url}])
    names = [m["name"] for m in _call(gw, "GET", "/api/tags").json()["models"]]
    assert sorted(names) == ["alpha:latest", "beta:latest", MODEL]


def test_tags_answer_502_when_every_upstream_fails(make_gateway):
    gw = make_gateway(upstream_url=_closed_port_url())
    response = _call(gw, "GET", "/api/tags")
    assert response.status_code == 502
    assert response.json() == {"error": "could not list the upstreams' models"}


def test_ps_lists_loaded_models_the_key_may_use(gateway: Gateway):
    models = _call(gateway, "GET", "/api/ps").json()["models"]
    assert [m["name"] for m in models] == [MODEL, OTHER]
    assert {"size_vram", "expires_at", "context_length"} <= set(models[0])
    _, narrow = gateway.create_key("narrow", models=[OTHER])
    assert [m["name"] for m in _call(gateway, "GET", "/api/ps", narrow).json()["models"]] == [OTHER]


def test_show_relays_the_upstream_answer_to_the_checked_body(gateway: Gateway, emulator):
    body = {"model": "llama3.2", "verbose": True}
    response = _call(gateway, "POST", "/api/show", json=body)
    assert response.status_code == 200
    shown = response.json()
    assert shown["capabilities"] == ["completion", "tools"]
    assert "general.architecture" in shown["model_info"]
    [record] = [r for r in emulator.state.records if r.path == "/api/show"]
    assert record.body == body
    legacy = _call(gateway, "POST", "/api/show", json={"name": "llama3.2"})
    assert legacy.json()["template"] == shown["template"]


def test_show_refusals(gateway: Gateway, emulator: Emulator):
    missing = _call(gateway, "POST", "/api/show", json={"verbose": True})
    assert (missing.status_code, missing.json()) == (400, {"error": "model is required"})
    unknown = _call(gateway, "POST", "/api/show", json={"model": "nope"})
    assert (unknown.status_code, unknown.json()) == (
        404,
        {"error": "model 'nope:latest' not found"},
    )
    _, narrow = gateway.create_key("narrow", models=["nope"])
    hidden = _call(gateway, "POST", "/api/show", narrow, json={"model": "llama3.2"})
    # The same answer as for a model that does not exist: the key learns nothing more.
    assert (hidden.status_code, hidden.json()) == (
        404,
        {"error": "model 'llama3.2:latest' not found"},
    )
    assert _call(gateway, "POST", "/api/show", content=b"{").status_code == 400
    repeated = _call(gateway, "POST", "/api/show", content=b'{"model":"a","MODEL":"b"}')
    assert repeated.status_code == 400
    shows = [r for r in emulator.state.records if r.path == "/api/show"]
    assert [r.body["model"] for r in shows] == ["nope"]  # nothing else went upstream


def test_show_body_over_the_size_limit_is_413(make_gateway):
    gw = make_gateway(max_body_bytes=1024)
    response = _call(gw, "POST", "/api/show", json={"model": "llama3.2", "pad": "x" * 2000})
    assert response.status_code == 413


def test_openai_upstream_answers_from_the_catalogue_and_gets_no_api_call(
    make_gateway: Callable[..., Gateway], emulator: Emulator
):
    gw = make_gateway(upstream_dialect="openai")
    tags = _call(gw, "GET", "/api/tags").json()["models"]
    assert [m["name"] for m in tags] == emulator.config.models
    assert tags[0] | {"modified_at": ""} == {
        "name": MODEL,
        "model": MODEL,
        "modified_at": "",
        "size": 0,
        "digest": "",
        "details": {},
    }
    shown = _call(gw, "POST", "/api/show", json={"model": "llama3.2"})
    assert shown.status_code == 200
    assert shown.json()["capabilities"] == ["completion"]
    assert _call(gw, "POST", "/api/show", json={"model": "nope"}).status_code == 404
    assert _call(gw, "GET", "/api/ps").json() == {"models": []}
    pulled = _call(gw, "POST", "/api/pull", gw.create_key("a", manage_models=True)[1], json={})
    assert pulled.status_code == 400
    assert pulled.json() == {"error": "the upstream cannot manage models (it has no Ollama API)"}
    assert not [path for path in _paths(emulator) if path.startswith("/api/")]


# --- model management -----------------------------------------------------------------------


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize(("method", "path"), MANAGEMENT)
def test_management_is_refused_to_an_ordinary_key(gateway: Gateway, emulator, method, path):
    response = _call(gateway, method, path, json={"model": "llama3.2"})
    assert response.status_code == 403
    if method != "HEAD":
        assert response.json() == {"error": "this API key may not manage models"}
    assert not _sent(emulator, method, path)


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_pull_streams_the_upstream_progress_as_it_comes(gateway: Gateway, emulator, admin):
    emulator.config.inter_token = 0.2
    arrivals: list[tuple[float, dict[str, object]]] = []
    with httpx.stream(
        "POST",
        f"{gateway.url}/api/pull",
        json={"model": "phi4:14b"},
        headers=gateway.headers(admin),
        timeout=30,
    ) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        for line in response.iter_lines():
            arrivals.append((time.monotonic(), json.loads(line)))
    statuses = [line["status"] for _, line in arrivals]
    assert statuses[0] == "pulling manifest"
    assert statuses[-1] == "success"
    assert any(line.get("completed") for _, line in arrivals)
    # Unbuffered: lines arrive spread over the pull, not all at its end.
    assert arrivals[-1][0] - arrivals[0][0] > 0.2 * (len(arrivals) - 2)
    assert "phi4:14b" in [m["name"] for m in _call(gateway, "GET", "/api/tags").json()["models"]]
    text = gateway.metrics_text()
    assert metric_value(text, "gateway_requests_total", route="/api/pull", outcome="completed") == 1


def test_pull_without_streaming_is_one_object(gateway: Gateway, admin):
    body = {"model": "phi4:14b", "stream": False}
    response = _call(gateway, "POST", "/api/pull", admin, json=body)
    assert (response.status_code, response.json()) == (200, {"status": "success"})


def test_pull_error_before_the_first_byte_and_mid_stream(gateway: Gateway, emulator, admin):
    missing = _call(gateway, "POST", "/api/pull", admin, json={"insecure": True})
    assert (missing.status_code, missing.json()) == (400, {"error": "model is required"})
    emulator.config.registry = [MODEL]
    lines = _call(gateway, "POST", "/api/pull", admin, json={"model": "absent"}).text.splitlines()
    assert json.loads(lines[-1]) == {"error": "pull model manifest: file does not exist"}


def test_client_leaving_mid_pull_closes_the_upstream_request(gateway: Gateway, emulator, admin):
    emulator.config.inter_token = 0.5
    with httpx.stream(
        "POST",
        f"{gateway.url}/api/pull",
        json={"model": "phi4:14b"},
        headers=gateway.headers(admin),
        timeout=30,
    ) as response:
        assert json.loads(next(response.iter_lines()))["status"] == "pulling manifest"
    [record] = [r for r in emulator.state.records if r.path == "/api/pull"]
    assert record.wait_ended(3)
    assert record.outcome == "client_disconnect"
    assert "phi4:14b" not in emulator.config.models
    text = gateway.metrics_text()
    outcome = "client_disconnect"
    assert metric_value(text, "gateway_requests_total", route="/api/pull", outcome=outcome) == 1
    assert metric_value(text, "gateway_upstream_connections_in_use") == 0


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_client_leaving_a_silent_pull_closes_the_upstream_request(gateway, emulator, admin):
    emulator.config.inter_token = 0.5  # stream:false: nothing is sent until the pull is done
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gateway.url}/api/pull",
            json={"model": "phi4:14b", "stream": False},
            headers=gateway.headers(admin),
            timeout=httpx.Timeout(5, read=0.6),
        )
    [record] = [r for r in emulator.state.records if r.path == "/api/pull"]
    assert record.wait_ended(3)
    assert record.outcome == "client_disconnect"


def test_management_follows_the_allow_list(gateway: Gateway, emulator: Emulator):
    _, narrow = gateway.create_key("narrow", models=["llama3.2"], manage_models=True)
    refused = _call(gateway, "POST", "/api/pull", narrow, json={"model": OTHER})
    assert (refused.status_code, refused.json()) == (
        403,
        {"error": f"this API key may not use model '{OTHER}'"},
    )
    copy = {"source": "llama3.2", "destination": "mine"}
    assert _call(gateway, "POST", "/api/copy", narrow, json=copy).status_code == 403
    assert "/api/pull" not in _paths(emulator)
    assert "/api/copy" not in _paths(emulator)


DIGEST = f"sha256:{'1' * 64}"


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/api/create", {"model": "mine", "files": {"m.gguf": DIGEST}}, "files"),
        (
            "POST",
            "/api/create",
            {"model": "mine", "from": "llama3.2", "adapters": {"a.gguf": DIGEST}},
            "adapters",
        ),
        (
            "POST",
            "/api/create",
            {"model": "mine", "from": "llama3.2", "remote_host": "http://203.0.113.9:11434"},
            "remote_host",
        ),
        ("POST", "/api/create", {"model": "mine", "modelfile": f"FROM {OTHER}"}, "modelfile"),
        ("POST", "/api/create", {"model": "mine", "path": "/root/Modelfile"}, "path"),
        ("POST", "/api/pull", {"model": "llama3.2", "insecure": True}, "insecure"),
        ("POST", "/api/push", {"model": "mine", "insecure": True}, "insecure"),
        # A field the gateway does not know may name anything in a later Ollama.
        ("POST", "/api/create", {"model": "mine", "from": "llama3.2", "base": OTHER}, "base"),
        ("POST", "/api/pull", {"model": "llama3.2", "username": "someone"}, "username"),
        (
            "POST",
            "/api/copy",
            {"source": "llama3.2", "destination": "mine", "overwrite": True},
            "overwrite",
        ),
        ("DELETE", "/api/delete", {"model": "mine", "all": True}, "all"),
    ],
)
def test_a_narrow_key_cannot_reach_past_its_allow_list_through_management_fields(
    gateway: Gateway, emulator: Emulator, method: str, path: str, body: dict, field: str
):
    """Before: `files`, `remote_host` and the like were relayed for a key limited to one model."""
    _, narrow = gateway.create_key("narrow", models=["llama3.2", "mine"], manage_models=True, rpm=0)
    refused = _call(gateway, method, path, narrow, json=body)
    assert refused.status_code == 403
    message = refused.json()["error"]
    assert message.startswith("this API key may only manage the models on its allow-list")
    assert json.dumps(field) in message
    assert not _sent(emulator, method, path)


def test_a_narrow_key_cannot_use_blobs_and_may_send_empty_or_model_only_fields(
    gateway: Gateway, emulator: Emulator
):
    _, narrow = gateway.create_key("narrow", models=["llama3.2", "mine"], manage_models=True)
    for method in ("HEAD", "POST"):
        blob = _call(gateway, method, f"/api/blobs/{DIGEST}", narrow, content=b"x")
        assert blob.status_code == 403
        assert not _sent(emulator, method, f"/api/blobs/{DIGEST}")
    body = {
        "model": "mine",
        "from": "llama3.2",
        "system": "be brief",
        "parameters": {"temperature": 0.1},
        "files": {},  # Go's zero value: the same as absent
        "remote_host": "",
        "insecure": False,
        "stream": False,
    }
    created = _call(gateway, "POST", "/api/create", narrow, json=body)
    assert created.status_code == 200, created.text
    assert "mine:latest" in emulator.config.models
    pulled = _call(
        gateway,
        "POST",
        "/api/pull",
        narrow,
        json={"model": "llama3.2", "insecure": False, "stream": False},
    )
    assert pulled.status_code == 200


def test_a_key_without_an_allow_list_may_create_from_files(gateway: Gateway, emulator, admin):
    """Every model is its own: nothing it names is beyond it, so the body goes as it is."""
    body = {"model": "mine", "files": {"m.gguf": DIGEST}, "stream": False}
    _call(gateway, "POST", "/api/create", admin, json=body)
    [record] = [r for r in emulator.state.records if r.path == "/api/create"]
    assert record.body == body


def test_copy_delete_and_create_are_relayed(gateway: Gateway, emulator: Emulator, admin):
    copy = {"source": "llama3.2", "destination": "mine:1"}
    assert _call(gateway, "POST", "/api/copy", admin, json=copy).status_code == 200
    assert "mine:1" in emulator.config.models
    deleted = _call(gateway, "DELETE", "/api/delete", admin, json={"model": "mine:1"})
    assert (deleted.status_code, deleted.content) == (200, b"")
    again = _call(gateway, "DELETE", "/api/delete", admin, json={"model": "mine:1"})
    assert (again.status_code, again.json()) == (404, {"error": "model 'mine:1' not found"})
    created = _call(
        gateway, "POST", "/api/create", admin, json={"model": "tuned", "from": "llama3.2"}
    )
    assert created.text.splitlines()[-1] == '{"status":"success"}'
    assert "tuned:latest" in emulator.config.models


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
@pytest.mark.parametrize("http_client", ["aiohttp", "httptools", "httpx"])
def test_blob_upload_streams_past_the_json_size_limit(make_gateway, emulator, http_client):
    gw = make_gateway(max_body_bytes=1024, upstream_http_client=http_client)
    admin = gw.create_key("admin", manage_models=True)[1]
    blob = bytes(range(256)) * 8192  # 2 MiB
    path = f"/api/blobs/sha256:{hashlib.sha256(blob).hexdigest()}"
    assert _call(gw, "HEAD", path, admin).status_code == 404

    def chunks() -> Iterator[bytes]:
        yield blob[:65536]
        # Streamed, not held: the upstream request starts before the client sent the rest.
        deadline = time.monotonic() + 5
        while not _sent(emulator, "POST", path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _sent(emulator, "POST", path)
        for start in range(65536, len(blob), 65536):
            yield blob[start : start + 65536]

    assert _call(gw, "POST", path, admin, content=chunks()).status_code == 201
    assert _call(gw, "HEAD", path, admin).status_code == 200
    wrong = _call(gw, "POST", f"/api/blobs/sha256:{'1' * 64}", admin, content=b"abc")
    assert wrong.status_code == 400
    assert "digest mismatch" in wrong.json()["error"]
    bad = _call(gw, "POST", "/api/blobs/sha256:../../etc", admin, content=b"abc")
    assert (bad.status_code, bad.json()) == (400, {"error": "invalid digest format"})
    text = gw.metrics_text()
    route = "/api/blobs/{digest}"
    assert metric_value(text, "gateway_requests_total", route=route, status_class="2xx") == 2


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_several_upstreams_need_a_selector_for_transfers(make_gateway, emulator, second):
    gw = make_gateway(upstreams=[{"url": emulator.url}, {"url": second.url}])
    admin = gw.create_key("admin", manage_models=True)[1]
    unnamed = _call(gw, "POST", "/api/pull", admin, json={"model": "phi4:14b"})
    assert unnamed.status_code == 400
    assert unnamed.json() == {
        "error": "several upstreams can manage models: add ?upstream=<host:port>"
    }
    unknown = _call(gw, "POST", "/api/pull?upstream=nowhere:1", admin, json={"model": "x"})
    assert (unknown.status_code, unknown.json()) == (
        400,
        {"error": 'no upstream is named "nowhere:1"'},
    )
    named = f"/api/pull?upstream={_name(second)}"
    pulled = _call(gw, "POST", named, admin, json={"model": "phi4:14b", "stream": False})
    assert pulled.json() == {"status": "success"}
    assert ("phi4:14b" in emulator.config.models, "phi4:14b" in second.config.models) == (
        False,
        True,
    )
    assert "/api/pull" not in _paths(emulator)


def test_delete_without_a_selector_goes_to_every_ollama_upstream(make_gateway, emulator, second):
    emulator.config.models = [MODEL, OTHER]
    second.config.models = [MODEL]
    gw = make_gateway(upstreams=[{"url": emulator.url}, {"url": second.url}])
    admin = gw.create_key("admin", manage_models=True)[1]
    assert _call(gw, "DELETE", "/api/delete", admin, json={"model": MODEL}).status_code == 200
    assert (emulator.config.models, second.config.models) == ([OTHER], [])
    # Only one upstream has it: the other's 404 is no failure.
    assert _call(gw, "DELETE", "/api/delete", admin, json={"model": OTHER}).status_code == 200
    gone = _call(gw, "DELETE", "/api/delete", admin, json={"model": OTHER})
    assert gone.status_code == 404


def test_show_finds_the_upstream_that_has_the_model(make_gateway, emulator, second):
    emulator.config.models = ["alpha:latest"]
    second.config.models = ["beta:latest"]
    gw = make_gateway(upstreams=[{"url": emulator.url}, {"url": second.url}])
    wait_polled(gw, 2)
    assert _call(gw, "POST", "/api/show", json={"model": "beta"}).status_code == 200
    assert "/api/show" not in _paths(emulator)


# --- the real ollama client -----------------------------------------------------------------


def test_the_ollama_client_lists_shows_and_pulls(gateway: Gateway, admin: str):
    with ollama.Client(host=gateway.url, headers=gateway.headers()) as client:
        assert [m.model for m in client.list().models] == [MODEL, OTHER]
        assert client.show("llama3.2").capabilities == ["completion", "tools"]
        assert [m.model for m in client.ps().models] == [MODEL, OTHER]
        with pytest.raises(ollama.ResponseError) as refused:
            list(client.pull("phi4:14b", stream=True))
        assert refused.value.status_code == 403
        assert refused.value.error == "this API key may not manage models"
        with pytest.raises(ollama.ResponseError) as unknown:
            client.show("nope")
        assert unknown.value.status_code == 404
    with ollama.Client(host=gateway.url, headers=gateway.headers(admin)) as client:
        progress = list(client.pull("phi4:14b", stream=True))
        assert progress[-1].status == "success"
        assert "phi4:14b" in [m.model for m in client.list().models]
        assert client.delete("phi4:14b").status == "success"


@pytest.mark.parametrize("http_client", ["aiohttp", "httptools", "httpx"])
def test_client_leaving_mid_upload_ends_the_upstream_upload(make_gateway, emulator, http_client):
    gw = make_gateway(upstream_http_client=http_client)
    admin = gw.create_key("admin", manage_models=True)[1]
    path = f"/api/blobs/sha256:{'2' * 64}"
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {admin}\r\n"
            "Content-Length: 10000000\r\n\r\n"
        )
        sock.sendall(head.encode() + b"x" * 65536)
        deadline = time.monotonic() + 5
        while not _sent(emulator, "POST", path) and time.monotonic() < deadline:
            time.sleep(0.01)
    [record] = [r for r in emulator.state.records if r.path == path]
    assert record.wait_ended(5)
    assert record.status is None  # the upstream never answered: its request was cut short
    deadline = time.monotonic() + 5
    route, outcome = "/api/blobs/{digest}", "client_disconnect"
    while time.monotonic() < deadline:
        text = gw.metrics_text()
        if metric_value(text, "gateway_requests_total", route=route, outcome=outcome):
            break
        time.sleep(0.05)
    assert metric_value(text, "gateway_requests_total", route=route, outcome=outcome) == 1
    assert metric_value(text, "gateway_upstream_connections_in_use") == 0


class EndlessShow(OllamaLookalike):
    """An upstream whose `/api/show` and `/api/copy` answers run past the gateway's limit.

    48 MiB, 64 KiB at a time: longer than `SMALL_ANSWER_LIMIT` (32 MiB) without being truly
    endless, since writes after the gateway hangs up are dropped, not refused, and an endless
    generator would spin in the test process for the rest of the run.
    """

    def __init__(self) -> None:
        super().__init__()
        endless = Route("/api/show", self.endless, methods=["POST"])
        self.app.router.routes += [endless, Route("/api/copy", self.endless, methods=["POST"])]

    async def endless(self, _: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(48 * 16):
                yield b" " * 65536

        return StreamingResponse(body(), media_type="application/json")


@pytest.fixture
def endless() -> Iterator[tuple[EndlessShow, str]]:
    yield from served(EndlessShow())


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_an_endless_upstream_answer_is_cut_at_the_limit_not_held(make_gateway, endless):
    """A hostile upstream's over-long /api/show (or copy) answer is refused at 32 MiB, 502."""
    _, url = endless
    gw = make_gateway(upstream_url=url)
    response = _call(gw, "POST", "/api/show", json={"model": MODEL})
    assert response.status_code == 502
    assert response.json() == {"error": "upstream sent an over-long answer"}
    _, manager = gw.create_key("manager", manage_models=True)
    body = {"source": MODEL, "destination": MODEL}
    copied = _call(gw, "POST", "/api/copy", manager, json=body)
    assert copied.status_code == 502
    assert copied.json() == {"error": "upstream sent an over-long answer"}


def test_show_counts_against_the_keys_rpm(make_gateway, emulator: Emulator):
    """/api/show is relayed to an upstream, so it is limited like a generation."""
    gw = make_gateway()
    _, key = gw.create_key("slow", rpm=1)
    assert _call(gw, "POST", "/api/show", key, json={"model": MODEL}).status_code == 200
    refused = _call(gw, "POST", "/api/show", key, json={"model": MODEL})
    assert refused.status_code == 429
    assert "requests per minute" in refused.json()["error"]
    shows = [r for r in emulator.state.records if r.path == "/api/show"]
    assert len(shows) == 1


@pytest.mark.parametrize(
    ("method", "path", "body", "upstream_path"),
    [
        ("GET", "/api/tags", None, "/api/tags"),
        ("HEAD", "/api/tags", None, "/api/tags"),
        ("GET", "/api/ps", None, "/api/ps"),
        ("GET", "/v1/models", None, None),
        ("GET", f"/v1/models/{MODEL}", None, None),
        ("POST", "/api/copy", {"source": MODEL, "destination": "mine"}, "/api/copy"),
        ("DELETE", "/api/delete", {"model": "nothing-here"}, "/api/delete"),
        ("POST", "/api/pull", {"model": MODEL, "stream": False}, "/api/pull"),
        ("HEAD", f"/api/blobs/sha256:{'0' * 64}", None, "/api/blobs/sha256:" + "0" * 64),
    ],
)
@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_model_lists_and_management_count_against_the_keys_rpm(
    make_gateway, emulator: Emulator, method: str, path: str, body, upstream_path
):
    """Before: /api/tags and /api/ps ignored the key's limits (300 upstream calls in 0.8 s from
    a 5-per-minute key); so did /v1/models and the management routes."""
    gw = make_gateway(upstream_poll_interval=60)
    _, key = gw.create_key("slow", rpm=2, manage_models=True)

    def calls() -> int:
        return sum(r.path == upstream_path for r in emulator.state.records)

    before = calls()
    statuses = [_call(gw, method, path, key, json=body).status_code for _ in range(12)]
    assert statuses[2:] == [429] * 10
    assert all(status != 429 for status in statuses[:2])
    if upstream_path:  # the two admitted, and the monitor's own polls (one a minute here)
        assert calls() - before <= 2 + 2
    text = gw.metrics_text()
    assert metric_value(text, "gateway_rate_limited_total", kind="rpm") == 10
    if method != "HEAD":
        refused = _call(gw, method, path, key, json=body)
        error = refused.json()["error"]
        message = error["message"] if path.startswith("/v1/") else error
        assert "requests per minute" in message
