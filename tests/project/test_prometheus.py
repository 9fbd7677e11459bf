"""The monitoring assets in deploy/ work against the real tools and the real gateway.

promtool checks the alert rules, runs their unit tests (deploy/prometheus/alerts.test.yml) and
checks the scrape configuration. Then a real Prometheus scrapes a real gateway under a mixed load,
and every expression of the Grafana dashboard and every alert's base expression (the rule without
its trailing comparison) must return data: a misspelt metric or label, or an expression that
returns nothing until some rare event happened, fails here rather than on an operator's screen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.client import MODEL
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.prometheus

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "llm-gateway.json"

#: What the test puts in for the dashboard's variables: all models, and a rate window that holds
#: enough 1 s scrapes (Grafana's $__rate_interval is at least four scrape intervals).
DASHBOARD_VARIABLES = {"model": ".*", "__rate_interval": "1m", "__interval": "15s"}
#: The trailing `<comparison> <number>` of an alert expression (alerts.yml's convention).
TRAILING_COMPARISON = re.compile(r"\s*(?:[<>]=?|[=!]=)\s*(?:bool\s+)?[-+]?[\d.]+(?:e[-+]?\d+)?\s*$")
DATA_DEADLINE = 30.0  # seconds for every expression to return data
#: Requests per minute for keys without their own limit: far above the load, but the per-key
#: limiter runs on every request.
DEFAULT_RPM = 1_000_000
#: The upstream gate is on, so `gateway_upstream_slots_in_use` and `..._queue_length` exist; the
#: load sends one request at a time, so it never queues.
UPSTREAM_MAX_CONCURRENT = 4


def _tool(name: str) -> str:
    """The path of a Prometheus tool; skip without it, except in CI where it must be installed."""
    path = shutil.which(name)
    if path is None:
        message = f"`{name}` is not on PATH: install the Debian package `prometheus`"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (.ci/run does)")
        pytest.skip(message)
    return path


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    # The executable is `shutil.which` of a fixed name, the arguments are this repo's files.
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)  # noqa: S603


def test_alert_rules_are_valid():
    promtool = _tool("promtool")

    checked = _run(promtool, "check", "rules", str(ALERTS))
    tested = _run(promtool, "test", "rules", str(ALERT_TESTS))

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_prometheus_config_is_valid(tmp_path: Path):
    promtool = _tool("promtool")
    # `rule_files` resolves against the configuration's directory, as in deploy/compose.yaml.
    shutil.copy(PROMETHEUS_CONFIG, tmp_path / "prometheus.yml")
    shutil.copy(ALERTS, tmp_path / "alerts.yml")

    checked = _run(promtool, "check", "config", str(tmp_path / "prometheus.yml"))

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "alerts.yml" in checked.stdout  # the rules were found and checked too


# --- expressions ------------------------------------------------------------------------------


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _substitute(expr: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in DASHBOARD_VARIABLES, f"unknown dashboard variable ${name} in {expr}"
        return DASHBOARD_VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def _dashboard_expressions() -> dict[str, str]:
    """`panel title [refId]` -> the PromQL Grafana would send, variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = {
        f"{panel['title']} [{target['refId']}]": _substitute(target["expr"])
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    }
    assert len(expressions) >= 10
    return expressions


def _alert_expressions() -> dict[str, str]:
    """Alert name -> its base expression (the rule without the trailing comparison)."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    expressions = {}
    for rule in (rule for group in groups for rule in group["rules"]):
        expr = rule["expr"].strip()
        base = TRAILING_COMPARISON.sub("", expr)
        assert base != expr, f"{rule['alert']}: no trailing `<comparison> <number>`"
        expressions[f"alert {rule['alert']}"] = base
    return expressions


# --- a real Prometheus ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _prometheus(binary: str, tmp_path: Path, target: str) -> Iterator[str]:
    """Run Prometheus scraping `target` every second; yields its base URL."""
    config = tmp_path / "prometheus-test.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {"job_name": "llm-gateway", "static_configs": [{"targets": [target]}]}
                ],
            }
        )
    )
    url = f"http://127.0.0.1:{_free_port()}"
    log_path = tmp_path / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(  # noqa: S603 (fixed executable and arguments)
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={url.removeprefix('http://')}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 15
            while not _ready(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"Prometheus did not start:\n{log_path.read_text()}")
                time.sleep(0.1)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _query(prometheus: httpx.Client, expr: str) -> list[dict[str, Any]]:
    body = prometheus.get("/api/v1/query", params={"query": expr}).json()
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _has_data(result: list[dict[str, Any]]) -> bool:
    """At least one sample, and not only NaN (a histogram quantile over no requests)."""
    return any(sample["value"][1] != "NaN" for sample in result)


# --- load -------------------------------------------------------------------------------------


AUTH_FAILURES_PER_MINUTE = 3
"""The gateway's per-address budget of failed authentications in the load below."""


