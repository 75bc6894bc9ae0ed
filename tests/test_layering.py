"""The stages import one way: server/ no other stage, loadtest/ neither the server nor the report, report/
never the server; the serving box needs only onnxruntime (server/ and loadtest/ never pull in torch). Inside the
stages no module reaches back to one that imports it, not even through an import inside a function, and the
subpackages of a stage import one way too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = {
    "common": "common",
    "export": "export",
    "server": "server",
    "loadtest": "loadtest",
    "report": "report",
    "latlab": "latlab",
}
ALLOWED = {
    "common": set(),
    "server": {"common"},
    "loadtest": {"common"},
    "report": {"common", "loadtest"},
    "export": {"common", "server"},
    "latlab": {"common", "export", "server", "loadtest", "report"},
}
"""Which other stages each stage may import: common/ none, latlab/ (the CLI, the lab, the bench) all; the root
package's own `latlab.__version__` belongs to no stage. No two stages import each other."""


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("latlab.server.http.app", ["torch"]),
        ("latlab.server.processes.wsgi", ["torch"]),
        ("latlab.loadtest.sweep", ["torch", "onnxruntime", "latlab.server", "latlab.report"]),
        ("latlab.loadtest.driver", ["torch", "onnxruntime", "latlab.server", "latlab.report"]),
        ("latlab.loadtest.overload", ["torch", "onnxruntime", "latlab.server", "latlab.report"]),
        ("latlab.report.write", ["torch", "onnxruntime", "latlab.server"]),
    ],
)
def test_module_does_not_import(module, forbidden):
    code = (
        f"import sys, {module}; "
        f"print(','.join(m for m in {forbidden!r} if any(k == m or k.startswith(m + '.') for k in sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"{module} imports {result.stdout.strip()}"


def stage_imports(stage: str) -> dict[str, set[str]]:
    """Per module of the stage's folder, the other stages it imports (at any depth of the file: lazy imports too)."""
    found = {}
    for name, path in MODULES.items():
        if _stage_of(name) == stage:
            found[str(path.relative_to(ROOT))] = {_stage_of(target) for target in imported(name)} - {None, stage}
    return found


def _modules() -> dict[str, Path]:
    """Every module of ours by its installed name (`latlab.server.http.app`), from the folders' package map."""
    modules = {}
    for stage, folder in STAGES.items():
        package = "latlab" if stage == "latlab" else f"latlab.{stage}"
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _modules()


def imported(module: str) -> set[str]:
    """The modules of ours that `module` imports, wherever the import stands (top level or inside a function)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..batching import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from latlab.server import config` names a module, `from x import f` not
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        elif isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
    found = set()
    for target in targets:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target not in (module, "latlab"):
            found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted: every one is a cycle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "latlab" or len(parts) == 1:
        return None  # not ours, or the root package's version
    return parts[1] if parts[1] in STAGES and parts[1] != "latlab" else "latlab"


def test_no_two_stages_import_each_other():
    assert not [(a, b) for a in ALLOWED for b in ALLOWED[a] if a in ALLOWED[b]]


@pytest.mark.parametrize("stage", sorted(ALLOWED))
def test_stages_import_only_the_stages_below_them(stage):
    wrong = {
        module: sorted(other - ALLOWED[stage])
        for module, other in stage_imports(stage).items()
        if other - ALLOWED[stage]
    }
    assert not wrong, f"{stage}/ imports what its layer may not: {wrong}"


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    """An import inside a function hides a cycle from Python's import machinery, not from this test."""
    found = cycles({module: imported(module) for module in MODULES})
    assert not found, f"import cycles (counting imports inside functions): {found}"


def subpackage_of(module: str) -> str:
    """`latlab.server.http.app` -> `latlab.server.http`; a module at a stage's top level is its own unit."""
    parts = module.split(".")
    if len(parts) == 1:
        return module
    depth = 2 if parts[1] in ALLOWED and parts[1] != "latlab" else 1
    return ".".join(parts[: depth + 1])


def test_subpackages_import_one_way():
    """Within a stage, if server/http uses server/batching then nothing in server/batching uses server/http."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        unit = subpackage_of(module)
        graph.setdefault(unit, set()).update(
            subpackage_of(t) for t in imported(module) if _stage_of(t) == _stage_of(module)
        )
    for unit, others in graph.items():
        others.discard(unit)
    found = cycles(graph)
    assert not found, f"subpackages that import each other: {found}"
