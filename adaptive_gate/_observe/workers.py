"""How many worker processes serve this application, as far as can be told from inside one.

Each worker has its own gate and sees the whole card through NVML, so the count matters only to
the operator reading the status: it explains memory that other workers hold. Asked in order: the
`workers` option, `WEB_CONCURRENCY` (which uvicorn and gunicorn both read as their worker count),
then, on Linux, the children of a uvicorn/gunicorn/hypercorn parent process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["WorkerCount", "detect_workers", "proc_stat_fields"]

SERVERS = ("uvicorn", "gunicorn", "hypercorn")
RECOUNT_AFTER_S = 30.0


def _cmdline(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def proc_stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, session, ...)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: the fields after it are safe to split.
    return stat[stat.rfind(")") + 2 :].split()


def _parent_pid(pid: str) -> int | None:
    fields = proc_stat_fields(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def _server_workers() -> int | None:
    parent = os.getppid()
    if not any(server in _cmdline(parent) for server in SERVERS):
        return None
    try:
        pids = [entry.name for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    except OSError:
        return None
    workers = 0
    for pid in pids:
        if _parent_pid(pid) != parent:
            continue
        if "resource_tracker" in _cmdline(pid):
            continue  # multiprocessing's helper, not a worker
        workers += 1
    return workers or None


def detect_workers(option: int | None) -> tuple[int, str]:
    """(count, where it came from)."""
    if option is not None:
        return option, "workers option"
    text = os.environ.get("WEB_CONCURRENCY", "").strip()
    if text.isdigit() and int(text) >= 1:
        return int(text), "WEB_CONCURRENCY"
    counted = _server_workers()
    if counted is not None:
        return counted, "worker processes of the server"
    return 1, "assumed: set WEB_CONCURRENCY or the workers option if several workers serve this app"


class WorkerCount:
    """The count, worked out when the status asks and again at most every `RECOUNT_AFTER_S`.

    Not when the gate is built: a gunicorn `--preload` builds the app in the master before any
    worker exists, a server may still be starting its workers then, and a server that restarts
    a worker changes the set later. Reading /proc is also work that start-up does not need.
    """

    def __init__(self, option: int | None) -> None:
        self._option = option
        self._counted: tuple[int, str] | None = None
        self._counted_s = -float("inf")

    def get(self) -> tuple[int, str]:
        """(count, where it came from)."""
        now_s = time.monotonic()
        if self._counted is None or now_s - self._counted_s >= RECOUNT_AFTER_S:
            self._counted, self._counted_s = detect_workers(self._option), now_s
        return self._counted
