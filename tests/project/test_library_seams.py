"""The library internals the gateway builds on, pinned: an upgrade that moves one fails here.

docs/architecture.md ("Library seams") lists each place where the code subclasses a library's
class or reaches past its public API, and why. Each test below names the members that code
overrides, calls through `super()` or reads, so that a new version of uvicorn, `limits`,
prometheus-client, Starlette or FastAPI that renames one fails with the member's name, before
the behaviour tests (over real sockets) fail in a less telling way.
"""

from __future__ import annotations

import inspect
import re

import pytest
import uvicorn
from fastapi.routing import APIRoute
from limits.aio.storage import MemoryStorage
from prometheus_client import CollectorRegistry, Gauge
from starlette.middleware.cors import CORSMiddleware
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from gateway.serve.coalesce import CoalescingHttpToolsProtocol, HeadHoldingProtocol
from gateway.serve.door import DoorProtocol
from gateway.serve.server import DrainingServer
from gateway.serve.workers import Supervisor, Worker


def _assigns(cls: type, name: str) -> bool:
    """Whether `cls`'s source assigns `self.<name>` (with or without an annotation)."""
    return re.search(rf"self\.{name}\s*(:[^=\n]+)?=[^=]", inspect.getsource(cls)) is not None


# gateway/serve/door.py and coalesce.py: the parser callbacks and protocol methods they
# override and call through super(), and the attributes of HttpToolsProtocol they read.
HTTPTOOLS_METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_url",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "_should_upgrade",
    "pause_writing",
    "resume_writing",
)
HTTPTOOLS_ATTRIBUTES = (
    "transport",
    "flow",
    "parser",
    "pipeline",
    "cycle",
    "server_state",
    "loop",
    "url",
)


@pytest.mark.parametrize("name", HTTPTOOLS_METHODS)
def test_the_httptools_protocol_still_has_the_methods_the_door_overrides(name: str) -> None:
    assert callable(getattr(HttpToolsProtocol, name, None)), name
    assert name in vars(DoorProtocol) or name in vars(HeadHoldingProtocol), name


@pytest.mark.parametrize("name", HTTPTOOLS_ATTRIBUTES)
def test_the_httptools_protocol_still_sets_the_attributes_the_door_reads(name: str) -> None:
    assert _assigns(HttpToolsProtocol, name), name


# gateway/serve/writer.py: what the push path's writer reads of uvicorn's request cycle.
CYCLE_ATTRIBUTES = (
    "response_started",
    "response_complete",
    "chunked_encoding",
    "disconnected",
    "message_event",
    "transport",
    "flow",
    "scope",
)


@pytest.mark.parametrize("name", CYCLE_ATTRIBUTES)
def test_the_request_cycle_still_sets_the_attributes_the_body_writer_reads(name: str) -> None:
    assert _assigns(RequestResponseCycle, name), name


def test_the_request_cycle_still_frames_each_body_piece_as_the_body_writer_does() -> None:
    # BodyWriter writes `%x\r\n`, the piece, `\r\n`: the cycle's own chunked framing.
    source = inspect.getsource(RequestResponseCycle.send)
    assert 'b"%x\\r\\n" % len(body), body, b"\\r\\n"' in source
    assert _assigns(FlowControl, "write_paused")


def test_the_httptools_protocol_still_writes_its_status_lines_from_one_table() -> None:
    # door.py answers 408/431/503 itself with uvicorn's own status lines.
    assert STATUS_LINE[503].startswith(b"HTTP/1.1 503")
    assert issubclass(CoalescingHttpToolsProtocol, HttpToolsProtocol)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("processes", "attribute"),
        ("processes_num", "attribute"),
        ("signal_queue", "attribute"),
        ("should_exit", "attribute"),
        ("sockets", "attribute"),
        ("config", "attribute"),
        ("init_processes", "method"),
        ("keep_subprocess_alive", "method"),
        ("join_all", "method"),
    ],
)
def test_uvicorns_supervisor_still_has_what_the_workers_supervisor_overrides(
    name: str, kind: str
) -> None:
    # gateway/serve/workers.py: Supervisor replaces how workers start and are kept alive.
    if kind == "method":
        assert callable(getattr(Multiprocess, name, None)), name
        assert name in vars(Supervisor), name
    else:
        assert _assigns(Multiprocess, name), name


def test_uvicorns_worker_process_still_runs_a_target_and_answers_pings() -> None:
    assert callable(getattr(Process, "target", None))
    assert callable(getattr(Process, "always_pong", None))
    assert "target" in vars(Worker)
    assert isinstance(STARTUP_FAILURE, int)


def test_uvicorns_server_still_has_the_exit_handler_the_drain_wraps() -> None:
    # gateway/serve/server.py: DrainingServer delays handle_exit by the drain.
    assert callable(getattr(uvicorn.Server, "handle_exit", None))
    assert "handle_exit" in vars(DrainingServer)
    # DrainingServer.main_loop replaces uvicorn's, calling on_tick with its 0.1 s tick count.
    assert "main_loop" in vars(DrainingServer)
    assert list(inspect.signature(uvicorn.Server.on_tick).parameters) == ["self", "counter"]
    assert "counter % 10 == 0" in inspect.getsource(uvicorn.Server.on_tick)
    assert _assigns(uvicorn.Server, "should_exit")


def test_limits_memory_storage_still_schedules_expiry_under_the_overridden_name() -> None:
    # gateway/limits/storage.py: HousekeptMemoryStorage overrides the name-mangled private.
    assert callable(getattr(MemoryStorage, "_MemoryStorage__schedule_expiry", None))


def test_prometheus_gauges_still_keep_their_children_in_metrics() -> None:
    # gateway/metering/metrics.py zeroes each child of a labelled gauge (no public accessor).
    gauge = Gauge("seam", "seam", ["model"], registry=CollectorRegistry())
    gauge.labels("m").set(1)
    assert list(gauge._metrics) == [("m",)]


def test_starlette_cors_and_fastapi_routes_keep_the_hooks_the_gateway_overrides() -> None:
    # gateway/api/middleware/cors.py and gateway/api/admin/body.py.
    assert callable(getattr(CORSMiddleware, "preflight_response", None))
    assert callable(getattr(CORSMiddleware, "is_allowed_origin", None))
    assert callable(getattr(APIRoute, "get_route_handler", None))
