"""A faithful Ollama emulator for tests and benchmarks (reference: ollama-protocol.md, v0.33.0).

Owns assembling the emulated server (`create_emulator_app`) and its CLI (`main`), and is the
import point for its users: it re-exports the knobs and records from `state`. The parts,
each in its own `gateway.testing` module, in the order data flows through them:

* `front_door`: records every request, applies the loopback `Host`/`Origin` gates;
* `native` and `openai` (with `openai_request`): the generation
  routes of the `/api/*` and `/v1` faces and their shapes;
* `embed`: `/api/embed`, `/api/embeddings`, `/v1/embeddings`;
* `models` (listing, show, copy, delete, blobs, `/v1/models`) and `transfer`
  (pull, push, create progress), over the model facts of `catalog`;
* `content`: what an answer says (tokens, a JSON `format`, a tool call, logprobs);
* `engine`: the timing and fault engine both faces run on, via `dialect`;
* `capacity`: a server of known capacity: `parallel` slots per model and a FIFO queue
  (`max_queue`, then 503 busy), a per-token time that grows with the batch (`batch_slowdown`),
  and a model's cold load (`cold_load`), so a benchmark can be checked against a known truth,
  over one `runner` per model;
* `prefix`: prompt tokens and the per-model prefix (KV) cache of the GPU mode, `profiles` its
  named presets (`--gpu-profile`), `counters` and `control` what it served
  (`/emulator/stats`, `/emulator/events`, `/emulator/reset`, off Ollama's paths), `exporter`
  the GPU mode's own load on `/metrics` under vLLM's names (waiting, running, KV usage);
* `wire`: Go-style JSON, error texts and timestamps; `state`: config, records.

Fidelity items (reference §11 "Emulator"):

* headers go out with the first chunk, never before it (§1); nothing is sent while "loading";
* NDJSON, `application/json; charset=utf-8` and SSE content types; compact Go-style JSON with
  HTML escaping and RFC3339Nano `created_at` (§1);
* a final chunk with `done_reason`, `context` (generate only) and metrics in nanoseconds whose
  zero fields are omitted (§2.3); `stream: false` aggregation (§2.4); load/unload shortcuts (§2.5);
* the statuses and texts of §4.2, mid-stream error lines (§4.3, §4.4), the loopback `Host` and
  `Origin` gates (§6.8), and generation that stops, and is recorded, on a client disconnect (§5);
* tool calls in their own chunk (§3.2; OpenAI-style argument fragments on `/v1`, §7.1), JSON
  `format` / `response_format` answers, `logprobs`;
* embeddings (§6.6, §7.4), `/api/show` and `/v1/models/{model}` (§6.5, §7.3), and model
  management whose pulls, copies, creates and deletes `/api/tags` reflects (§6.7).

Run it with `python -m gateway.testing.emulator --port 11434`, or in-process with
`gateway.testing.server.LoopbackServer(create_emulator_app(config))`. A server of known capacity:
`--parallel 4 --batch-slowdown 0.1 --max-queue 16 --load-duration 2 --ttft 0.2 --inter-token 0.02`
runs 4 generations per model at once with a gap of 0.02 * (1 + 0.1 * (b - 1)) s per token, queues
16 more, and makes each model's first request wait 2 s for its load; `--llamacpp-timings` adds
llama.cpp server's `timings` on `/v1`. See `gateway.testing.emulator.capacity` for the truth.
A GPU server (residency, memory, prefix cache; docs/benchmarking.md): `--gpu-profile
rtx3090-llama3.1-8b --preload llama3.2`.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
from collections.abc import Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from gateway.testing.emulator import (
    control,
    embed,
    exporter,
    models,
    native,
    openai,
    profiles,
    transfer,
)
from gateway.testing.emulator.config import FAULTS, EmulatorConfig, Fault
from gateway.testing.emulator.front_door import FrontDoor
from gateway.testing.emulator.state import EmulatorState, Outcome, ReceivedRequest

__all__ = [
    "FAULTS",
    "EmulatorConfig",
    "EmulatorState",
    "Fault",
    "Outcome",
    "ReceivedRequest",
    "create_emulator_app",
    "main",
    "parse_args",
]


async def _not_found(request: Request, exc: Exception) -> Response:  # noqa: ARG001
    return PlainTextResponse("404 page not found", status_code=404)


async def _not_allowed(request: Request, exc: Exception) -> Response:  # noqa: ARG001
    return PlainTextResponse("405 method not allowed", status_code=405)


def create_emulator_app(config: EmulatorConfig | None = None) -> Starlette:
    """Build the emulator app; `app.state.emulator` is its `EmulatorState`.

    Args:
        config: The knobs; tests may keep a reference and change it between requests.

    Returns:
        A Starlette app serving the endpoints of reference §2, §3, §6 and §7.
    """
    state = EmulatorState(config or EmulatorConfig())
    routes = (
        native.ROUTES,
        models.ROUTES,
        transfer.ROUTES,
        embed.ROUTES,
        openai.ROUTES,
        control.ROUTES,
        exporter.ROUTES,
    )
    app = Starlette(
        routes=[route for family in routes for route in family],
        middleware=[Middleware(FrontDoor, state=state)],
        exception_handlers={404: _not_found, 405: _not_allowed},
    )
    app.state.emulator = state
    return app


def _json_object(text: str) -> dict[str, Any]:
    """Parse a `--tool-arguments` value; argparse reports the error."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return value


