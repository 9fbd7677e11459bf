"""scripts/audit: a known vulnerability in a locked runtime release fails the run, one in a
report-only lock or an accepted one does not, and a registry that is down, slow or answers only
for the latest release leaves releases "not audited" without failing (CI must not turn flaky).

The registry is a real HTTP server on a loopback port serving PyPI's JSON records; pip-audit is
pointed at a dead proxy, so it fails at once and nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.tools

ROOT = Path(__file__).resolve().parents[2]
AUDIT = ROOT / "scripts" / "audit"
HASH = "--hash=sha256:" + "0" * 64
SLOW_SECONDS = 90.0

# project -> (latest version, its vulnerabilities); a project not here is a 404.
RECORDS = {
    "probe-vulnerable": (
        "1.0",
        [{"id": "PYSEC-0000-1", "aliases": ["CVE-0000-1"], "fixed_in": ["1.1"]}],
    ),
    "probe-withdrawn": ("1.0", [{"id": "PYSEC-0000-2", "aliases": [], "withdrawn": "2026-01-01"}]),
    "probe-clean": ("1.0", []),
    "probe-old": ("2.0", []),
    "probe-slow": ("1.0", []),
}


class Registry(BaseHTTPRequestHandler):
    """GET /pypi/<name>/json as PyPI answers it; probe-slow answers after SLOW_SECONDS."""

    def do_GET(self) -> None:
        name = self.path.split("/")[2] if self.path.startswith("/pypi/") else ""
        if name not in RECORDS:
            self.send_error(404)
            return
        if name == "probe-slow":
            time.sleep(SLOW_SECONDS)
        latest, vulns = RECORDS[name]
        body = json.dumps({"info": {"version": latest}, "vulnerabilities": vulns}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lock(tmp_path: Path, name: str, *pins: str) -> Path:
    path = tmp_path / name
    path.write_text("".join(f"{pin} \\\n    {HASH}\n" for pin in pins))
    return path


def _audit(*args: str | Path, timeout: float = 5) -> subprocess.CompletedProcess[str]:
    dead = f"http://127.0.0.1:{_dead_port()}"
    env = {**os.environ, "HTTPS_PROXY": dead, "https_proxy": dead, "NO_PROXY": "127.0.0.1"}
    env["no_proxy"] = "127.0.0.1"
    command = [sys.executable, str(AUDIT), "--timeout", str(timeout), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)  # noqa: S603 (our own script)


def test_a_known_vulnerability_in_a_runtime_release_fails_the_audit(tmp_path, registry):
    lock = _lock(
        tmp_path,
        "runtime.txt",
        "probe-vulnerable==1.0",
        "probe-withdrawn==1.0",
        "probe-clean==1.0",
        "probe-old==1.0",
        "probe-missing==1.0",
    )

    run = _audit(lock, "--pypi", registry, "--accepted", os.devnull)

    assert run.returncode == 1, run.stdout + run.stderr
    assert "VULNERABLE: probe-vulnerable 1.0: PYSEC-0000-1 (fixed in 1.1)" in run.stdout
    assert "probe-withdrawn" not in run.stdout  # a withdrawn advisory is no vulnerability
    assert (
        "not audited: probe-old 1.0: the registry here answers only for the latest release (2.0)"
        in run.stdout
    )
    assert "not audited: probe-missing 1.0: no answer from the registry (HTTPError)" in run.stdout
    assert "5 releases" in run.stdout
    assert "1 with a known vulnerability" in run.stdout
    assert "a locked runtime dependency has a known vulnerability" in run.stderr


def test_a_vulnerability_in_a_report_only_lock_or_an_accepted_one_does_not_fail(tmp_path, registry):
    runtime = _lock(tmp_path, "runtime.txt", "probe-clean==1.0")
    dev = _lock(tmp_path, "dev.txt", "probe-vulnerable==1.0")
    accepted = tmp_path / "accepted.txt"
    accepted.write_text("# why, in a comment\nCVE-0000-1  # an alias is enough\n")

    report_only = _audit(
        runtime, "--report-only", dev, "--pypi", registry, "--accepted", os.devnull
    )
    accepted_run = _audit(runtime, dev, "--pypi", registry, "--accepted", accepted)

    assert report_only.returncode == 0, report_only.stdout + report_only.stderr
    assert "vulnerable (report only): probe-vulnerable 1.0: PYSEC-0000-1" in report_only.stdout
    assert accepted_run.returncode == 0, accepted_run.stdout + accepted_run.stderr
    assert "probe-vulnerable" not in accepted_run.stdout
    assert accepted_run.stdout.count("0 with a known vulnerability") == 2


def test_a_registry_that_is_down_or_slow_leaves_releases_unaudited_without_failing(
    tmp_path, registry
):
    lock = _lock(tmp_path, "runtime.txt", "probe-slow==1.0", "probe-clean==1.0")
    dead = f"http://127.0.0.1:{_dead_port()}"

    down = _audit(lock, "--pypi", dead, "--accepted", os.devnull)
    started = time.monotonic()
    slow = _audit(lock, "--pypi", registry, "--accepted", os.devnull, timeout=2)
    took = time.monotonic() - started

    assert down.returncode == 0, down.stdout + down.stderr
    assert down.stdout.count("no answer from the registry") == 2
    assert slow.returncode == 0, slow.stdout + slow.stderr
    assert "not audited: probe-slow 1.0: no answer from the registry" in slow.stdout
    assert "1 by their project's latest record" in slow.stdout  # probe-clean
    assert took < SLOW_SECONDS  # the per-request timeout, not the registry, ended the wait
