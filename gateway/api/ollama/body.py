"""The body check every Ollama route shares: `parse_body` and the model a body names.

`gateway.api.ollama.models` (`/api/show`) and `gateway.api.ollama.manage` (pull, create, copy,
delete, ...) read their bodies with it; the generation routes have their own schema
(`gateway.api.ollama.schema`), which requires `model`.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import UnprocessableError
from gateway.settings import Settings
from gateway.upstream.dialects.json_codec import THREADED_JSON
from gateway.wire.json import parse_object


def parse_body(raw: bytes, settings: Settings) -> dict[str, Any]:
    """Check a JSON body as every route does (`parse_object`), with `model` optional.

    Which field names the model is the route's to say: `/api/show` and the management routes
    also take the deprecated `name`, `/api/copy` has `source` and `destination`.

    Raises:
        BadRequestError, UnprocessableError: as `parse_object`, except for a missing model.
    """
    try:
        return parse_object(
            raw, max_depth=settings.max_json_depth, max_values=settings.max_json_values
        )
    except UnprocessableError:
        # Raised only after the body parsed. For an object, every check before the model's
        # passed; an absent or empty `model` is then the one thing left to tell apart.
        body = THREADED_JSON.decode(raw.decode())  # Python hooks: may run in a worker thread
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(body, dict) or (isinstance(model, str) and model.strip()):
            raise
    if "stream" in body and not isinstance(body["stream"], bool):
        raise UnprocessableError("stream must be true or false")
    return body


def requested_model(body: dict[str, Any]) -> str | None:
    """The model a body names: `model`, else the deprecated `name` (Go's `cmp.Or`), or None."""
    for field in ("model", "name"):
        value = body.get(field)
        if isinstance(value, str) and value:
            return value
    return None
