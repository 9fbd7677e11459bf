"""Each module owns one concern, in at most ~300 lines (../shared/STYLE.md, rule 1; issue 25).

A module under `gateway/` longer than that says why in its docstring, in a paragraph that opens
`Over ~300 lines for one reason:` and names the one concern that splitting would pull apart
(as `gateway/upstream/pool.py` does). A module that crosses the line without a reason fails
here, and is either split or given its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 300
REASON = "Over ~300 lines"


def unexplained_long_modules(package: Path) -> list[str]:
    """Paths (relative to `package`'s parent) of modules over `MAX_LINES` lines without `REASON`.

    The docstring's whitespace is collapsed first, so the phrase may be wrapped across lines.
    """
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) <= MAX_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(text, filename=str(path))) or ""
        if REASON not in " ".join(docstring.split()):
            found.append(path.relative_to(package.parent).as_posix())
    return found


def test_every_long_module_says_why_in_its_docstring() -> None:
    unexplained = unexplained_long_modules(ROOT / "gateway")
    assert not unexplained, (
        f"over {MAX_LINES} lines with no `{REASON} for one reason:` paragraph in the module "
        "docstring (split the module, or name its one concern): " + ", ".join(sorted(unexplained))
    )


def test_the_check_flags_a_long_module_without_its_reason(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = "x = 1\n" * MAX_LINES
    (package / "short.py").write_text('"""Short."""\n' + "x = 1\n" * (MAX_LINES - 1))
    (package / "long.py").write_text('"""Long, and silent about it."""\n' + body)
    (package / "kept.py").write_text(
        f'"""Long.\n\nOver\n~300 lines for one reason: a test."""\n{body}'
    )
    assert unexplained_long_modules(package) == ["pkg/long.py"]
