"""Parsing JSON the benchmark did not write: a server's answer, a workload line, a run file.

Owns `loads`, Python's `json.loads` with every failure a hostile text can cause turned into a
`ValueError`. Nesting past Python's recursion limit raises `RecursionError`, which is no
`ValueError`, so without it `[[[[...` from a server or a file ends `gateway bench` with a
traceback. Bounds on the number of values and on the depth are optional: the gateway's own
`count_values` bounds the values before parsing (a 64 MiB run file of `{},` would otherwise
become 1.7 GB of Python objects), and the depth is checked the way the gateway checks bodies.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.wire.json import count_values, nesting_depth


def loads(data: str | bytes, *, max_values: int | None = None, max_depth: int | None = None) -> Any:
    """Parse untrusted JSON text.

    Args:
        data: The text (bytes are read as UTF-8, as `json.loads` does).
        max_values: Most JSON values accepted, counted before parsing (None: no bound).
        max_depth: Deepest nesting accepted, a scalar being depth 1 (None: Python's recursion
            limit, about 1000).

    Returns:
        The parsed value.

    Raises:
        json.JSONDecodeError: Not JSON.
        ValueError: Nested past `max_depth` or Python's recursion limit, more than `max_values`
            values, or an integer of more digits than Python converts (4300).
    """
    if max_values is not None:
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        if count_values(raw, max_values) > max_values:
            raise ValueError(f"more than {max_values} JSON values")
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if max_depth is not None and nesting_depth(value, max_depth) > max_depth:
        raise ValueError(f"JSON nested too deeply (more than {max_depth} levels)")
    return value
