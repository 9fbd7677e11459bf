"""A model's size for the matrix: from the server where it tells, else from the user.

Where each number comes from (the model entry's `size.source` names it):

- Ollama: `GET /api/tags` `size` (the bytes on disk), `GET /api/ps` `size`, `size_vram`
  (resident and on the GPU, while the model is loaded), `POST /api/show`
  `model_info["general.parameter_count"]`.
- llama.cpp's `llama-server`: `GET /v1/models`, whose entries carry `meta` with `size` (the
  weights' bytes) and `n_params` (llama.cpp tools/server: `model_meta()`); else `GET /props`
  `model_path`, read as a local file when the target is on this machine (a loopback address).
- Any other server (llama-cpp-python, vLLM): nothing; `--size NAME=4.1GB` or
  `--size NAME=/path/model.gguf` (a GGUF file's bytes are its size on disk) fills the gap.

The server's number is kept when it tells one (it describes what is served, a file given by
hand may not); a user's value it overrides is noted. Every read is bounded in time and bytes
(`resources.get_json`), and a server that answers nothing useful leaves the size unknown.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from gateway.clients.bench.resources import (
    MAX_ANSWER,
    SAMPLE_DEADLINE,
    disk_size,
    get_json,
    loaded_memory,
)
from gateway.clients.bench.stats import escape_error

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: The largest `--size` taken, bytes (1 PB): more is a typo, and 10^400 no float at all.
MAX_SIZE = 10**15
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SizeHint:
    """A size the user gave: bytes on disk and where they came from.

    Attributes:
        disk_bytes: The size, bytes.
        source: `--size` for a number, `--size file` for a file's size.
    """

    disk_bytes: int
    source: str


def parse_size(text: str) -> tuple[str | None, SizeHint]:
    """Read one `--size` value: `[MODEL=]AMOUNT` or `[MODEL=]PATH`.

    AMOUNT is a number with an optional unit (`4.1GB`, `253MB`, `3.8GiB`, `1200000000`; SI
    units are powers of 10, `KiB`... powers of 2); PATH an existing file (its size). Without
    `MODEL=` the value applies to every model of the run.

    Returns:
        The model (None: every model) and the hint.

    Raises:
        ValueError: neither an amount nor an existing file.
    """
    model, sep, value = text.partition("=")
    if not sep:
        model, value = "", text
    model = model.strip()
    found = _AMOUNT.match(value)
    if found:
        number, unit = found.groups()
        amount = float(number) * _UNITS[(unit or "").lower()]
        if not math.isfinite(amount) or amount > MAX_SIZE:
            raise ValueError(f"--size {escape_error(text, 60)!r}: larger than any model (1 PB)")
        size = round(amount)  # 4.1 * 1e9 is 4099999999.99
        return (model or None), SizeHint(size, "--size")
    path = Path(value.strip()).expanduser()
    if path.is_file():
        return (model or None), SizeHint(path.stat().st_size, f"--size file {path.name}")
    raise ValueError(
        f"--size {text!r}: neither an amount (4.1GB, 253MB) nor an existing file"
        " (MODEL=/path/model.gguf)"
    )


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _whole(value: object) -> int | None:
    # A size of 0 is none (the gateway lists an OpenAI upstream's models with size 0).
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    try:
        return int(value)
    except (OverflowError, ValueError):
        return None


async def _ollama_parameters(client: httpx.AsyncClient, model: str) -> int | None:
    """Ollama's `POST /api/show` `model_info["general.parameter_count"]`, or None.

    Bounded as `resources.get_json` (`SAMPLE_DEADLINE`, `MAX_ANSWER`): the answer carries the
    template and the licence, and a server may send more.
    """
    try:
        async with (
            asyncio.timeout(SAMPLE_DEADLINE),
            client.stream("POST", "/api/show", json={"model": model}) as response,
        ):
            response.raise_for_status()
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > MAX_ANSWER:
                    return None
        shown = json.loads(body)
    except (TimeoutError, httpx.HTTPError, ValueError, RecursionError):
        return None
    info = shown.get("model_info") if isinstance(shown, Mapping) else None
    return _whole(info.get("general.parameter_count")) if isinstance(info, Mapping) else None


async def _openai_meta(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
    """llama.cpp's `/v1/models` `meta` of this model (`size`, `n_params`), or `{}`."""
    try:
        listing = await get_json(client, "/v1/models")
    except (httpx.HTTPError, ValueError):
        return {}
    data = listing.get("data") if isinstance(listing, Mapping) else None
    entries = [e for e in data if isinstance(e, Mapping)] if isinstance(data, list) else []
    entry = next((e for e in entries if e.get("id") == model), None)
    if entry is None and len(entries) == 1:
        entry = entries[0]  # a single-model llama-server answers any name with its model
    meta = entry.get("meta") if entry is not None else None
    return dict(meta) if isinstance(meta, Mapping) else {}


