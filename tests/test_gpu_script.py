"""The GPU script (benchmarks/gpu/): its wheel set, its sizing, and the whole script rehearsed on the CPU.

The rehearsal runs `bash benchmarks/gpu/run.sh --rehearse` on a clean clone of the committed tree: it
downloads the pinned wheel set, builds a venv with only the GPU image's packages (torch as the CPU
build), installs the wheels as the GPU machine will, and runs every step on a SimulatedGPU. A missing
or conflicting wheel, or a step that no longer runs, fails here instead of on the card.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.gpu import wheelset
from benchmarks.gpu.steps import choose_fraction

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30
MiB = 2**20
RESULT_FILES = {"run.log", "steps.tsv", "env.json", "probes.json", "sizing.json", "demo.json", "http_demo.json"}


def touch_wheel(folder: Path, name: str, size: int = 10) -> None:
    (folder / name).write_bytes(b"0" * size)


def test_the_pins_are_one_version_each_and_complete_for_fastapi() -> None:
    pins = wheelset.read_pins()
    # fastapi 0.165 imports opentelemetry and annotated_doc; uvicorn needs click: all carried
    for name in ("fastapi", "starlette", "uvicorn", "python-multipart", "pydantic", "pydantic-core",
                 "annotated-types", "typing-inspection", "opentelemetry-api", "annotated-doc", "click"):  # fmt: skip
        assert name in pins, name
    assert not {"torch", "httpx", "h11", "pillow"} & set(pins)  # the image has these
    assert "anyio" in pins  # the image has one too, but the gate needs 4.11+


def test_pins_must_be_exact_and_single(tmp_path: Path) -> None:
    pins = tmp_path / "wheels.txt"
    pins.write_text("fastapi>=0.100\n")
    with pytest.raises(ValueError, match="not name==version"):
        wheelset.read_pins(pins)
    pins.write_text("# comment\nTyping_Extensions==4.16.0\ntyping-extensions==4.15.0\n")
    with pytest.raises(ValueError, match="typing-extensions is pinned twice"):
        wheelset.read_pins(pins)


def test_a_folder_with_exactly_the_pinned_wheels_passes(tmp_path: Path) -> None:
    pins = {"pydantic-core": "2.50.5", "typing-extensions": "4.16.0"}
    touch_wheel(tmp_path, "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    touch_wheel(tmp_path, "typing_extensions-4.16.0-py3-none-any.whl")
    assert wheelset.problems(tmp_path, pins, "3.12") == []
    # the same folder on another Python: the binary wheel does not install there
    assert wheelset.problems(tmp_path, pins, "3.11") == [
        "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl: "
        "built for cp312-cp312, not CPython 3.11"
    ]


def test_missing_extra_second_and_unpinned_wheels_are_named(tmp_path: Path) -> None:
    pins = {"fastapi": "0.165.0", "starlette": "1.10.0", "click": "8.5.1"}
    touch_wheel(tmp_path, "fastapi-0.165.0-py3-none-any.whl")
    touch_wheel(tmp_path, "fastapi-0.164.0-py3-none-any.whl")
    touch_wheel(tmp_path, "starlette-1.9.0-py3-none-any.whl")
    touch_wheel(tmp_path, "rich-14.0.0-py3-none-any.whl")
    found = "\n".join(wheelset.problems(tmp_path, pins, "3.12"))
    assert "fastapi: 2 wheels (0.164.0, 0.165.0)" in found
    assert "starlette-1.9.0-py3-none-any.whl: wheels.txt pins starlette==1.10.0" in found
    assert "rich is not in wheels.txt" in found
    assert "click==8.5.1: no wheel in" in found


def test_a_set_over_what_carry_takes_is_refused(tmp_path: Path) -> None:
    touch_wheel(tmp_path, "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl", size=wheelset.CARRY_LIMIT_BYTES + 1)
    assert any("carry takes 64 MiB" in line for line in wheelset.problems(tmp_path, {"torch": "2.11.0"}, "3.12"))


def test_wheel_names_and_tags() -> None:
    parsed = wheelset.parse_wheel("Python_Multipart-0.0.34-py3-none-any.whl")
    assert parsed == ("python-multipart", "0.0.34", "py3", "none")
    assert wheelset.suits("cp39", "abi3", "3.12") and not wheelset.suits("cp311", "cp311", "3.12")
    with pytest.raises(ValueError, match="not a wheel"):
        wheelset.parse_wheel("fastapi-0.165.0.tar.gz")


def test_the_fraction_holds_five_requests_and_not_six() -> None:
    total = 141 * GiB
    fraction = choose_fraction(100 * MiB, 250 * MiB, total)
    usable = fraction * total
    assert 100 * MiB + 5 * 250 * MiB < usable < 100 * MiB + 6 * 250 * MiB
    assert fraction == round(fraction, 4)


def test_the_fraction_refuses_what_cannot_fit() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        choose_fraction(1 * GiB, 10 * GiB, 24 * GiB)
    with pytest.raises(ValueError, match="cannot size"):
        choose_fraction(1 * GiB, 0, 24 * GiB)


@pytest.mark.slow
def test_the_gpu_script_rehearsed_on_the_cpu_from_a_clean_clone(tmp_path: Path) -> None:
    """Every step passes on a SimulatedGPU, in a venv built only from the carried wheels plus the image's packages."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("the rehearsal clones the repository: it needs git and a checkout")
    clone, out = tmp_path / "clone", tmp_path / "out"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", f"file://{ROOT}", str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTORCH_CUDA_ALLOC_CONF")}
    env["OUT"] = str(out)
    started = time.monotonic()
    try:
        done = subprocess.run(["bash", "benchmarks/gpu/run.sh", "--rehearse"], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
    finally:
        shutil.rmtree(clone, ignore_errors=True)  # its venvs hold torch: a GiB each run would keep
    took_s = time.monotonic() - started
    steps = (out / "steps.tsv").read_text() if (out / "steps.tsv").exists() else "(no steps.tsv)"
    assert done.returncode == 0, f"rehearsal failed after {took_s:.0f} s; steps:\n{steps}\n{done.stdout[-6000:]}"
    assert {path.name for path in out.iterdir()} == RESULT_FILES  # at most 8 files come back from the card
    for name in ("env", "probes", "sizing", "demo"):
        document = json.loads((out / f"{name}.json").read_text())
        assert document["ok"], (name, document.get("checks"))
    bench = json.loads((out / "http_demo.json").read_text())
    assert bench["complete"] and set(bench["runs"]["classic"]) == {"none", "adaptive", "static:5"}
    assert all("error" not in run for run in bench["runs"]["classic"].values()), bench["runs"]
    assert all(row.split("\t")[1] == "0" for row in steps.strip().splitlines()), steps


def test_http_demo_writes_its_json_after_every_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed during its second run (the GPU script's time limit), the benchmark keeps the first."""
    from benchmarks import http_demo

    runs: list[str] = []

    def one_run(scenario: str, policy: str, *args: object) -> dict[str, object]:
        runs.append(policy)
        if len(runs) == 2:
            raise KeyboardInterrupt  # what a kill looks like from inside
        return {"goodput_per_s": 1.0, "p99_ms": 5, "503": 0, "500": 0, "gave_up": 0}

    monkeypatch.setattr(http_demo, "one_run", one_run)
    argv = ["--rate", "10", "--scenarios", "classic", "--policies", "none,adaptive", "--out", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        http_demo.main(argv)
    document = json.loads((tmp_path / "http_demo.json").read_text())
    assert list(document["runs"]["classic"]) == ["none"] and document["complete"] is False


def test_http_demo_starts_no_run_past_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import http_demo

    monkeypatch.setattr(http_demo, "one_run", lambda *args: pytest.fail("no run fits in the budget"))
    http_demo.main(["--rate", "10", "--policies", "none", "--scenarios", "classic", "--duration-s", "5",
                    "--budget-s", "3", "--out", str(tmp_path)])  # fmt: skip
    document = json.loads((tmp_path / "http_demo.json").read_text())
    assert document["complete"] is False and document["skipped"][0].startswith("classic/none: out of time")