def parse_args(argv: Sequence[str] | None = None) -> tuple[EmulatorConfig, argparse.Namespace]:
    """Read the command line into the knobs, and the server options (`host`, `port`, ...).

    Args:
        argv: Command-line arguments without the program name; `sys.argv[1:]` when None.

    Returns:
        The config, and every parsed option.

    Raises:
        SystemExit: On `--help` or an invalid option (argparse).
    """
    defaults = EmulatorConfig()
    parser = argparse.ArgumentParser(
        prog="python -m gateway.testing.emulator", description="Run the Ollama emulator."
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    parser.add_argument("--port", type=int, default=11434, help="port (default: %(default)s)")
    parser.add_argument("--models", default=",".join(defaults.models), help="comma-separated")
    parser.add_argument("--ttft", type=float, default=defaults.ttft, help="seconds to first chunk")
    parser.add_argument("--inter-token", type=float, default=defaults.inter_token)
    parser.add_argument("--tokens", type=int, default=defaults.tokens)
    parser.add_argument("--thinking-tokens", type=int, default=defaults.thinking_tokens)
    parser.add_argument("--fault", choices=sorted(FAULTS), default=None)
    parser.add_argument("--fault-after", type=int, default=defaults.fault_after)
    parser.add_argument("--embedding-dimensions", type=int, default=defaults.embedding_dimensions)
    parser.add_argument(
        "--context-length",
        type=int,
        default=defaults.context_length,
        help="loaded context in words; longer embedding inputs are truncated",
    )
    parser.add_argument(
        "--tool-call",
        action="store_true",
        help="answer chat requests that offer tools with a call to the first tool",
    )
    parser.add_argument(
        "--tool-arguments",
        type=_json_object,
        default=None,
        help="the tool call's arguments as a JSON object (default: from its schema)",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=_prompt_tokens,
        default=defaults.prompt_eval_count,
        metavar="N|count",
        help="prompt tokens every answer reports (prompt_eval_count, usage.prompt_tokens), or "
        "'count': the prompt's whitespace-separated words, at least 1 (default: %(default)s)",
    )
    parser.add_argument(
        "--registry", default=None, help="comma-separated models /api/pull can fetch (default: any)"
    )
    capacity = parser.add_argument_group(
        "capacity", "a server of known capacity (gateway.testing.emulator.capacity)"
    )
    capacity.add_argument(
        "--parallel",
        type=int,
        default=defaults.parallel,
        metavar="N",
        help="generations per model at once, the rest queue FIFO (0: unlimited, the default)",
    )
    capacity.add_argument(
        "--batch-slowdown",
        type=float,
        default=defaults.batch_slowdown,
        metavar="K",
        help="per-token gap = inter-token * (1 + K * (b - 1)), b = the model's running "
        "generations (default: %(default)s)",
    )
    capacity.add_argument(
        "--max-queue",
        type=int,
        default=defaults.max_queue,
        metavar="N",
        help="requests that may wait for a slot; more get 503 busy (default: unbounded)",
    )
    capacity.add_argument(
        "--load-duration",
        type=float,
        default=defaults.cold_load,
        metavar="SECONDS",
        help="cold load of a model's first request after start or keep_alive 0, reported as "
        "load_duration; /api/ps lists only loaded models (default: 0, all loaded)",
    )
    profiles.add_arguments(parser)
    capacity.add_argument(
        "--llamacpp-timings",
        action="store_true",
        help="add llama.cpp server's `timings` to the last /v1 chunk and stream: false body",
    )
    parser.add_argument("--http", choices=["h11", "httptools"], default="httptools")
    levels = ["debug", "info", "warning", "error"]
    parser.add_argument("--log-level", default="info", choices=levels)
    preset_size = profiles.apply_preset(parser, argv)
    args = parser.parse_args(argv)
    try:  # Ollama only gates Host while it listens on a loopback address (§6.8)
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    config = EmulatorConfig(
        models=[name for name in args.models.split(",") if name],
        ttft=args.ttft,
        inter_token=args.inter_token,
        tokens=args.tokens,
        thinking_tokens=args.thinking_tokens,
        fault=args.fault,
        fault_after=args.fault_after,
        host_gate=loopback,
        embedding_dimensions=args.embedding_dimensions,
        context_length=args.context_length,
        tool_call=args.tool_call,
        tool_arguments=args.tool_arguments,
        registry=None if args.registry is None else [n for n in args.registry.split(",") if n],
        parallel=args.parallel,
        batch_slowdown=args.batch_slowdown,
        max_queue=args.max_queue,
        cold_load=args.load_duration,
        llamacpp_timings=args.llamacpp_timings,
        prompt_eval_count=args.prompt_tokens,
        **profiles.gpu_knobs(parser, args, preset_size),
    )
    return config, args


def _prompt_tokens(text: str) -> int | None:
    """`--prompt-tokens`: a count of at least 0, or `count` (None: count the prompt's words)."""
    if text == "count":
        return None
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run the emulator under uvicorn until interrupted.

    Args:
        argv: Command-line arguments without the program name; `sys.argv[1:]` when None.

    Returns:
        The process exit status.
    """
    config, args = parse_args(argv)
    uvicorn.run(
        create_emulator_app(config),
        host=args.host,
        port=args.port,
        http=args.http,
        ws="none",
        log_level=args.log_level,
        server_header=False,  # Ollama (Go net/http) sends no Server header
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
