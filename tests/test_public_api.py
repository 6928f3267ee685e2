"""The package's face: the names DESIGN.md promises, sorted, and nothing heavy imported."""

from __future__ import annotations

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
