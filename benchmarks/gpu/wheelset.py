"""The carried wheel set: the pins in wheels.txt, and a check that a folder holds exactly them.

Standard library only: it runs on the GPU machine's bare Python before anything is installed.

    python benchmarks/gpu/wheelset.py pins                      name==version lines, for pip
    python benchmarks/gpu/wheelset.py check DIR [--python 3.12] exactly one wheel per pin, for that
                                                                Python, and the whole set under 64 MiB
    python benchmarks/gpu/wheelset.py install DIR SITE          pip install --no-index --no-deps --target
                                                                SITE, or unzip them there without pip

The install on the GPU machine uses `--no-deps` (there is no index there), so a missing dependency
or a second version of one would only show on the card; this check and the CPU rehearsal show it first.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

PINS = Path(__file__).with_name("wheels.txt")
CARRY_LIMIT_BYTES = 64 * 2**20  # what the GPU machine's `carry` takes, all paths together
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")


def normalise(name: str) -> str:
    """PEP 503: `Typing_Extensions` and `typing-extensions` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path = PINS) -> dict[str, str]:
    """name -> version; every line `name==version` (comments and blank lines aside), each name once."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        if not match:
            raise ValueError(f"{path}:{number}: {line!r} is not name==version (every wheel is pinned)")
        name = normalise(match.group(1))
        if name in pins:
            raise ValueError(f"{path}:{number}: {name} is pinned twice")
        pins[name] = match.group(2)
    return pins


def parse_wheel(filename: str) -> tuple[str, str, str, str]:
    """`pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl` -> (name, version, python, abi)."""
    parts = filename.removesuffix(".whl").split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"{filename} is not a wheel file name")
    return normalise(parts[0]), parts[1], parts[-3], parts[-2]


def suits(python_tag: str, abi_tag: str, python_version: str) -> bool:
    """Whether a wheel's tags install on CPython `python_version` ("3.12")."""
    cp = "cp" + python_version.replace(".", "")
    pythons = python_tag.split(".")
    if abi_tag in ("none", "abi3"):
        return any(tag in ("py3", cp) or (abi_tag == "abi3" and tag.startswith("cp3")) for tag in pythons)
    return cp in pythons


def problems(folder: Path, pins: dict[str, str], python_version: str) -> list[str]:
    """What is wrong with `folder` as the wheel set for `python_version`: empty when nothing is."""
    found: dict[str, list[str]] = {}
    wrong: list[str] = []
    total_bytes = 0
    for wheel in sorted(folder.glob("*.whl")):
        total_bytes += wheel.stat().st_size
        name, version, python_tag, abi_tag = parse_wheel(wheel.name)
        found.setdefault(name, []).append(version)
        if name not in pins:
            wrong.append(f"{wheel.name}: {name} is not in {PINS.name}")
        elif version != pins[name]:
            wrong.append(f"{wheel.name}: {PINS.name} pins {name}=={pins[name]}")
        if not suits(python_tag, abi_tag, python_version):
            wrong.append(f"{wheel.name}: built for {python_tag}-{abi_tag}, not CPython {python_version}")
    for name, versions in found.items():
        if len(versions) > 1:
            wrong.append(f"{name}: {len(versions)} wheels ({', '.join(versions)}); pip --no-deps wants one")
    wrong += [f"{name}=={version}: no wheel in {folder}" for name, version in pins.items() if name not in found]
    if total_bytes > CARRY_LIMIT_BYTES:
        wrong.append(f"{total_bytes / 2**20:.1f} MiB of wheels: carry takes {CARRY_LIMIT_BYTES // 2**20} MiB")
    return wrong


def install(folder: Path, site: Path) -> int:
    """Install the wheels into `site` with pip where the Python has it; else unzip them there, which
    is what pip does for these (no scripts or data needed: the run imports, it calls no console script)."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        print(f"wheel set: no wheels in {folder}", file=sys.stderr)
        return 1
    if importlib.util.find_spec("pip") is not None:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                   "--no-deps", "--no-compile", "--no-cache-dir", "--target", str(site), *map(str, wheels)]  # fmt: skip
        return subprocess.run(command).returncode
    print("wheel set: this Python has no pip; unzipping the wheels", file=sys.stderr)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("pins", help="print the pins, one name==version a line")
    check = commands.add_parser("check", help="does DIR hold exactly the pinned wheels for this Python?")
    check.add_argument("folder", type=Path)
    check.add_argument("--python", default="3.12", help="CPython version the wheels are for (default: 3.12)")
    setup = commands.add_parser("install", help="install the wheels in DIR into SITE, as on the GPU machine")
    setup.add_argument("folder", type=Path)
    setup.add_argument("site", type=Path)
    args = parser.parse_args(argv)
    if args.command == "install":
        return install(args.folder, args.site)
    pins = read_pins()
    if args.command == "pins":
        print("\n".join(f"{name}=={version}" for name, version in pins.items()))
        return 0
    wrong = problems(args.folder, pins, args.python)
    for line in wrong:
        print(f"wheel set: {line}", file=sys.stderr)
    if not wrong:
        size_mib = sum(w.stat().st_size for w in args.folder.glob("*.whl")) / 2**20
        print(f"wheel set: {len(pins)} wheels for CPython {args.python}, {size_mib:.1f} MiB, as pinned")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
