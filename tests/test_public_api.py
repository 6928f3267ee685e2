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


def mypy_strict(tmp_path: pathlib.Path, source: str) -> subprocess.CompletedProcess[str]:
    user = tmp_path / "service.py"
    user.write_text(source)
    command = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent", str(user)]
    return subprocess.run(command, capture_output=True, text=True)


SERVICE = "from starlette.applications import Starlette\nfrom adaptive_gate import AdaptiveGate\napp = Starlette()\n"


def test_a_users_type_checker_checks_the_one_line(tmp_path: pathlib.Path) -> None:
    """`app.add_middleware(AdaptiveGate, ...)` type-checks under `mypy --strict` (Starlette's factory
    takes the app positionally and the options as keywords), and a misspelt option or a value of the
    wrong type is caught there, before the service starts."""
    good = mypy_strict(
        tmp_path, SERVICE + "app.add_middleware(AdaptiveGate, max_limit=8, queue_timeout=5.0, tag=['gpu'])\n"
    )
    assert good.returncode == 0, good.stdout
    wrong = mypy_strict(
        tmp_path,
        SERVICE + 'app.add_middleware(AdaptiveGate, max_limt=8)\napp.add_middleware(AdaptiveGate, queue_timeout="5")\n',
    )
    assert wrong.returncode == 1 and ":4:" in wrong.stdout and ":5:" in wrong.stdout, wrong.stdout
    assert "max_limt" in wrong.stdout and "queue_timeout" in wrong.stdout, wrong.stdout


def test_the_type_checkers_keywords_are_the_options() -> None:
    from dataclasses import fields

    from adaptive_gate.middleware import GateKeywords
    from adaptive_gate.options import GateOptions

    assert list(GateKeywords.__annotations__) == [option.name for option in fields(GateOptions)]


def test_the_signature_shows_every_option_once() -> None:
    """`help(AdaptiveGate)` and editors see the keywords of the one options declaration."""
    from adaptive_gate.options import option_table

    parameters = inspect.signature(adaptive_gate.AdaptiveGate).parameters
    assert list(parameters)[0] == "app"
    assert list(parameters)[1:] == [row["name"] for row in option_table()]
    assert parameters["max_limit"].default == 64 and parameters["queue_timeout"].default == 30.0
    assert parameters["tag"].default == "gpu" and parameters["unprotected"].default == ()
