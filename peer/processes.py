"""This host's process table, read from /proc: the children of a process (what a stopping peer
kills so that no p2pd outlives it)."""

from __future__ import annotations

import os


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def child_pids(parent: int) -> list[int]:
    """PIDs of the direct children of ``parent``, read from /proc."""
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and (fields := stat_fields(entry)) is not None and int(fields[1]) == parent]
