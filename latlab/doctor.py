"""`latlab doctor`: the CPU, the GPU and the ONNX Runtime providers that really load on this machine."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from latlab.common import machine, procs
from latlab.loadtest import child
from latlab.loadtest.floor import floor_at, floor_figures
from latlab.loadtest.plan import SweepPlan, Workload
from latlab.loadtest.results import read_results
from latlab.loadtest.schedule import Schedule
from latlab.server.command import serve_command

PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider")
"""Checked on every machine, whether or not this onnxruntime build lists them."""
# What ORT runs beneath each provider for the nodes it cannot take (the same chains the server asks for).
_CHAINS = {
    "CPUExecutionProvider": [],
    "CUDAExecutionProvider": ["CPUExecutionProvider"],
    "TensorrtExecutionProvider": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}


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
    """'loads' when a session really runs on the provider, otherwise why not or what ORT did instead."""
    import onnxruntime as ort

    from latlab.server.runtime.providers import provider_load_error

    if provider not in ort.get_available_providers():
        return f"does not load: this onnxruntime build ({ort.get_device()}) has no {provider}"
    reason = provider_load_error(provider)
    if reason:
        return f"does not load: {reason}"
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the fallback is reported below, not as ORT's banner
    try:
        session = ort.InferenceSession(str(model), options, providers=[provider, *_CHAINS[provider]])
    except Exception as exc:  # a provider that cannot even be requested
        return f"fails: {' '.join(str(exc).split())[:160]}"
    got = session.get_providers()
    return "loads" if got[0] == provider else f"does not load: ONNX Runtime fell back to {got[0]}"


def gpu_lines() -> list[str]:
    """One line per GPU: NVML first, nvidia-smi where NVML cannot answer; one line saying so without any."""
    from latlab.server.gpu import nvml_gpus

    gpus = nvml_gpus()
    if gpus:
        return [f"{g.name}, {g.memory_total_bytes / 2**30:.1f} GiB (GPU {g.index}, NVML)" for g in gpus]
    smi = nvidia_smi_gpus()
    if smi:
        return [f"{line} (nvidia-smi)" for line in smi]
    nvml = "no GPU" if gpus == [] else "no driver or library"
    return [f"none (NVML: {nvml}; nvidia-smi: {'no GPU' if shutil.which('nvidia-smi') else 'not installed'})"]


def nvidia_smi_gpus() -> list[str]:
    """GPU names and memory from nvidia-smi, when there is one."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


GENERATOR_RATES = (50.0, 1000.0)
"""The doctor's calibration rates: a lab's low end, and about where one generator process nears its limit."""


def generator_line(host: str | None = None) -> str:
    """The load generator's floor (loadtest/floor.py) against `host`, or against a latlab serve of the one-Add
    model on a free port of 127.0.0.1: what this generator adds to every latency on this machine."""
    with tempfile.TemporaryDirectory() as tmp:
        if host:
            return _floor_against(host, Path(tmp))
        port = procs.free_port()
        config = Path(tmp) / "doctor.toml"
        model = tiny_model(Path(tmp) / "tiny.onnx")
        config.write_text(
            f'[server]\nhost = "127.0.0.1"\nport = {port}\n\n[[deployments]]\nname = "doctor"\nmodel_path = "{model}"\n'
        )
        log = Path(tmp) / "serve.log"
        server = procs.start(serve_command(config), log_path=log)
        try:
            url = f"http://127.0.0.1:{port}"
            procs.wait_ready(f"{url}/v2/health/ready", server, timeout_s=60, log_path=log)
            return _floor_against(url, Path(tmp)) + " (latlab serve of a one-Add model)"
        finally:
            procs.stop(server)


def _floor_against(host: str, tmp: Path) -> str:
    plan = SweepPlan(Workload(host), Schedule(loads=GENERATOR_RATES, calibrate_only=True))
    log = tmp / "cal.log"
    calibration = child.start(plan, tmp / "cal", log_path=log)
    try:
        status = calibration.wait(timeout=120)
    finally:
        procs.stop(calibration)
    if status != 0:
        said = log.read_text(errors="replace").strip().splitlines()
        return f"not measured: {said[-1] if said else f'latlab loadtest exited {status}'}"
    (run,) = read_results(tmp / "cal")
    floor = run.generator_floor
    if floor_at(floor, None) is None:
        return f"not measured: {floor_figures(floor)} of {host}"
    return f"adds {floor_figures(floor)}, GET {floor['route']} of {host}"


def report(generator: bool = False, host: str | None = None) -> str:
    """The doctor's report: one line per fact; with `generator`, the load generator's floor last."""
    import onnxruntime as ort

    info = machine.describe()
    lines = [
        f"cpu:          {info['cpu']}",
        f"cores:        {info['cores']} logical",
        f"memory:       {info['memory_gib']} GiB",
        f"os:           {info['os']}, Python {info['python']}",
    ]
    lines += [f"gpu:          {line}" for line in gpu_lines()]
    lines.append(
        f"onnxruntime:  {ort.__version__} ({ort.get_device()} build; lists {', '.join(ort.get_available_providers())})"
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp) / "tiny.onnx")
        for provider in PROVIDERS:
            lines.append(f"provider:     {provider:<26} {provider_check(model, provider)}")
    if generator:
        lines.append(f"generator:    {generator_line(host)}")
    return "\n".join(lines)
