"""Checking a batch input file before anything runs: every line, with its number in each error.

A line is `{"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body": {...}}`
(OpenAI's Batch input format). Each body is checked by the endpoint's own parser, exactly as an
interactive request would be, and kept as the bytes that were checked: what runs later is what
was checked. The batch fails as a whole if any line fails (OpenAI does the same), listing at
most `MAX_ERRORS` errors.

Over ~300 lines for one reason: `InputChecker` (a file streamed in pieces) and `check_input` (a file
held whole) run the same per-line check (`_check_line`), and the line-splitting bookkeeping of
`feed` exists only to feed it; split, the check would be apart from the two ways it is run.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.auth.principal import Principal
from gateway.errors import GatewayError
from gateway.relay.surface import Endpoint
from gateway.settings import Settings
from gateway.wire.json import MAX_INT_DIGITS, count_values

#: The most errors a failed batch lists (the first ones by line number).
MAX_ERRORS = 100
#: The longest `custom_id` accepted, in characters.
MAX_CUSTOM_ID = 512


@dataclass(frozen=True, slots=True)
class InputLine:
    """One checked line: its 1-based number, id, model and the body bytes to send."""

    line_no: int
    custom_id: str
    model: str
    body: bytes


@dataclass(frozen=True, slots=True)
class LineError:
    """One reason a batch input is refused; `line` is 1-based, None for the whole file."""

    code: str
    message: str
    line: int | None = None

    def as_openai(self) -> dict[str, Any]:
        """OpenAI's batch error object: `{"code", "message", "param", "line"}`."""
        return {"code": self.code, "message": self.message, "param": None, "line": self.line}


#: A line that holds something other than ASCII whitespace (`(?m)^` anchors each try at a
#: line's start, so a long blank line is passed over once, at C speed, not once per byte).
_NOT_BLANK = re.compile(rb"(?m)^[ \t\r\f\v]*+[^\s][^\n]*+")


