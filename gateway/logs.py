r"""Log hygiene: every log line is one line of printable text, whatever clients or upstreams sent.

Text from outside (an upstream's "model 'x' not found" echoing the client's model name, a reason
built from a header) reaches log messages through `%s` arguments. Written raw, a newline in it
starts a forged log entry, and terminal escape bytes (`ESC [`) reach the terminal of whoever
reads the log. The formatter here escapes the message of every record instead of trusting each
call site: C0 and C1 control characters, DEL, and the Unicode line and paragraph separators
become `\xNN` / `\uNNNN` text (the escaping of Python's `repr`, so operators can read it).
Tracebacks keep their newlines: they are made by Python, not by a client.

The JSON access log (`gateway.access`) is safe already: `json.dumps` escapes every control
character inside its strings; this formatter leaves its printable output untouched.
"""

from __future__ import annotations

import logging
import re

#: What may not appear raw in a log line: C0 controls (tab included, for column-based tools),
#: DEL, C1 controls, and U+2028/U+2029 (line breaks to some log viewers and JavaScript).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape_one(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_text(text: str) -> str:
    r"""Return `text` with every control character replaced by a visible escape.

    Example: a newline becomes the four characters `\x0a`, ESC becomes `\x1b`.
    """
    return _UNSAFE.sub(_escape_one, text)


class EscapingFormatter(logging.Formatter):
    """A `logging.Formatter` whose records' messages are passed through `escape_text`.

    The exception text (`exc_info`) and stack text are appended unescaped, as Python wrote them.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        """Escape the record's message, then format it as `logging.Formatter` does."""
        record.message = escape_text(record.message)
        return super().formatMessage(record)


def configure_logging(level: str) -> None:
    """Send every logger to stderr through `EscapingFormatter` at `level` (`info`, `debug`...).

    Replaces `logging.basicConfig` for `gateway serve`; calling it again replaces the handler.
    """
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_gateway", False)]:
        root.removeHandler(old)
    handler._gateway = True  # type: ignore[attr-defined]  # ours, to replace on a second call
    root.addHandler(handler)
    root.setLevel(level.upper())
