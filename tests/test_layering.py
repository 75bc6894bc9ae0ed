"""The stages import one way: server/ no other stage, loadtest/ neither the server nor the report, report/
never the server; the serving box needs only onnxruntime (server/ and loadtest/ never pull in torch)."""

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
        ("latlab.server.app", ["torch"]),
        ("latlab.server.wsgi", ["torch"]),
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
    for path in sorted((ROOT / STAGES[stage]).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "latlab":  # from latlab import procs
                names.update(f"latlab.{alias.name}" for alias in node.names if not alias.name.startswith("__"))
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[path.name] = {_stage_of(name) for name in names} - {None, stage}
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
