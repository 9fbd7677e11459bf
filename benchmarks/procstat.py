"""What the kernel says a process costs: CPU seconds and resident memory, read from /proc.

Owns the two readings the benchmark takes around each run: `cpu_seconds` (utime + stime of a
process and, for nginx, its workers) and `rss_kib` (VmRSS). Linux only, like the benchmark.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (which may contain spaces)."""
    text = (_PROC / str(pid) / "stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU seconds used so far by `pids` (their own threads, not children).

    A process that has exited counts as zero: callers read before and after a run, and the
    processes they read live across it.
    """
    total = 0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total / _TICKS


def children(pid: int) -> list[int]:
    """The direct children of `pid` (for example nginx's workers under its master)."""
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry.name))[1]) == pid:
                found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return found


def rss_kib(pid: int) -> int:
    """Resident set size of `pid` in KiB (VmRSS of /proc/PID/status)."""
    for line in (_PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for process {pid}")


def load_average() -> float:
    """The 1-minute load average, to show how busy the machine was around a run."""
    return os.getloadavg()[0]