def _drive_load(
    gw: Gateway, limited_key: str, emulator: Emulator, stop: threading.Event, errors: list[str]
) -> None:
    """Until `stop`: streamed and non-streamed generations, 401s, unknown models, and 429s from
    `limited_key` (1 request per minute, spent first); one upstream failure first (the emulator
    drops the connection mid-stream), so failure and rate-limit series exist too.
    """
    generate = f"{gw.url}/v1/generate"
    chat = f"{gw.url}/v1/chat"
    prompt = {"model": MODEL, "prompt": "hello"}
    messages = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(headers=gw.headers(), timeout=10) as client:
        emulator.config.fault = "drop_midstream"  # each request snapshots the config on arrival
        try:
            client.post(generate, json=prompt)
        except httpx.HTTPError:
            pass  # the failure is the point; the gateway may end the stream early
        finally:
            emulator.config.fault = None
        limited = gw.headers(limited_key)
        spent = client.post(generate, json={**prompt, "stream": False}, headers=limited)
        if spent.status_code != 200:
            errors.append(f"the limited key's one request a minute: {spent.status_code} != 200")
        bad_key = gw.headers("gw_bad_key")
        # The bad key: 401 until the address's budget of failed authentications is spent, then
        # 429 (both series must exist: the data check below).
        expected: list[tuple[Callable[[], httpx.Response], set[int]]] = [
            (lambda: client.post(generate, json=prompt), {200}),
            (lambda: client.post(chat, json={**messages, "stream": False}), {200}),
            (lambda: client.post(generate, json={**prompt, "stream": False}), {200}),
            (lambda: client.post(chat, json=messages), {200}),
            (lambda: client.post(generate, json=prompt, headers=bad_key), {401, 429}),
            (lambda: client.post(generate, json={**prompt, "model": "no-such:model"}), {404}),
            (lambda: client.post(generate, json=prompt, headers=limited), {429}),
        ]
        while not stop.is_set():
            for send, status in expected:
                try:
                    response = send()
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))
                    continue
                if response.status_code not in status:
                    errors.append(f"{response.request.url}: {response.status_code} != {status}")
            stop.wait(0.05)


def test_every_dashboard_and_alert_expression_returns_data(
    make_gateway: Callable[..., Gateway], emulator: Emulator, tmp_path: Path
):
    binary = _tool("prometheus")
    expressions = {**_dashboard_expressions(), **_alert_expressions()}
    emulator.config.ttft = 0.02
    emulator.config.inter_token = 0.002
    emulator.config.tokens = 8
    gw = make_gateway(
        upstream_poll_interval=0.5,
        default_rpm=DEFAULT_RPM,
        upstream_max_concurrent=UPSTREAM_MAX_CONCURRENT,
        # The load sends a bad key all along: its first failures are 401s, the rest 429s of
        # the address's budget, for GatewayAddressAuthFlood's series (valid keys from the same
        # address stay served: tests/limits/test_address_limits.py).
        auth_failures_per_minute=AUTH_FAILURES_PER_MINUTE,
    )
    _, limited_key = gw.create_key("limited", rpm=1)
    stop = threading.Event()
    load_errors: list[str] = []
    load = threading.Thread(target=_drive_load, args=(gw, limited_key, emulator, stop, load_errors))

    with (
        _prometheus(binary, tmp_path, gw.url.removeprefix("http://")) as url,
        httpx.Client(base_url=url, timeout=5) as prometheus,
    ):
        load.start()
        try:
            # rate() needs two scrapes of a series in its window: poll until every expression
            # has data rather than guessing a fixed wait.
            deadline = time.monotonic() + DATA_DEADLINE
            while True:
                results = {name: _query(prometheus, expr) for name, expr in expressions.items()}
                empty = {name: r for name, r in results.items() if not _has_data(r)}
                if not empty or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            models = prometheus.get(
                "/api/v1/label/model/values", params={"match[]": "gateway_requests_total"}
            ).json()["data"]
        finally:
            stop.set()
            load.join(15)

    assert not load_errors, load_errors[:5]
    assert not empty, "\n".join(f"{name}: {expressions[name]} -> {r}" for name, r in empty.items())
    # The dashboard's `model` variable: label_values(gateway_requests_total, model).
    assert MODEL in models
