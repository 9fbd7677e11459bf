"""The saved run document: its schema name, loading and checking a file, reading its values.

The runner writes one JSON document per `gateway bench run` (the contract's schema
`gateway-bench/1`): `schema`, `created`, `command`, `fingerprint`, `parameters`, `notes` and
`models`, each model entry with its `points` (`gateway.clients.bench.shapes`), `knee`, `slo_limit`,
`stopped`, `policy`, `size`, `quality`, `resources`. `compare`, `report` and `plots` read it
through `load_run`, which checks only the structure they rely on (so a file from a newer or
foreign tool fails with one clear sentence instead of a KeyError deep in a table), and through
the small readers here, which treat every value as optional: a run that measured no goodput or
no quality still renders, with "-" in its place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.clients.bench.jsontext import loads

SCHEMA = "gateway-bench/1"
#: A run document larger than this is no run of ours (a sweep of 50 points with 5 repeats is
#: well under 10 MB); refusing it keeps a mistaken path or a hostile file from exhausting memory.
MAX_BYTES = 64 * 1024 * 1024
#: The most JSON values and the deepest nesting a run document may hold. Within MAX_BYTES a
#: file of `{},` is 22 million values, 1.7 GB once parsed; a run of ours holds some thousands
#: (a 50-point sweep with 5 repeats, tens of thousands) at a depth of about 10.
MAX_VALUES = 1_000_000
MAX_DEPTH = 64


class RunFileError(ValueError):
    """A run file that cannot be read or is not a `gateway-bench/1` document."""


def load_run(path: str | Path) -> dict[str, Any]:
    """Read and check one run document.

    Args:
        path: The JSON file written by `gateway bench run`.

    Returns:
        The document, as parsed.

    Raises:
        RunFileError: The file is missing, unreadable, too large (`MAX_BYTES`), not JSON
            (including a number Python will not read), more than `MAX_VALUES` values or
            `MAX_DEPTH` levels deep, or not a `gateway-bench/1` document (the message names
            the file and the problem).
    """
    name = str(path)
    try:
        size = Path(path).stat().st_size
        if size > MAX_BYTES:
            raise RunFileError(
                f"{name}: {size} bytes is too large for a run document"
                f" (the limit is {MAX_BYTES // (1024 * 1024)} MiB)"
            )
        raw = Path(path).read_bytes()
        raw.decode("utf-8")  # only checked: the parser reads the bytes
    except OSError as exc:
        raise RunFileError(f"{name}: cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise RunFileError(f"{name}: not UTF-8 text, so no run document") from exc
    try:
        doc = loads(raw, max_values=MAX_VALUES, max_depth=MAX_DEPTH)
    except json.JSONDecodeError as exc:
        raise RunFileError(
            f"{name}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from exc
    except ValueError as exc:
        # Too many values, nested too deeply, an integer beyond Python's digit limit for
        # int(str) (4300 digits).
        raise RunFileError(f"{name}: not a readable JSON document ({exc})") from exc
    problem = check_run(doc)
    if problem is not None:
        raise RunFileError(f"{name}: {problem}")
    return dict(doc)


def check_run(doc: object) -> str | None:
    """What makes `doc` no `gateway-bench/1` run document, or None when it is one.

    Checks the structure the readers index into: the schema name, `models` as a list of
    objects with a string `model` and a list `points` of objects with a `level` that is a
    finite positive number (`real`) and an object `summary`. Everything else is optional, and
    read through the lenient readers below.
    """
    if not isinstance(doc, dict):
        return "not a run document (a JSON object was expected)"
    schema = doc.get("schema")
    if schema != SCHEMA:
        return f"schema {schema!r} is not {SCHEMA!r}"
    models = doc.get("models")
    if not isinstance(models, list):
        return "no 'models' list"
    for index, entry in enumerate(models):
        where = f"models[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
            return f"{where} has no model name"
        points = entry.get("points")
        if not isinstance(points, list):
            return f"{where} has no 'points' list"
        for number, point in enumerate(points):
            if not isinstance(point, dict) or not isinstance(point.get("summary"), dict):
                return f"{where}.points[{number}] has no summary"
            level = real(point.get("level"))
            if level is None or level <= 0:
                return f"{where}.points[{number}] has no numeric level (a finite positive number)"
    for key in ("fingerprint", "parameters"):
        if key in doc and not isinstance(doc[key], dict):
            return f"'{key}' is not an object"
    return None


def real(value: object) -> float | None:
    """`value` as a finite float, or None.

    A bool, a string, NaN, an infinity or an integer too large for a float (`10**400`, which
    JSON allows) is as good as missing.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def mapping(value: object) -> Mapping[str, Any]:
    """`value` when it is an object, else an empty one (a hand-edited file may hold a list)."""
    return value if isinstance(value, Mapping) else {}


def sequence(value: object) -> list[Any]:
    """`value` when it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def models(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The document's model entries, in the order measured (objects only)."""
    return [entry for entry in sequence(doc.get("models")) if isinstance(entry, dict)]


def points(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A model entry's points with a usable level (`real`), sorted by it.

    The runner sorts them; old or hand-edited files may not.
    """
    found = [p for p in sequence(entry.get("points")) if isinstance(p, dict)]
    usable = [p for p in found if real(p.get("level")) is not None]
    return sorted(usable, key=lambda p: real(p.get("level")) or 0.0)


def stat(point: Mapping[str, Any], key: str, which: str = "median") -> float | None:
    """One statistic over repeats of a summary key, or None when not measured.

    Args:
        point: A point object (`summary` as `stats.point_summary` builds it).
        key: `ttft_seconds.p50`, `output_tokens_per_second`, ...
        which: `median`, `min`, `max` or `spread`.

    Returns:
        The value as a float; None when missing, not a number, NaN, infinite or too large for
        a float.
    """
    entry = mapping(point.get("summary")).get(key)
    # Python's json reads NaN, Infinity and integers beyond a float; no statistic of ours is
    # any of them, so they are unknown.
    return real(entry.get(which)) if isinstance(entry, Mapping) else None


def nested(mapping: Mapping[str, Any] | None, *keys: str) -> Any:
    """`mapping[k1][k2]...`, or None as soon as a level is missing or not an object."""
    value: Any = mapping
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value
