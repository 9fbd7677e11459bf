"""The checks before a run: can the target be reached, does it take the key, has it the model.

Owns `BenchError` (re-exported by `gateway.clients.bench.driver`, where the runner imports it from),
`check_target` (reachability, auth, the model, whether our gateway is in front, what the server
says about itself) and `cold_load` (an Ollama model's load time, measured by unloading it
first). Every failure is one clear sentence for the operator; none shows the key.
"""

from __future__ import annotations

import json
from typing import Any

import httptools

from gateway.clients.bench import wire
from gateway.clients.bench.exchange import Client
from gateway.clients.bench.protocol import Target, build_request, error_text
from gateway.clients.bench.stats import escape_error
from gateway.clients.bench.workload import Prompt, Sampling
from gateway.model_names import canonical_model

#: Seconds to connect and to answer one check.
CHECK_TIMEOUT = 10.0


class BenchError(RuntimeError):
    """The target cannot be benchmarked: unreachable, the key refused, the model unknown."""


async def _ask(
    target: Target, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, bytes]:
    """One small request to the target; connection failures become a `BenchError`."""
    where = target.safe_url
    data = b"" if body is None else json.dumps(body).encode()
    try:
        return await wire.fetch(
            target.host,
            target.port,
            method,
            target.base_path + path,
            body=data,
            headers=target.headers(json_body=body is not None),
            tls=target.tls,
            timeout=CHECK_TIMEOUT,
        )
    except ConnectionRefusedError:
        raise BenchError(f"cannot reach {where}: connection refused") from None
    except TimeoutError:
        raise BenchError(f"cannot reach {where}: no answer within {CHECK_TIMEOUT:g} s") from None
    except (OSError, httptools.HttpParserError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise BenchError(f"cannot reach {where}: {escape_error(reason)}") from None


def _json(target: Target, path: str, status: int, body: bytes) -> dict[str, Any]:
    """The JSON answer of a check, or a `BenchError` naming the refusal or the bad answer."""
    if status in {401, 403}:
        if not target.key:
            raise BenchError(
                f"the target wants an API key ({status}): set GATEWAY_BENCH_API_KEY or pass "
                "--key-file"
            )
        raise BenchError(
            f"the target refused the key ({status}): check GATEWAY_BENCH_API_KEY or --key-file"
        )
    if status != 200:
        # A 404 on one API's path usually means the server speaks the other one.
        hint = ""
        if status == 404:
            other, kind = (
                ("openai", "OpenAI-compatible")
                if target.api == "ollama"
                else (
                    "ollama",
                    "Ollama",
                )
            )
            hint = f" (is it an {kind} server? --api {other})"
        raise BenchError(
            f"{target.safe_url}{path} answered HTTP {status}: {error_text(body)}{hint}"
        )
    found = _object(body)
    if found is None:
        raise BenchError(f"{target.safe_url}{path} answered something that is no JSON object")
    return found


def _object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None: not JSON, nested too deep, or no object."""
    try:
        found = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def _text(value: object) -> str | None:
    """A server-reported name for the fingerprint: a short escaped string, or None."""
    if value is None or isinstance(value, dict | list):
        return None
    return escape_error(str(value), 120)


def _same_model(listed: str, model: str) -> bool:
    """The gateway's own name rule (`gateway.model_names`): `:latest` by default, any case."""
    return canonical_model(listed) == canonical_model(model)


def _unknown(model: str, names: list[str], through: bool) -> BenchError:
    shown = ", ".join(escape_error(n, 60) for n in names[:10]) or "none"
    # The gateway lists only the models the key may use: absent may mean not allowed.
    whose = " or the key may not use it" if through else ""
    return BenchError(f"the target has no model {model!r}{whose} (it lists: {shown})")


async def check_target(target: Target, model: str) -> dict[str, Any]:
    """Check the target before a run: reachable, the key accepted, the model present.

    Returns:
        `{"through_gateway": bool, "server": {...}}`: through_gateway when `GET /metrics`
        answers with a `gateway_` metric family (our gateway); `server` for Ollama holds
        `api`, `version` (`/api/version`), `model`, `digest` (`/api/tags`) and
        `quantization_level`, `parameter_size`, `family`, `format` (`/api/show` details), for
        OpenAI `api`, `id` and `owned_by` (`/v1/models`). Unknown values are None.

    Raises:
        BenchError: connection refused or failed, the key refused (401/403), the model not
            listed (or 404 from `/api/show`), an answer that is not JSON.
    """
    status, body = await _ask(target, "GET", "/metrics")
    text = body.decode("utf-8", "replace") if status == 200 else ""
    through = any(
        line.startswith(("gateway_", "# TYPE gateway_", "# HELP gateway_"))
        for line in text.splitlines()
    )
    if target.api == "openai":
        listing = _json(target, "/v1/models", *await _ask(target, "GET", "/v1/models"))
        data = listing.get("data")
        entries = [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
        # The exact id first; then Ollama's rule (`llama3.2` is `llama3.2:latest`), which
        # Ollama's own /v1 and the gateway's OpenAI surface follow when they answer.
        entry = next((e for e in entries if e.get("id") == model), None) or next(
            (e for e in entries if _same_model(str(e.get("id")), model)), None
        )
        if entry is None:
            raise _unknown(model, [str(e.get("id")) for e in entries], through)
        server = {
            "api": "openai",
            "id": _text(entry.get("id")),
            "owned_by": _text(entry.get("owned_by")),
        }
        return {"through_gateway": through, "server": server}
    tags = _json(target, "/api/tags", *await _ask(target, "GET", "/api/tags"))
    listed = tags.get("models")
    models = [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
    tag = next(
        (m for m in models if _same_model(str(m.get("name") or m.get("model")), model)), None
    )
    if tag is None:
        raise _unknown(model, [str(m.get("name") or m.get("model")) for m in models], through)
    status, body = await _ask(target, "GET", "/api/version")
    answer = _object(body) if status == 200 else None
    version = None if answer is None else _text(answer.get("version"))
    show = _json(target, "/api/show", *await _ask(target, "POST", "/api/show", {"model": model}))
    details = show.get("details")
    details = details if isinstance(details, dict) else {}
    keys = ("quantization_level", "parameter_size", "family", "format")
    server = {
        "api": "ollama",
        "version": version,
        "model": _text(tag.get("name") or tag.get("model")),
        "digest": _text(tag.get("digest")),
        **{k: _text(details.get(k)) for k in keys},
    }
    return {"through_gateway": through, "server": server}


async def cold_load(target: Target, model: str) -> dict[str, Any] | None:
    """Ollama only: unload the model, ask once, report the load (None on the OpenAI api).

    The unload is `/api/generate` with `keep_alive: 0` and no prompt; the request after it
    pays the load.

    Returns:
        `{"load_seconds"` (the server's `load_duration`), `"ttft_seconds"` (client clock),
        `"ok"`, `"error"}`, or None for `api="openai"` (no portable unload or load counter).

    Raises:
        BenchError: the target is unreachable, refuses the key or the unload.
    """
    if target.api != "ollama":
        return None
    unload = {"model": model, "keep_alive": 0}
    _json(target, "/api/generate", *await _ask(target, "POST", "/api/generate", unload))
    prompt, sampling = Prompt("cold-load", text="Hello"), Sampling(max_tokens=8)
    path, body = build_request(target, model, prompt, sampling)
    request = wire.request_bytes("POST", target.host, target.port, path, body, target.headers())
    client = Client(target)
    try:
        record = await client.exchange(request, model, prompt.id, warmup=False)
    finally:
        client.close()
    return {
        "load_seconds": record.load_seconds,
        "ttft_seconds": record.ttft,
        "ok": record.ok,
        "error": record.error,
    }
