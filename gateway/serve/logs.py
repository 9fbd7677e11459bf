r"""Log hygiene: every log line is one line of printable text, whatever clients or upstreams sent.

Text from outside (an upstream's "model 'x' not found" echoing the client's model name, a reason
built from a header, a token's subject) reaches log messages through `%s` arguments. Written
raw, a newline in it starts a forged log entry, terminal escape bytes (`ESC [`) reach the
terminal of whoever reads the log, and invisible characters make a line read differently from
what it holds: a bidirectional override (U+202E) shows `txt.exe` as `exe.txt`, a zero-width
space or a byte-order mark hides inside a name that then looks like another. The formatter here
escapes the message of every record instead of trusting each call site: every character Python's
`repr` would escape (not `str.isprintable`: C0 and C1 controls, DEL, format characters such as
bidi overrides and isolates, zero-width ones and U+FEFF, line and paragraph separators, lone
surrogates, unassigned and private-use code points, spaces other than U+0020) becomes
`\xNN` / `\uNNNN` / `\UNNNNNNNN` text, so operators can read it.
Tracebacks keep their line breaks (Python makes them), but what a client may have put inside
them (an exception's message) is escaped the same way.

The JSON access log (`gateway.api.middleware.access`) is safe already: `json.dumps` escapes every
non-ASCII
character inside its strings; this formatter leaves its printable output untouched.
"""

from __future__ import annotations

import logging
from typing import Any


def _escape_char(char: str) -> str:
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_text(text: str) -> str:
    r"""Return `text` with every character `str.isprintable` refuses replaced by a visible escape.

    Example: a newline becomes the four characters `\x0a`, ESC `\x1b`, a right-to-left override
    the six characters `\u202e`. Printable text is returned as it is (one C-speed check).
    """
    if text.isprintable():
        return text
    return "".join([_escape_char(char) for char in text])


def _escape_lines(text: str) -> str:
    """`escape_text` of each line of `text`, the line breaks kept."""
    return "\n".join(escape_text(line) for line in text.split("\n"))


class EscapingFormatter(logging.Formatter):
    """A `logging.Formatter` whose records' messages are passed through `escape_text`.

    The exception text (`exc_info`) and stack text keep their line breaks, as Python wrote
    them; every other character is escaped as in the message.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        """Escape the record's message, then format it as `logging.Formatter` does."""
        record.message = escape_text(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        """The traceback as `logging.Formatter` writes it, each line escaped."""
        return _escape_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        """The stack as `logging.Formatter` writes it, each line escaped."""
        return _escape_lines(super().formatStack(stack_info))


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
