"""The serving box needs only onnxruntime: server/ and loadtest/ must not pull in torch (or the server)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module, forbidden", [
    ("latlab.server.app", ["torch"]),
    ("latlab.server.wsgi", ["torch"]),
    ("latlab.loadtest.sweep", ["torch", "onnxruntime", "latlab.server"]),
    ("latlab.loadtest.report", ["torch", "onnxruntime", "latlab.server"]),
    ("latlab.loadtest.driver", ["torch", "onnxruntime", "latlab.server"]),
    ("latlab.loadtest.overload", ["torch", "onnxruntime", "latlab.server"]),
])
def test_module_does_not_import(module, forbidden):
    code = (f"import sys, {module}; "
            f"print(','.join(m for m in {forbidden!r} if any(k == m or k.startswith(m + '.') for k in sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"{module} imports {result.stdout.strip()}"
