"""mkdocs hooks: the parts of the site made from the code and the results, at build time, so they cannot drift.

A page holds a place as a pair of comments, `<!-- name -->` and `<!-- /name -->`; the build fills it:

* `reference/options.md`, `options`: every option of `AdaptiveGate`, from `adaptive_gate.options.option_table()`;
* `reference/metrics.md`, `metrics`: every metric family a gate exports, scraped from a live gate;
* `benchmarks.md`: the benchmark tables, from `benchmarks/results/*.json` through `benchmarks.report`.

The site also takes, as they are, files that live outside `docs/`: `CHANGELOG.md`, `CONTRIBUTING.md`
and the benchmark plots (`benchmarks/results/*.png`, as `results/*.png`).

The hand-written pages are checked instead: every key of a live gate's status document, every rejection
reason and every diagnostic code must be named on its page, and every file or folder that the architecture page
and `CONTRIBUTING.md` name must exist, or the build fails.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

GiB = 2**30
OUTSIDE = {"changelog.md": ROOT / "CHANGELOG.md", "contributing.md": ROOT / "CONTRIBUTING.md"}


def cell(text: str) -> str:
    """Text for a Markdown table cell: a pipe outside code would end the cell."""
    out, in_code = [], False
    for char in text:
        if char == "`":
            in_code = not in_code
        out.append("\\|" if char == "|" and not in_code else char)
    return "".join(out)


def code(text: str) -> str:
    return text if "`" in text else f"`{text}`"


def option_rows() -> list[str]:
    """The options of `AdaptiveGate`, from their one definition."""
    from adaptive_gate.options import option_table

    rows = ["| option | default | accepts | meaning |", "| --- | --- | --- | --- |"]
    for option in option_table():
        name, default, accepts, meaning = (option[key] for key in ("name", "default", "accepts", "meaning"))
        rows.append(f"| `{name}` | {cell(code(default))} | {cell(accepts)} | {cell(meaning)} |")
    return rows


async def _get(app: Any, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One GET through the ASGI app, without a client library."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"docs"), *((k.encode(), v.encode()) for k, v in (headers or {}).items())],
        "client": ("127.0.0.1", 1), "server": ("docs", 80),
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


@functools.cache
def live_gate() -> tuple[dict[str, Any], str]:
    """The status document and the metrics text of a gate with every optional part switched on (a
    simulated card, priorities, tenants, a queue target, a batched function's controller), after
    one request."""
    import anyio
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    import adaptive_gate
    from adaptive_gate import AdaptiveGate
    from adaptive_gate.testing import SimulatedGPU

    gpu = SimulatedGPU(24 * GiB, baseline_bytes=8 * GiB)

    @adaptive_gate.batch(probe=gpu)
    def double(items: list[int]) -> list[int]:
        return [2 * item for item in items]

    async def work(request: Request) -> JSONResponse:
        return JSONResponse(await double(1))

    gate = AdaptiveGate(
        Starlette(routes=[Route("/work", work)]),
        tag=None,
        probe=gpu,
        priority="x-priority",
        tenant="x-tenant",
        queue_target=0.5,
        controller=double.gate_controller(),
    )

    async def read() -> tuple[dict[str, Any], str]:
        async with gate.running():
            answers = [await _get(gate, "/work", {"x-priority": "1", "x-tenant": "docs"})]
            answers.append(await _get(gate, "/gate/status"))
            answers.append(await _get(gate, "/gate/metrics"))
        if [code for code, _ in answers] != [200, 200, 200]:
            codes = ", ".join(f"{code} {body[:200]!r}" for code, body in answers)
            raise PluginError(f"a live gate answered: {codes} (the metrics need prometheus-client: the docs extra)")
        return json.loads(answers[1][1]), answers[2][1].decode()

    return anyio.run(read)


def metric_families() -> list[dict[str, Any]]:
    """Each family of the live gate's metrics: name, type, help and the label values it showed."""
    families: list[dict[str, Any]] = []
    for line in live_gate()[1].splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP ") :].partition(" ")
            families.append({"name": name, "help": help_text, "type": "", "labels": {}})
        elif line.startswith("# TYPE "):
            families[-1]["type"] = line.rsplit(" ", 1)[1]
        elif "{" in line and not line.startswith("#"):
            for pair in line.split("{", 1)[1].rsplit("}", 1)[0].split('",'):
                label, _, value = pair.partition("=")
                if label != "le":  # a histogram's buckets: not a label a user selects on
                    families[-1]["labels"].setdefault(label.strip(), []).append(value.strip('"'))
    return families


LABELS_SHOWN = ("bound", "outcome", "reason", "direction", "code")  # fixed sets of values: listed in full


def metric_rows() -> list[str]:
    rows = ["| metric | type | labels | what it is |", "| --- | --- | --- | --- |"]
    for family in metric_families():
        name = family["name"]
        labels = []
        for label, values in family["labels"].items():
            shown = ", ".join(f"`{v}`" for v in dict.fromkeys(values)) if label in LABELS_SHOWN else ""
            labels.append(f"`{label}`" + (f": {shown}" if shown else ""))
        rows.append(f"| `{name}` | {family['type']} | {'; '.join(labels)} | {cell(family['help'])} |")
    return rows


def documented(markdown: str, names: list[str], page: str, what: str) -> None:
    missing = [name for name in names if f"`{name}`" not in markdown]
    if missing:
        raise PluginError(f"{page} does not describe {what} {', '.join(missing)}: add them to the page")


def check_status(markdown: str) -> str:
    status = live_gate()[0]
    documented(markdown, list(status), "reference/status.md", "the status keys")
    documented(markdown, list(status["counters"]), "reference/status.md", "the counters")
    return markdown


def check_rejections(markdown: str) -> str:
    from adaptive_gate.core import Reason

    reasons = [reason.value for reason in Reason]
    documented(markdown, reasons, "reference/rejections.md", "the rejection reasons")
    return markdown


def check_findings(markdown: str) -> str:
    from adaptive_gate.diagnostics import CODES

    documented(markdown, list(CODES), "guide/operating.md", "the diagnostic codes")
    return markdown


PATH = re.compile(r"`([\w./-]+(?:\.py|\.html|/))`")


def check_paths(markdown: str, page: str) -> str:
    """Every file or folder a page names in code (`_gate/core.py`, `adaptive_gate/_http/`) exists, under
    `adaptive_gate/` or the repository's root: a page that maps the code moves when the code does."""
    missing = sorted(
        {
            path
            for path in PATH.findall(markdown)
            if not (ROOT / "adaptive_gate" / path).exists() and not (ROOT / path).exists()
        }
    )
    if missing:
        raise PluginError(f"{page} names paths that do not exist: {', '.join(missing)}")
    return markdown


def render(made: Callable[[], dict[str, list[str]]], page: str) -> Callable[[str], str]:
    def fill(markdown: str) -> str:
        from benchmarks.report import rendered

        try:
            return rendered(markdown, made(), where=page)
        except ValueError as error:
            raise PluginError(str(error)) from error

    return fill


def benchmark_tables() -> dict[str, list[str]]:
    from benchmarks.report import docs_tables

    return docs_tables()


PAGES: dict[str, Callable[[str], str]] = {
    "reference/options.md": render(lambda: {"options": option_rows()}, "reference/options.md"),
    "reference/metrics.md": render(lambda: {"metrics": metric_rows()}, "reference/metrics.md"),
    "reference/status.md": check_status,
    "reference/rejections.md": check_rejections,
    "guide/operating.md": check_findings,
    "architecture.md": lambda markdown: check_paths(markdown, "architecture.md"),
    "benchmarks.md": render(benchmark_tables, "benchmarks.md"),
}


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri in OUTSIDE:
        check_paths(markdown, page.file.src_uri)
        return markdown.replace("](docs/", "](")  # written for the repository's root, read from the site's
    fill = PAGES.get(page.file.src_uri)
    return markdown if fill is None else fill(markdown)


def on_config(config: Any) -> Any:
    # `benchmarks` is not installed: it is read from the checkout. (mkdocs restores sys.path after it
    # loads this module, so the path goes in here, not at import.)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_files(files: Files, *, config: Any) -> Files:
    for src_uri, path in OUTSIDE.items():
        files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.png")):
        files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files
