"""Reading a gateway's Prometheus text, and waiting on what it reports."""

from __future__ import annotations

import time

from tests.support.stack import Gateway


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum the samples of `name` in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


def wait_polled(gw: Gateway, count: int) -> None:
    """Wait (up to 5 s) until the gateway's monitor has seen `count` upstreams up."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if metric_value(gw.metrics_text(), "gateway_upstream_up") >= count:
            return
        time.sleep(0.05)
