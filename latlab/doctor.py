"""`latlab doctor`: the CPU, the GPU and the ONNX Runtime providers that really load on this machine."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from latlab import machine


def tiny_model(path: Path) -> Path:
    """An ONNX model of one Add, enough to find out whether a provider loads."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "doctor", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def provider_check(model: Path, provider: str) -> str:
    """'loads' when a session really runs on the provider, otherwise what ORT did instead."""
    import onnxruntime as ort

    from latlab.server.runtime import provider_load_error

    reason = provider_load_error(provider)
    if reason:
        return f"does not load: {reason}"
    providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(str(model), providers=providers)
    except Exception as exc:  # a provider that cannot even be requested
        return f"fails: {str(exc).splitlines()[0][:160]}"
    got = session.get_providers()
    return "loads" if got[0] == provider else f"falls back to {got[0]}"


def gpus() -> list[str]:
    """GPU names and memory from nvidia-smi, when there is one."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def report() -> str:
    import onnxruntime as ort

    info = machine.describe()
    lines = [f"CPU:        {info['cpu']} ({info['cores']} logical cores), {info['memory_gib']} GiB RAM",
             f"OS:         {info['os']}, Python {info['python']}",
             f"GPU:        {', '.join(gpus()) or 'none found (no nvidia-smi or no device)'}",
             f"ORT:        onnxruntime {ort.__version__}, device {ort.get_device()}"]
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp) / "tiny.onnx")
        for provider in ort.get_available_providers():
            lines.append(f"provider:   {provider:<28} {provider_check(model, provider)}")
    return "\n".join(lines)
