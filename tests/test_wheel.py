"""A wheel that installs clean: `python -m build` makes an sdist and, from it, a wheel; `twine check` passes;
the wheel, installed into a fresh venv with its declared dependencies only, serves a gated route, the status
and the dashboard from the installed package.

One module-scoped build and one fresh venv serve every test here (a few seconds each; pip reaches the
package registry for starlette and anyio).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "adaptive_gate"
# What never belongs in a source copy, whether git knows the tree or not.
IGNORED = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".*_cache", ".hypothesis")


@dataclass(frozen=True)
class Built:
    source: Path  # the copy of the tree the build ran on
    wheel: Path
    sdist: Path


def _run(args: list[str | Path], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure, fail with its output (not only the exit status)."""
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, args))} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
        )
    return result


def _clean_env() -> dict[str, str]:
    """The environment without this venv or source tree in it: no PYTHONPATH, no VIRTUAL_ENV, no user site."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _copy_tree(destination: Path) -> None:
    """The files a clean clone would hold (tracked, or new and not ignored), so the build leaves nothing
    (build/, egg-info) in the working tree and takes nothing stale from it."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:  # not a git checkout (an unpacked sdist, say): copy all but the usual debris
        shutil.copytree(ROOT, destination, ignore=shutil.ignore_patterns(*IGNORED))
        return
    for name in listed.stdout.decode().split("\0"):
        source = ROOT / name
        if name and source.is_file():  # a tracked file deleted in the working tree is not there to copy
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    base = tmp_path_factory.mktemp("wheel")
    source, dist = base / "src", base / "dist"
    _copy_tree(source)
    # No --sdist/--wheel: build makes the sdist, then the wheel from the unpacked sdist, so a file the sdist
    # lacks is missing from the wheel too. --no-isolation: the build backend is this venv's setuptools (the
    # dev extra), nothing is downloaded.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source], timeout=300, cwd=base)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    return Built(source=source, wheel=wheels[0], sdist=sdists[0])


@pytest.fixture(scope="module")
def venv(built: Built) -> Path:
    """A fresh venv holding the wheel and what pip resolves for its declared dependencies, nothing else."""
    path = built.wheel.parent.parent / "venv"
    _run([sys.executable, "-m", "venv", path], timeout=120, env=_clean_env())
    python = path / "bin" / "python"
    _run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", built.wheel],
        timeout=300,
        env=_clean_env(),
        cwd=path,
    )
    return path


def _declared() -> list[Requirement]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return [Requirement(r) for r in tomllib.load(f)["project"]["dependencies"]]


def _wheel_names(built: Built) -> list[str]:
    with zipfile.ZipFile(built.wheel) as whl:
        return whl.namelist()


def _dashboard_member(names: list[str]) -> str:
    pages = [n for n in names if n.startswith(f"{PACKAGE}/") and n.endswith("/dashboard.html")]
    assert len(pages) == 1, f"the wheel should hold one dashboard.html, holds {pages}"
    return pages[0]


def test_twine_check_passes(built: Built) -> None:
    # --strict: a warning (a README that does not render, a missing content type) fails too.
    result = _run([sys.executable, "-m", "twine", "check", "--strict", built.wheel, built.sdist], timeout=120)
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_wheel_holds_the_package_and_nothing_else(built: Built) -> None:
    names = _wheel_names(built)
    version = built.wheel.name.split("-")[1]
    dist_info = f"{PACKAGE}-{version}.dist-info/"
    assert [n for n in names if not n.startswith((f"{PACKAGE}/", dist_info))] == []
    assert not any(
        part in {"tests", "benchmarks", "demo_service", "examples", "docs"} for n in names for part in n.split("/")
    )
    assert f"{PACKAGE}/py.typed" in names
    _dashboard_member(names)
    # Every module and page of the source (sub-packages included, wherever they moved) made it into the wheel.
    tree = built.source / PACKAGE
    expected = {
        f"{PACKAGE}/{p.relative_to(tree).as_posix()}" for p in tree.rglob("*") if p.suffix in {".py", ".html", ".typed"}
    }
    assert expected - set(names) == set()
    with zipfile.ZipFile(built.wheel) as whl:
        metadata = whl.read(f"{dist_info}METADATA").decode()
        assert whl.read(f"{dist_info}top_level.txt").decode().split() == [PACKAGE]
    # What the wheel requires outside its extras is what pyproject declares.
    requires = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert sorted(str(r) for r in requires if r.marker is None) == sorted(str(r) for r in _declared())
    assert "Description-Content-Type: text/markdown" in metadata


