"""The package's face: the public names (docs/reference/api.md), sorted, and nothing heavy imported."""

from __future__ import annotations

import inspect
import pathlib
import subprocess
import sys

import adaptive_gate


def test_all_is_sorted_and_complete() -> None:
    assert adaptive_gate.__all__ == sorted(adaptive_gate.__all__)
    for name in ("AdaptiveGate", "AIMD", "MemorySample", "is_oom"):
        assert name in adaptive_gate.__all__
    for name in adaptive_gate.__all__:
        assert hasattr(adaptive_gate, name)


def test_core_imports_no_optional_package() -> None:
    code = (
        "import sys, adaptive_gate, adaptive_gate.testing;"
        "heavy = {'torch', 'fastapi', 'pynvml', 'prometheus_client'} & set(sys.modules);"
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_users_type_checker_accepts_the_one_line(tmp_path: pathlib.Path) -> None:
    """`app.add_middleware(AdaptiveGate, ...)` type-checks under `mypy --strict`: Starlette's middleware
    factory takes the app positionally and the options as keywords, and so does the gate."""
    user = tmp_path / "service.py"
    user.write_text(
        "from starlette.applications import Starlette\n"
        "from adaptive_gate import AdaptiveGate\n"
        "app = Starlette()\n"
        "app.add_middleware(AdaptiveGate, max_limit=8, queue_timeout=5.0)\n"
    )
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent", str(user)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout


def test_the_signature_shows_every_option_once() -> None:
    """`help(AdaptiveGate)` and editors see the keywords of the one options declaration."""
    from adaptive_gate.options import option_table

    parameters = inspect.signature(adaptive_gate.AdaptiveGate).parameters
    assert list(parameters)[0] == "app"
    assert list(parameters)[1:] == [row["name"] for row in option_table()]
    assert parameters["max_limit"].default == 64 and parameters["queue_timeout"].default == 30.0
