"""The emulated GPU server's own load on `GET /metrics`, under vLLM's metric names.

Owns the one route a model server's scraper reads (`gateway.upstream.reported`, the Gateway
API Inference Extension's model server protocol), so routing on a server's own queue can be
tested against the emulator. In GPU mode (`EmulatorConfig.prefill_rate` above 0, as
`--gpu-profile` sets) it serves, per installed model (`model_name` label, as vLLM labels
its series), in the Prometheus text format (version 0.0.4):

* `vllm:num_requests_waiting`: the model's generations queued for a slot (`Runner.waiting`);
* `vllm:num_requests_running`: those holding a slot (`Runner.running`);
* `vllm:kv_cache_usage_perc`: its prefix cache's fill, tokens held / `cache_tokens`, 0 to 1.
  vLLM counts the blocks running requests hold (its free queue keeps cached blocks until
  they are evicted); the emulator's LRU cache only holds finished prompts, so its fill is how
  close the next prompt is to evicting one, the same question as seen from the router.

Outside GPU mode the path is Ollama's 404, as Ollama has no `/metrics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.testing.emulator.catalog import canonical
from gateway.testing.emulator.prefix import BLOCK_TOKENS
from gateway.testing.emulator.state import request_context

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.testing.emulator.config import EmulatorConfig
    from gateway.testing.emulator.runner import Runner

#: The text format's media type (Prometheus exposition format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_FAMILIES = (
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)


def _label(value: str) -> str:
    """A label value escaped as the text format wants (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _values(runner: Runner | None, config: EmulatorConfig) -> tuple[float, float, float]:
    """(waiting, running, KV usage) of one model's runner; zeros before its first request."""
    if runner is None:
        return 0.0, 0.0, 0.0
    held = len(runner.cache) * BLOCK_TOKENS if runner.cache is not None else 0
    usage = min(1.0, held / config.cache_tokens) if config.cache_tokens > 0 else 0.0
    return float(runner.waiting), float(runner.running), usage


def render(runners: dict[str, Runner], config: EmulatorConfig) -> str:
    """The `/metrics` body: each family with one sample per installed model (module docstring).

    Args:
        runners: The models' runners by canonical lower-case name (`Capacity.runners`).
        config: The emulator's knobs (its models and `cache_tokens`).

    Returns:
        The text exposition, newline-terminated.
    """
    names = sorted({canonical(model).lower() for model in config.models} | set(runners))
    rows = {name: _values(runners.get(name), config) for name in names}
    lines: list[str] = []
    for column, (family, help_text) in enumerate(_FAMILIES):
        lines += [f"# HELP {family} {help_text}", f"# TYPE {family} gauge"]
        lines += [f'{family}{{model_name="{_label(n)}"}} {v[column]!r}' for n, v in rows.items()]
    return "\n".join(lines) + "\n"


async def _metrics(request: Request) -> Response:
    """`GET /metrics`: the model server's own load (module docstring); 404 outside GPU mode."""
    state, config, _ = request_context(request)
    if config.prefill_rate <= 0:
        return PlainTextResponse("404 page not found", status_code=404)
    return Response(render(state.capacity.runners(), config), media_type=CONTENT_TYPE)


ROUTES = (Route("/metrics", _metrics, methods=["GET"]),)
"""The exporter's route, as `create_emulator_app` mounts it."""