#: The first bytes of every GGUF file (ggml docs/gguf.md, "File Structure": magic `GGUF`).
GGUF_MAGIC = b"GGUF"


def _gguf_file(path: Path) -> bool:
    """`path` is a regular file named `*.gguf` starting with `GGUF_MAGIC`.

    Opened without blocking and checked again once open: a path a server names must not make
    the client wait on a FIFO or a device, nor report the size of any file it did not mean.
    """
    if path.suffix.lower() != ".gguf":
        return False
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return False
        return os.read(descriptor, len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False
    finally:
        os.close(descriptor)


async def _props_file(
    client: httpx.AsyncClient, model: str, notes: list[str] | None = None
) -> Path | None:
    """The model file `/props` names (`model_path`), when it is a GGUF file on this machine.

    Anything else it names (another kind of file, a directory, a device) is ignored, with a
    note when the path exists.
    """
    try:
        # A llama-server router serves several models and takes the model as a query.
        props = await get_json(client, f"/props?model={quote(model, safe='')}")
    except (httpx.HTTPError, ValueError):
        return None
    found = props.get("model_path") if isinstance(props, Mapping) else None
    if not isinstance(found, str) or not found or "\0" in found:
        return None
    # One open and read of 4 bytes of a local file: not worth a thread.
    return _gguf_path(found, model, notes)


def _gguf_path(found: str, model: str, notes: list[str] | None) -> Path | None:
    """`found` as a path when `_gguf_file`, else None (noted when something is there)."""
    path = Path(found)
    if _gguf_file(path):
        return path
    if notes is not None and os.path.lexists(path):
        notes.append(
            f"{model}: /props model_path {escape_error(found, 120)!r} is not a GGUF file:"
            " its size is not taken"
        )
    return None


async def model_size(
    client: httpx.AsyncClient,
    api: str,
    model: str,
    *,
    url: str,
    hint: SizeHint | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The model entry's `size`: what the server tells, else the user's hint.

    Args:
        client: A client whose `base_url` is the target (with the key in its headers).
        api: `ollama` or `openai`.
        model: The model as benchmarked.
        url: The target's URL (a `/props` file is read only when it is a loopback address:
            another machine's path means nothing here).
        hint: The user's `--size` for this model.
        notes: Where a hint the server overrode is noted.

    Returns:
        `{"disk_bytes", "loaded_bytes", "vram_bytes", "parameters", "source"}`; unknown values
        are None, `source` names where `disk_bytes` came from (None when nowhere).
    """
    size: dict[str, Any] = {
        "disk_bytes": None,
        "loaded_bytes": None,
        "vram_bytes": None,
        "parameters": None,
        "source": None,
    }
    if api == "ollama":
        size["disk_bytes"] = await disk_size(client, model) or None
        if size["disk_bytes"] is not None:
            size["source"] = "ollama /api/tags"
        size["parameters"] = await _ollama_parameters(client, model)
        memory = await loaded_memory(client, model)
        if memory is not None:
            size["loaded_bytes"] = memory["size_bytes"]
            size["vram_bytes"] = memory["size_vram_bytes"]
    else:
        meta = await _openai_meta(client, model)
        size["parameters"] = _whole(meta.get("n_params"))
        size["disk_bytes"] = _whole(meta.get("size"))
        if size["disk_bytes"] is not None:
            size["source"] = "llama.cpp /v1/models meta.size"
        elif _loopback(url) and (path := await _props_file(client, model, notes)) is not None:
            size["disk_bytes"] = path.stat().st_size
            size["source"] = f"llama.cpp /props model_path ({path.name})"
    if hint is not None:
        if size["disk_bytes"] is None:
            size["disk_bytes"], size["source"] = hint.disk_bytes, hint.source
        elif notes is not None and size["disk_bytes"] != hint.disk_bytes:
            notes.append(
                f"{model}: the server's size ({size['disk_bytes']} bytes, {size['source']}) is"
                f" shown, not --size ({hint.disk_bytes} bytes)"
            )
    return size
