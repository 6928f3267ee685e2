"""The package's floor plan: its public import paths, and imports that flow one way.

Every module is parsed (not imported), so an import under `TYPE_CHECKING` counts as much as one
that runs: a cycle there is still two modules that cannot be understood one without the other.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

import adaptive_gate

PACKAGE = Path(adaptive_gate.__file__).parent

# The import paths users and the documentation name: each keeps importing, with these names.
PUBLIC_PATHS = {
    "adaptive_gate": ["AIMD", "AdaptiveGate", "MemorySample", "batch", "is_oom"],
    "adaptive_gate.middleware": ["AdaptiveGate"],
    "adaptive_gate.options": ["GateOptions", "option_table"],
    "adaptive_gate.control": ["AIMD", "Controller", "Fixed"],
    "adaptive_gate.memory_model": ["MemoryModel"],
    "adaptive_gate.core": ["GateCore", "Outcome", "Ticket"],
    "adaptive_gate.limiter": ["Limiter", "Waiter"],
    "adaptive_gate.probes": ["Probe", "auto_probe"],
    "adaptive_gate.oom": ["is_oom"],
    "adaptive_gate.memory": ["MemorySample"],
    "adaptive_gate.statistics": ["GateStatistics"],
    "adaptive_gate.status": ["status_document"],
    "adaptive_gate.metrics": ["GateMetrics"],
    "adaptive_gate.diagnostics": ["Diagnostics"],
    "adaptive_gate.testing": ["SimulatedGPU"],
    "adaptive_gate.simulation": ["simulate"],
    "adaptive_gate.batch": ["batch"],
}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("adaptive_gate", *path.relative_to(PACKAGE).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, modules: set[str]) -> Iterator[str]:
    """The package's modules that `name` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                # `from . import metrics` imports the module `metrics`, not the package around it.
                if f"{source}.{alias.name}" in modules:
                    yield f"{source}.{alias.name}"
                elif source in modules:
                    yield source
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in modules)


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {
        name: {target for target in imports_of(name, path, set(modules)) if target != name}
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def part_of(module: str) -> str:
    """A sub-folder is one part; a module at the top of the package is a part of its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []


def test_the_parts_import_each_other_one_way() -> None:
    """Folders first: a sub-folder and the modules at the top may not depend on each other both ways."""
    graph: dict[str, set[str]] = {}
    for source, targets in import_graph().items():
        if source == "adaptive_gate":
            continue  # the package's face imports every part by design
        graph.setdefault(part_of(source), set()).update(part_of(t) for t in targets if part_of(t) != part_of(source))
    for targets in graph.values():
        targets.discard("adaptive_gate")
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("path", sorted(PUBLIC_PATHS))
def test_the_public_import_paths_hold(path: str) -> None:
    module = importlib.import_module(path)
    for name in PUBLIC_PATHS[path]:
        assert hasattr(module, name), f"{path}.{name} is gone"


def test_the_private_parts_live_in_folders() -> None:
    """The top of the package holds the public import paths and two shared leaves; the rest sits in
    a folder that says what it is part of."""
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    public = {path.rpartition(".")[2] for path in PUBLIC_PATHS if path != "adaptive_gate"}
    assert top - public == {"_checks", "_version"}


def test_the_core_and_the_controllers_read_no_clock() -> None:
    """Time is passed in: the core and the controllers import no clock, so the simulator's virtual
    time and the middleware's clock drive the same code. The limiter's `acquire` (for use on its
    own, outside the gate) is the one reader, and it reads the clock it is given."""
    readers = set()
    for folder in ("_gate", "_control"):
        for path in (PACKAGE / folder).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [alias.name for alias in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(name.split(".")[0] in ("time", "datetime") for name in names):
                    readers.add(f"{folder}/{path.name}")
    assert readers == {"_gate/limiter.py"}


def test_the_controller_is_told_in_40_lines_with_6_knobs_at_most() -> None:
    """What a user must read to know why the limit is what it is stays short: the controller's page at
    most 40 lines, and the default controller at most six knobs (its own and its memory model's)."""
    from adaptive_gate.control import AIMD
    from adaptive_gate.memory_model import MemoryModel

    page = Path(__file__).parents[1] / "docs" / "explanation" / "controller.md"
    assert len(page.read_text().splitlines()) <= 40
    knobs = [
        name
        for cls in (AIMD, MemoryModel)
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name != "memory"
    ]
    assert len(knobs) <= 6, knobs
