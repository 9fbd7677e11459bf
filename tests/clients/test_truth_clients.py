"""What a real client measures is what the gateway exports, on every surface and dialect.

The emulator waits a known TTFT, then sends tokens at a known rate; the `ollama` client (NDJSON)
and the `openai` SDK (SSE) time the first generated text and the rate of the rest themselves.
The gateway's TTFT histogram must agree with the client's clock, and its decode rate with both
(F-16, F-17 of ../shared/reference/field-failures.md, on the new surfaces).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import ollama
import openai
import pytest

from tests.support.client import MODEL, assert_ttft
from tests.support.metrics import metric_value
from tests.support.stack import Emulator, Gateway

pytestmark = pytest.mark.clients

TTFT = 0.3  # seconds before the emulator's first chunk
INTER_TOKEN = 0.02  # seconds between chunks: 50 tokens/s
TOKENS = 20
MESSAGES = [{"role": "user", "content": "hi"}]


#: Yielded by a stream just before it sends its request: the client's clock starts there, not
#: while the SDK builds its client.
START = "<start>"


def _ollama_stream(gw: Gateway) -> Iterator[str]:
    with ollama.Client(host=gw.url, headers=gw.headers()) as client:
        yield START
        for part in client.chat(model=MODEL, messages=MESSAGES, stream=True):
            yield part.message.content or ""


def _openai_stream(gw: Gateway) -> Iterator[str]:
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0) as client:
        yield START
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        for event in stream:
            yield (event.choices[0].delta.content or "") if event.choices else ""


def _responses_stream(gw: Gateway) -> Iterator[str]:
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.key, max_retries=0) as client:
        yield START
        for event in client.responses.create(model=MODEL, input="hi", stream=True):
            yield event.delta if event.type == "response.output_text.delta" else ""


SURFACES: dict[str, Callable[[Gateway], Iterator[str]]] = {
    "/api/chat": _ollama_stream,
    "/v1/chat/completions": _openai_stream,
    "/v1/responses": _responses_stream,
}


def _client_timings(stream: Iterator[str]) -> tuple[float, float]:
    """(TTFT, decode tokens/s) as the client sees them: first text, then (n-1)/span."""
    assert next(stream) == START
    start = time.perf_counter()
    arrivals = [time.perf_counter() - start for text in stream if text]
    assert len(arrivals) == TOKENS
    return arrivals[0], (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def _exported(gw: Gateway) -> dict[str, float]:
    text = gw.metrics_text()
    labels = {"model": MODEL}
    return {
        "ttft": metric_value(text, "gateway_time_to_first_token_seconds_sum", **labels),
        "count": metric_value(text, "gateway_time_to_first_token_seconds_count", **labels),
        "rate": metric_value(text, "gateway_output_tokens_per_second_sum", **labels),
        "tokens": metric_value(text, "gateway_output_tokens_total", **labels),
    }


@pytest.mark.parametrize("dialect", ["ollama", "openai"])
@pytest.mark.parametrize("route", list(SURFACES))
def test_client_measured_ttft_and_rate_match_the_exported_ones(
    make_gateway: Callable[..., Gateway], emulator: Emulator, dialect: str, route: str
) -> None:
    gw = make_gateway(upstream_dialect=dialect)
    emulator.config.ttft = emulator.config.inter_token = 0.001
    list(SURFACES[route](gw))  # warm-up: connections and lazy set-up are paid once
    before = _exported(gw)
    emulator.config.ttft, emulator.config.inter_token, emulator.config.tokens = (
        TTFT,
        INTER_TOKEN,
        TOKENS,
    )
    client_ttft, client_rate = _client_timings(SURFACES[route](gw))
    deadline = time.monotonic() + 5  # the finish is recorded just after the last byte
    while (exported := _exported(gw))["count"] - before["count"] < 1:
        assert time.monotonic() < deadline, "the request was never recorded"
        time.sleep(0.02)
    ttft = exported["ttft"] - before["ttft"]
    rate = exported["rate"] - before["rate"]
    assert_ttft(ttft, client_ttft, TTFT)
    assert rate == pytest.approx(client_rate, rel=0.15)
    assert rate == pytest.approx(1 / INTER_TOKEN, rel=0.15)
    assert exported["tokens"] - before["tokens"] == TOKENS
