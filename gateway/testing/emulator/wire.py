"""How the Ollama emulator writes and reads JSON the way Ollama's Go server does (reference §1).

Owns the byte-level conventions every endpoint shares: Go `json.Marshal` encoding with HTML
escaping, the JSON content type, RFC3339Nano and local-offset timestamps, and decoding a request
body the way gin's `ShouldBindJSON` does, with Go's error texts for bodies it rejects.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import TYPE_CHECKING

from starlette.responses import Response

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.testing.emulator.state import ReceivedRequest

JSON_MEDIA_TYPE = "application/json; charset=utf-8"


def encode_json(obj: object) -> str:
    """Encode like Go's `json.Marshal`: compact, UTF-8, with `<`, `>`, `&` HTML-escaped."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    # These characters only occur inside JSON strings, so a plain replace is exact.
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def format_created_at() -> str:
    """RFC3339Nano in UTC with trailing fraction zeros trimmed, as Go prints it."""
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


def format_local_time(timestamp: float) -> str:
    """RFC3339 with the local offset (`modified_at`, `expires_at`)."""
    text = datetime.fromtimestamp(timestamp).astimezone().isoformat()
    return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text


def json_response(status: int, obj: object) -> Response:
    """Answer with one Go-encoded JSON body, like gin's `c.JSON`."""
    return Response(encode_json(obj), status_code=status, media_type=JSON_MEDIA_TYPE)


_GO_JSON_ERRORS = {
    "Expecting value": "looking for beginning of value",
    "Expecting property name enclosed in double quotes": (
        "looking for beginning of object key string"
    ),
    "Expecting ':' delimiter": "after object key",
    "Expecting ',' delimiter": "after object key:value pair",
    "Extra data": "after top-level value",
}


def _go_json_error(exc: json.JSONDecodeError) -> str:
    """Approximate the Go `encoding/json` error text for a malformed body (§1)."""
    if not exc.doc[exc.pos :].strip():
        return "unexpected EOF"
    where = _GO_JSON_ERRORS.get(exc.msg, "looking for beginning of value")
    return f"invalid character '{exc.doc[exc.pos]}' {where}"


def _reject_constant(name: str) -> object:
    """Refuse `NaN` and `Infinity`, which Python accepts and Go's decoder does not."""
    raise json.JSONDecodeError("Expecting value", name, name.startswith("-"))


def _go_kind(value: object) -> str:
    kinds = ((bool, "bool"), (str, "string"), (list, "array"), (dict, "object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "number")


async def read_json(
    request: Request, record: ReceivedRequest, struct: str, empty: str
) -> str | None:
    """Decode the body into `record.body` the way gin's `ShouldBindJSON` would (§1).

    Returns:
        None when the body is a usable object, else the 400 error text.
    """
    raw = (await request.body()).decode("utf-8", "replace")
    if not raw.strip():
        return empty
    try:
        record.body = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return _go_json_error(exc)
    if record.body is None:  # JSON null decodes into a zero struct
        record.body = {}
    if not isinstance(record.body, dict):
        return f"json: cannot unmarshal {_go_kind(record.body)} into Go value of type {struct}"
    model = record.body.get("model", "")
    return None if isinstance(model, str) else wrong_type(struct, "model", model, "string")


def wrong_type(struct: str, field: str, value: object, go_type: str) -> str:
    """Go's `encoding/json` text for a field of the wrong JSON type (§1).

    Args:
        struct: The Go type decoded into, e.g. `api.EmbedRequest`.
        field: The JSON field name.
        value: The decoded value that did not fit.
        go_type: The field's Go type, e.g. `string`, `int`, `bool`.
    """
    name = struct.rsplit(".", 1)[-1]
    return (
        f"json: cannot unmarshal {_go_kind(value)} into Go struct field {name}.{field}"
        f" of type {go_type}"
    )
