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
from typing import Any
from urllib.parse import urlsplit

from gateway.clients.bench.reader import AnswerReader, Api, error_text
from gateway.clients.bench.workload import Prompt, Sampling

__all__ = ["AnswerReader", "Api", "Target", "build_request", "error_text"]


@dataclass(frozen=True)
class Target:
    """The server under test.

    Attributes:
        url: Base URL, `http://host:port` or `https://...`, optionally with a path prefix.
        api: The dialect to speak.
        key: The API key sent as `Authorization: Bearer`, or None; never in the repr.
        chat: Ask the chat endpoint (messages); else generate/completions (text).
        timeout: Seconds one answer may take, from sending to its end.

    Raises:
        ValueError: the URL is not http(s) with a host, or `api` is unknown.
    """

    url: str
    api: Api
    key: str | None = field(default=None, repr=False)
    chat: bool = True
    timeout: float = 300.0

    def __post_init__(self) -> None:
        """Check the URL and the dialect at once, before any connection is tried."""
        parts = urlsplit(self.url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError(f"target URL must be http(s)://host[:port], got {self.url!r}")
        if self.api not in {"ollama", "openai"}:
            raise ValueError(f"api must be ollama or openai, got {self.api!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive, got {self.timeout}")

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
    is joined into one text, a text prompt to a chat endpoint becomes one user message.

    Args:
        target: The server (its dialect, `chat` and path prefix).
        model: The model to name.
        prompt: What to ask.
        sampling: Temperature, seed and output limit.
        keep_alive: Ollama's `keep_alive` (how long the model stays loaded); ignored on OpenAI.
    """
    body: dict[str, Any] = {"model": model, "stream": True}
    if target.api == "ollama":
        if target.chat:
            path = "/api/chat"
            body["messages"] = prompt.as_messages()
        else:
            path = "/api/generate"
            body["prompt"] = prompt.as_text()
        body["options"] = {
            "temperature": sampling.temperature,
            "seed": sampling.seed,
            "num_predict": sampling.max_tokens,
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
        body["max_tokens"] = sampling.max_tokens
        body["temperature"] = sampling.temperature
        body["seed"] = sampling.seed
        body["stream_options"] = {"include_usage": True}
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return target.base_path + path, text.encode()