def test_sdist_holds_the_project_files(built: Built) -> None:
    with tarfile.open(built.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for name in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO", f"{PACKAGE}/__init__.py", f"{PACKAGE}/py.typed"):
        assert name in names
    assert any(n.startswith(f"{PACKAGE}/") and n.endswith("/dashboard.html") for n in names)


def test_fresh_venv_holds_only_the_declared_dependencies(venv: Path) -> None:
    from importlib import metadata

    site = list((venv / "lib").glob("python*/site-packages"))
    installed = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(p) for p in site])}
    # The closure of the declared requirements, markers evaluated (the fresh venv runs this same Python).
    wanted, todo = {canonicalize_name(PACKAGE)}, list(_declared())
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})) or name in wanted:
            continue
        wanted.add(name)
        assert name in installed, f"{name} is required but not installed"
        todo.extend(Requirement(r) for r in installed[name].requires or ())
    assert set(installed) - wanted - {"pip", "setuptools", "wheel"} == set()
    _run([venv / "bin" / "python", "-m", "pip", "check", "--disable-pip-version-check"], timeout=120, env=_clean_env())


SERVE = textwrap.dedent(
    """
    import json, sys

    import anyio
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    import adaptive_gate
    from adaptive_gate import AdaptiveGate
    from adaptive_gate.testing import SimulatedGPU


    async def infer(request):
        return PlainTextResponse("inferred")


    app = Starlette(routes=[Route("/infer", infer)])
    # Plain Starlette routes have no tags: tag=None gates every HTTP request but the gate's own endpoints.
    gate = AdaptiveGate(app, tag=None, probe=SimulatedGPU(8 << 30, baseline_bytes=1 << 30))


    async def get(path):
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": b"", "headers": [(b"host", b"test")], "client": ("127.0.0.1", 50000),
            "server": ("test", 80), "state": {},
        }
        answered = anyio.Event()
        requested = False
        start, body = {}, bytearray()

        async def receive():
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    answered.set()

        with anyio.fail_after(10):
            await gate(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
        return {"status": start.get("status"), "content_type": headers.get("content-type", ""), "body": body.decode()}


    async def main():
        async with gate.running():
            answers = {path: await get(path) for path in ("/infer", "/gate/status", "/gate/dashboard")}
        print(json.dumps({
            "file": adaptive_gate.__file__, "version": adaptive_gate.__version__, "prefix": sys.prefix,
            "path": sys.path, "answers": answers,
        }))


    anyio.run(main)
    """
)


def test_installed_wheel_serves_a_gated_route_and_the_dashboard(built: Built, venv: Path) -> None:
    workdir = venv.parent / "run"  # not the source tree, nor anywhere it could be imported from
    workdir.mkdir(exist_ok=True)
    script = workdir / "serve.py"
    script.write_text(SERVE)
    out = _run([venv / "bin" / "python", script], timeout=120, env=_clean_env(), cwd=workdir).stdout
    report = json.loads(out.strip().splitlines()[-1])

    installed = Path(report["file"]).resolve()
    assert installed.is_relative_to(venv.resolve()), report["file"]
    assert not installed.is_relative_to(ROOT), report["file"]
    assert not any(p and Path(p).resolve().is_relative_to(ROOT) for p in report["path"]), report["path"]
    assert report["version"] == built.wheel.name.split("-")[1]

    answers = report["answers"]
    assert (answers["/infer"]["status"], answers["/infer"]["body"]) == (200, "inferred")

    status = answers["/gate/status"]
    assert status["status"] == 200 and status["content_type"].startswith("application/json")
    document = json.loads(status["body"])
    assert isinstance(document["limit"], int) and document["limit"] >= 1
    assert document["version"] == report["version"]

    dashboard = answers["/gate/dashboard"]
    assert dashboard["status"] == 200 and dashboard["content_type"].startswith("text/html")
    with zipfile.ZipFile(built.wheel) as whl:
        page = whl.read(_dashboard_member(whl.namelist())).decode()
    assert dashboard["body"] == page  # the page the installed package holds, served whole
    assert "<title>adaptive-gate</title>" in page
