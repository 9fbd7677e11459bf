"""The two dialects a benchmark speaks: what to send, and how to read the streamed answer.

Owns `Target` (where and how to reach the server under test; its key never appears in a repr),
and `build_request` (the path and JSON body of one generation, Ollama `/api/*` or OpenAI
`/v1/*`). How the answer is read, `AnswerReader`, lives in `gateway.clients.bench.reader` (its own
concern: a sans-IO parser) and is re-exported here with `Api`, so a caller imports the dialects
from one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from gateway.clients.bench.reader import AnswerReader, Api, error_text
from gateway.clients.bench.workload import Prompt, Sampling

__all__ = ["AnswerReader", "Api", "Surface", "Target", "build_request", "error_text"]

Surface = Literal["", "responses", "messages"]
"""The agent surfaces beside chat/generate: "" (none: `chat` decides), `responses` (OpenAI
Responses, `POST /v1/responses`), `messages` (Anthropic Messages, `POST /v1/messages`)."""

#: The `anthropic-version` a Messages request names (Anthropic API reference, "Versions").
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class Target:
    """The server under test.

    Attributes:
        url: Base URL, `http://host:port` or `https://...`, optionally with a path prefix.
        api: The dialect to speak.
        key: The API key sent as `Authorization: Bearer`, or None; never in the repr.
        chat: Ask the chat endpoint (messages); else generate/completions (text).
        timeout: Seconds one answer may take, from sending to its end.
        surface: `responses` or `messages` to ask an agent surface instead (OpenAI API only,
            `chat` then True); "" for chat/generate.

    Raises:
        ValueError: the URL is not http(s) with a host, `api` or `surface` is unknown, or a
            surface is asked of the Ollama API.
    """

    url: str
    api: Api
    key: str | None = field(default=None, repr=False)
    chat: bool = True
    timeout: float = 300.0
    surface: Surface = ""

    def __post_init__(self) -> None:
        """Check the URL and the dialect at once, before any connection is tried."""
        parts = urlsplit(self.url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"target URL must be http(s)://host[:port], got {self.url!r}")
        if self.api not in {"ollama", "openai"}:
            raise ValueError(f"api must be ollama or openai, got {self.api!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive, got {self.timeout}")
        if self.surface not in {"", "responses", "messages"}:
            raise ValueError(f"surface must be responses or messages, got {self.surface!r}")
        if self.surface and (self.api != "openai" or not self.chat):
            raise ValueError(f"/v1/{self.surface} is an OpenAI-API chat surface")

    @property
    def tls(self) -> bool:
        """The target speaks HTTPS."""
        return urlsplit(self.url).scheme == "https"

    @property
    def host(self) -> str:
        """The host name or address."""
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        """The port (80 or 443 when the URL names none)."""
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def safe_url(self) -> str:
        """The URL for messages: scheme, host, port and prefix, never a user or password."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{self.host}:{self.port}{self.base_path}"

    @property
    def base_path(self) -> str:
        """The URL's path prefix without a trailing slash ("" for none)."""
        return urlsplit(self.url).path.rstrip("/")

    def headers(self, *, json_body: bool = True) -> dict[str, str]:
        """The request headers: content type, accept, and the key when there is one."""
        headers = {"Accept": "application/x-ndjson, text/event-stream, application/json"}
        if json_body:
            headers["Content-Type"] = "application/json"
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        if self.surface == "messages":
            headers["anthropic-version"] = ANTHROPIC_VERSION
        return headers


def build_request(
    target: Target,
    model: str,
    prompt: Prompt,
    sampling: Sampling,
    *,
    keep_alive: str | int | None = None,
) -> tuple[str, bytes]:
    """The path (with the target's prefix) and JSON body of one streamed generation.

    Ollama: `/api/chat` (messages) or `/api/generate` (text), `options` with `temperature`,
    `seed`, `num_predict`. OpenAI: `/v1/chat/completions` or `/v1/completions` with
    `max_tokens`, `temperature`, `seed` and `stream_options.include_usage` (so the counts come
    from the server). The endpoint follows `target.chat`; a chat prompt sent to a text endpoint
    is joined into one text, a text prompt to a chat endpoint becomes one user message. With
    `target.surface`, `/v1/responses` or `/v1/messages` instead (`_surface_body`). The output
    limit is the prompt's `max_tokens` when it has one, else the sampling's.

    Args:
        target: The server (its dialect, `chat`, surface and path prefix).
        model: The model to name.
        prompt: What to ask.
        sampling: Temperature, seed and output limit.
        keep_alive: Ollama's `keep_alive` (how long the model stays loaded); ignored on OpenAI.
    """
    body: dict[str, Any] = {"model": model, "stream": True}
    limit = prompt.max_tokens or sampling.max_tokens
    if target.surface:
        path = _surface_body(target.surface, body, prompt, sampling, limit)
    elif target.api == "ollama":
        if target.chat:
            path = "/api/chat"
            body["messages"] = prompt.as_messages()
        else:
            path = "/api/generate"
            body["prompt"] = prompt.as_text()
        body["options"] = {
            "temperature": sampling.temperature,
            "seed": sampling.seed,
            "num_predict": limit,
        }
        if keep_alive is not None:
            body["keep_alive"] = keep_alive
    else:
        if target.chat:
            path = "/v1/chat/completions"
            body["messages"] = prompt.as_messages()
        else:
            path = "/v1/completions"
            body["prompt"] = prompt.as_text()
        body["max_tokens"] = limit
        body["temperature"] = sampling.temperature
        body["seed"] = sampling.seed
        body["stream_options"] = {"include_usage": True}
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return target.base_path + path, text.encode()


def _surface_body(
    surface: Surface, body: dict[str, Any], prompt: Prompt, sampling: Sampling, limit: int
) -> str:
    """Fill `body` for an agent surface; return its path (without the target's prefix).

    Responses (OpenAI API reference, "Create a model response"): `input` as role/content
    messages, `max_output_tokens`, `temperature`. Messages (Anthropic API reference, "Messages"):
    system messages joined into the top-level `system`, the rest as `messages`, `max_tokens`,
    `temperature`. Neither takes a `seed`: with temperature 0 the answer is greedy anyway.
    """
    messages = prompt.as_messages()
    body["temperature"] = sampling.temperature
    if surface == "responses":
        body["input"] = messages
        body["max_output_tokens"] = limit
        return "/v1/responses"
    system = [str(m["content"]) for m in messages if m.get("role") == "system"]
    if system:
        body["system"] = "\n\n".join(system)
    body["messages"] = [m for m in messages if m.get("role") != "system"]
    body["max_tokens"] = limit
    return "/v1/messages"
