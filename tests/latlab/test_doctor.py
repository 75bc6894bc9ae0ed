"""`latlab doctor`: one line per fact, every provider tried, GPU from NVML or nvidia-smi, exit 0 without a GPU."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from latlab import doctor
from latlab.common.machine import cpu_model
from latlab.server.gpu import GpuInfo
from latlab.server.runtime.providers import provider_load_error


def test_report_has_one_line_per_fact() -> None:
    lines = doctor.report().splitlines()
    keys = [line.split(":", 1)[0] for line in lines]
    assert keys[:5] == ["cpu", "cores", "memory", "os", "gpu"]
    assert keys[-4:] == ["onnxruntime", "provider", "provider", "provider"]
    assert lines[0].endswith(cpu_model())
    assert f"{os.cpu_count()} logical" in lines[1]
    assert ort.__version__ in lines[-4]


def test_every_provider_is_really_tried() -> None:
    lines = {line.split()[1]: line for line in doctor.report().splitlines() if line.startswith("provider:")}
    assert set(lines) == set(doctor.PROVIDERS)
    assert lines["CPUExecutionProvider"].endswith(" loads")
    for provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        reason = provider_load_error(provider)
        if reason is None:  # a GPU box: the line says what a real session did
            assert lines[provider].endswith(" loads") or "fell back" in lines[provider]
        else:
            assert lines[provider].endswith(f"does not load: {reason}")


def test_a_provider_this_build_lacks_is_named(tmp_path: Path) -> None:
    model = doctor.tiny_model(tmp_path / "t.onnx")
    assert doctor.provider_check(model, "NoSuchExecutionProvider") == (
        f"does not load: this onnxruntime build ({ort.get_device()}) has no NoSuchExecutionProvider"
    )


def test_gpu_lines_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("latlab.server.gpu.nvml_gpus", lambda: [GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 * 2**30)])
    assert doctor.gpu_lines() == ["NVIDIA H100 80GB HBM3, 80.0 GiB (GPU 0, NVML)"]


def fake_nvidia_smi(folder: Path, output: str) -> None:
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_gpu_lines_fall_back_to_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("latlab.server.gpu.nvml_gpus", lambda: None)
    fake_nvidia_smi(tmp_path, "NVIDIA L4, 23034 MiB\\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert doctor.gpu_lines() == ["NVIDIA L4, 23034 MiB (nvidia-smi)"]


def test_gpu_lines_without_any_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("latlab.server.gpu.nvml_gpus", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    assert doctor.gpu_lines() == ["none (NVML: no driver or library; nvidia-smi: not installed)"]
    monkeypatch.setattr("latlab.server.gpu.nvml_gpus", lambda: [])
    assert doctor.gpu_lines() == ["none (NVML: no GPU; nvidia-smi: not installed)"]


def test_cli_exits_zero_and_prints_the_report() -> None:
    code = "import sys; from latlab.cli import main; sys.exit(main(['doctor']))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("cpu:")
    assert "CPUExecutionProvider" in result.stdout and "Traceback" not in result.stderr


def test_the_doctor_measures_the_generators_floor_against_a_server_it_is_given() -> None:
    from tests.loadtest.stub_server import StubModel, stub_server

    with stub_server(StubModel()) as url:
        line = doctor.report(generator=True, host=url).splitlines()[-1]
    assert line.startswith("generator:    adds p50 ")
    assert f"GET /v2/health/live of {url}" in line
    assert line.count(" req/s ") == 2  # the lab's low end and near the generator's own limit


def test_latlab_doctor_measures_the_floor_against_a_server_of_its_own_and_stops_it() -> None:
    done = subprocess.run([sys.executable, "-m", "latlab.cli", "doctor"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    line = done.stdout.splitlines()[-1]
    assert line.startswith("generator:    adds p50 ") and line.endswith("(latlab serve of a one-Add model)")
    port = int(line.split("http://127.0.0.1:")[1].split()[0])
    with pytest.raises(OSError):  # the server it started is gone
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_a_server_that_does_not_answer_leaves_the_floor_not_measured_and_says_why() -> None:
    from latlab.common import procs

    line = doctor.generator_line(f"http://127.0.0.1:{procs.free_port()}")
    assert line.startswith("not measured: ")