class InputChecker:
    """Check a batch input file piece by piece, in bounded memory; see `check_input`.

    Feed it the file's bytes in pieces (`feed`), then call `finish`. It holds one line at a
    time (at most `GATEWAY_MAX_BODY_BYTES` + 4 KiB of it), the `custom_id`s seen, and the
    checked lines only while no error was found; blank lines cost no Python work each (100 MiB
    of blank lines took ~1 GB of memory and held the event loop for seconds before).

    Args:
        endpoint_path: The batch's `endpoint`; every line's `url` must be it.
        endpoint: That endpoint's parser (`gateway.api.openai.routes`).
        principal: The batch's key: each line's model must be one it may use.
        settings: Body limits (`GATEWAY_MAX_BODY_BYTES`, ...) and `GATEWAY_BATCH_MAX_LINES`;
            whole, because each line goes through `Endpoint.parse`, which takes them.
    """

    def __init__(
        self, *, endpoint_path: str, endpoint: Endpoint, principal: Principal, settings: Settings
    ) -> None:
        self._path = endpoint_path
        self._endpoint = endpoint
        self._principal = principal
        self._settings = settings
        self._longest = settings.max_body_bytes + 4096
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._offset = 0  # bytes of the file fed so far
        self._line_no = 1  # the number of the line `_carry` starts
        self._carry = b""  # the start of a line whose end has not come yet
        self._dropping = False  # the line in `_carry` is too long: its bytes are dropped
        self._dropped_text = False  # ... and it held more than whitespace
        self._count = 0  # non-blank lines
        self._seen: set[str] = set()
        self._bad_utf8: LineError | None = None
        self.lines: list[InputLine] = []
        self.errors: list[LineError] = []

    def feed(self, data: bytes) -> None:
        """Check the lines `data` completes (the file's next bytes, any size)."""
        if self._bad_utf8 is not None or self._too_many() or not data:
            return  # the answer is known: the rest of the file changes nothing
        if self._offset == 0 and data.startswith(_BOM):  # utf-8-sig: Windows editors write one
            data = data[len(_BOM) :]
            self._offset = len(_BOM)
        try:
            self._utf8.decode(data)
        except UnicodeDecodeError as exc:
            where = self._offset + exc.start
            self._bad_utf8 = LineError("invalid_file", f"the file is not UTF-8 (byte {where})")
            return
        self._offset += len(data)
        end = data.rfind(b"\n")
        if end < 0:
            self._hold(data)
            return
        first = data.find(b"\n")
        self._hold(data[:first])
        self._line(self._take_carry())
        self._line_no += 1
        self._scan(data, first + 1, end)
        self._line_no += data.count(b"\n", first + 1, end + 1)
        self._hold(data[end + 1 :])

    def finish(self) -> tuple[list[InputLine], list[LineError]]:
        """(lines, errors): the checked lines, and the errors found (at most `MAX_ERRORS`).

        The batch may run only when `errors` is empty.
        """
        if self._bad_utf8 is None:
            try:
                self._utf8.decode(b"", final=True)
            except UnicodeDecodeError:
                self._bad_utf8 = LineError(
                    "invalid_file", f"the file is not UTF-8 (byte {self._offset})"
                )
        if self._bad_utf8 is not None:
            return [], [self._bad_utf8]
        self._line(self._take_carry())
        if not self._count:
            return [], [LineError("empty_file", "the file has no request lines")]
        if self._too_many():
            most = self._settings.batch_max_lines
            message = f"the file has more than {most} lines; at most {most}"
            return [], [LineError("too_many_lines", message)]
        return self.lines, self.errors

    def _too_many(self) -> bool:
        # Past the limit the batch fails whatever follows: the rest is not read (30 million
        # one-byte lines are not counted one by one).
        return self._count > self._settings.batch_max_lines

    def _hold(self, data: bytes) -> None:
        if self._dropping:
            self._dropped_text = self._dropped_text or bool(data.strip())
            return
        self._carry += data
        if len(self._carry) > self._longest:
            self._dropping = True
            self._dropped_text = bool(self._carry.strip())
            self._carry = b""

    def _take_carry(self) -> bytes | None:
        """The held line (None: too long, and not blank), and room for the next."""
        carry, dropping, text = self._carry, self._dropping, self._dropped_text
        self._carry, self._dropping, self._dropped_text = b"", False, False
        if dropping:
            return None if text else b""
        return carry

    def _scan(self, data: bytes, start: int, end: int) -> None:
        """Check the whole lines in `data[start:end]`, passing blank ones over in C."""
        line_no, at = self._line_no, start
        for found in _NOT_BLANK.finditer(data, start, end):
            line_no += data.count(b"\n", at, found.start())
            at = found.start()
            if found.end() - found.start() > self._longest:
                self._line(None, line_no)
            else:
                self._line(found.group(), line_no)

    def _line(self, raw: bytes | None, line_no: int | None = None) -> None:
        """Check one line; None is a line over the length limit."""
        number = self._line_no if line_no is None else line_no
        if raw is not None:
            raw = raw.removesuffix(b"\r")
            if not raw.decode().strip():  # Unicode whitespace too, as str.strip sees it
                return
        self._count += 1
        if len(self.errors) >= MAX_ERRORS or self._count > self._settings.batch_max_lines:
            return  # only counted from here
        if raw is None:
            limit = self._settings.max_body_bytes
            self._fail(LineError("line_too_large", f"the line is over {limit} bytes", number))
            return
        problem, line = _check_line(
            number, raw, self._path, self._endpoint, self._principal, self._settings
        )
        if problem is not None:
            self._fail(problem)
            return
        assert line is not None  # noqa: S101 - one of the two is set
        if line.custom_id in self._seen:
            self._fail(LineError("duplicate_custom_id", "custom_id is repeated", number))
            return
        self._seen.add(line.custom_id)
        if not self.errors:  # a batch with an error never runs: its lines need not be kept
            self.lines.append(line)

    def _fail(self, error: LineError) -> None:
        self.errors.append(error)
        self.lines.clear()


