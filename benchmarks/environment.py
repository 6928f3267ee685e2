"""What produced a benchmark's figures, written into its JSON beside them.

Machines differ up to 4x in speed, so a figure means something only with the machine, the versions
and the code that made it; the docs render this block under each table instead of prose.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["environment"]

PACKAGES = ("adaptive-gate", "starlette", "anyio", "torch")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    """The checkout's commit, with "+changes" where the work tree differs from it; None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            # Results an earlier benchmark of the same sweep wrote are no change to the code that ran
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
            cwd=root, capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+changes" if dirty else "")


def environment() -> dict[str, object]:
    """The machine, the versions, the date and the commit, as a JSON-ready dict."""
    return {
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cores": os.cpu_count(),
        "system": platform.system(),
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "commit": _commit(),
    }