#: UTF-8's byte-order mark.
_BOM = codecs.BOM_UTF8
#: Bytes `check_input` feeds at a time.
_PIECE = 1024 * 1024


def check_input(
    content: bytes,
    *,
    endpoint_path: str,
    endpoint: Endpoint,
    principal: Principal,
    settings: Settings,
) -> tuple[list[InputLine], list[LineError]]:
    """Parse and check every line of a batch input file held whole (`InputChecker` in one go).

    Args:
        content: The file's bytes (UTF-8 JSONL; blank lines are skipped).
        endpoint_path: The batch's `endpoint`; every line's `url` must be it.
        endpoint: That endpoint's parser (`gateway.api.openai.routes`).
        principal: The batch's key: each line's model must be one it may use.
        settings: Body limits (`GATEWAY_MAX_BODY_BYTES`, ...) and `GATEWAY_BATCH_MAX_LINES`;
            whole, because each line goes through `Endpoint.parse`, which takes them.

    Returns:
        (lines, errors): the checked lines, and every error found (at most `MAX_ERRORS`);
        the batch may run only when `errors` is empty.
    """
    checker = InputChecker(
        endpoint_path=endpoint_path, endpoint=endpoint, principal=principal, settings=settings
    )
    for start in range(0, len(content), _PIECE):
        checker.feed(content[start : start + _PIECE])
    return checker.finish()


def _bounded_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:  # str -> int is quadratic in the digits
        raise ValueError("integer too long")
    return int(text)


def _check_line(
    line_no: int,
    raw: bytes,
    endpoint_path: str,
    endpoint: Endpoint,
    principal: Principal,
    settings: Settings,
) -> tuple[LineError | None, InputLine | None]:
    def fail(code: str, message: str) -> tuple[LineError, None]:
        return LineError(code, message, line_no), None

    # The interactive body's bounds, before parsing: a line of millions of tiny values or of
    # long integers would hold the GIL (and so the event loop) for seconds.
    if count_values(raw, settings.max_json_values) > settings.max_json_values:
        return fail("invalid_request", f"the line holds over {settings.max_json_values} values")
    try:
        item = json.loads(raw, parse_int=_bounded_int)
    except (ValueError, RecursionError):
        return fail("invalid_json_line", "the line is not valid JSON")
    if not isinstance(item, dict):
        return fail("invalid_request", "the line is not a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return fail("missing_required_parameter", "custom_id (a non-empty string) is missing")
    if len(custom_id) > MAX_CUSTOM_ID:
        return fail("invalid_request", f"custom_id is longer than {MAX_CUSTOM_ID} characters")
    if "\x00" in custom_id:  # no database text column holds a NUL (PostgreSQL refuses it)
        return fail("invalid_request", "custom_id must not contain NUL")
    if item.get("method", "POST") != "POST":
        return fail("invalid_request", "method must be POST")
    if item.get("url") != endpoint_path:
        return fail("invalid_url", f"url must be the batch's endpoint, {endpoint_path}")
    body = item.get("body")
    if not isinstance(body, dict):
        return fail("missing_required_parameter", "body (a JSON object) is missing")
    if body.get("stream") is True:
        return fail("invalid_request", "stream: true is not supported in a batch")
    encoded = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    if len(encoded) > settings.max_body_bytes:
        return fail("line_too_large", f"the body is over {settings.max_body_bytes} bytes")
    try:
        request = endpoint.parse(encoded, settings)
    except GatewayError as exc:
        return fail("invalid_request", exc.message)
    if "\x00" in request.model:
        return fail("invalid_request", "model must not contain NUL")
    # An alias is checked, and its line grouped, as the model that runs; the line's bytes keep
    # the alias, resolved again when it runs (`gateway.relay.admission`).
    model = settings.aliases.resolve(request.model)
    if not principal.allows_model(model):  # named as asked: an alias's target stays hidden
        return fail("model_not_allowed", f"this API key may not use model '{request.model}'")
    return None, InputLine(line_no, custom_id, model, encoded)
