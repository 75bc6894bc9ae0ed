"""The kit's steps on the GPU machine (standard library only: nothing else is there before `install`).

Each step runs its command with the installed packages first on the path, from outside the source tree (whose
`latlab` folder would shadow the installed package), under its cap: past it the kit sends Ctrl-C, which the lab
and the benchmarks answer by stopping their children. When a step ends, what it wrote is packed into one archive
in $OUT at once (`leg<N>-<step>.tar.gz`), so a call stopped at its limit still brings back every step it
finished. With `rehearse` (a machine without CUDA) the CUDA-only parts are skipped and said so, and the
plans run their CPU half. The fleet steps find the kit's own haproxy (haproxy.py) next on the path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from xml.etree import ElementTree

from gpukit import carry, haproxy
from gpukit.legs import FLEET_REPLICAS, Step

ROOT = carry.ROOT
KIT = Path(os.environ.get("LATLAB_KIT", "/tmp/latlab-kit"))
"""Where the device keeps the parts, the installed packages, the models and the runs (kept between the calls
of one loan: the machine stays warm 30 s)."""
SITE = KIT / "site"
MODELS = KIT / "models"
HAPROXY = KIT / "haproxy"
"""Debian's haproxy and its libraries, unpacked from the kit's .deb files by the first fleet step of a loan."""
ARCHIVE_SUFFIX = ".tar.gz"
GPU_TEST_MARK = "@pytest.mark.gpu"
IMPORTS = (
    "onnxruntime flask granian orjson locust zmq tomli_w msgpack prometheus_client psutil pynvml requests "
    "onnxscript safetensors matplotlib onnx numpy torch latlab.cli latlab.server.processes.wsgi"
)
"""What latlab imports on the device: checked right after the install, before anything is measured."""
LATLAB = [sys.executable, "-m", "latlab.cli"]
"""The `latlab` command: the kit runs `latlab doctor`, `latlab lab` and `latlab bench` on the device as a user
would, so a trip measures the commands users run."""


def out_dir() -> Path:
    out = Path(os.environ.get("OUT") or KIT / "out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _nvidia_library_dirs() -> list[str]:
    """The lib folders of the machine's own nvidia-* packages. onnxruntime.preload_dlls looks for them
    beside onnxruntime, which here lives apart in SITE, so the children get them on LD_LIBRARY_PATH."""
    found = []
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir() and not root.is_relative_to(SITE):
            found += sorted({str(lib.parent) for lib in root.rglob("lib*.so*") if lib.parent.name == "lib"})
    return found


def device_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(SITE / "bin"), str((HAPROXY / haproxy.WRAPPER).parent), env.get("PATH", "")))
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*_nvidia_library_dirs(), env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def logged(command: list[str], log: Path, cap_s: float | None = None, label: str = "", cwd: Path = KIT) -> int:
    """Run `command` with its output both on the console and in `log`; Ctrl-C after cap_s seconds."""
    shown = label or " ".join(command)
    print(f"$ {shown}", flush=True)
    cwd.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"$ {shown}\n")
        child = subprocess.Popen(
            command, cwd=cwd, env=device_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        started = time.monotonic()
        watchdog = threading.Timer(cap_s, child.send_signal, [signal.SIGINT]) if cap_s else None
        if watchdog:
            watchdog.start()
        for line in child.stdout:
            sys.stdout.write(line)
            f.write(line)
        code = child.wait()
        if watchdog:
            watchdog.cancel()
        f.write(f"[exit {code} after {time.monotonic() - started:.0f} s]\n")
    return code


class StepFailed(Exception):
    """A step that makes the rest of its leg meaningless (CUDA did not load, the install failed)."""


class Stage:
    """The folder one step writes into; packed into $OUT as leg<N>-<step>.tar.gz when the step ends."""

    def __init__(self, leg: int, step: str) -> None:
        self.name = f"leg{leg}-{step}"
        self.path = KIT / "staged" / self.name
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True)

    def pack(self, seconds: float, code: str) -> Path:
        (self.path / "step.json").write_text(json.dumps({"step": self.name, "seconds": round(seconds, 1), "end": code}))
        archive = out_dir() / f"{self.name}{ARCHIVE_SUFFIX}"
        with tarfile.open(archive, "w:gz") as tar:
            for entry in sorted(self.path.iterdir()):
                tar.add(entry, arcname=entry.name)
        shutil.rmtree(self.path)
        print(f"packed {archive.name} ({archive.stat().st_size / 2**20:.2f} MiB)", flush=True)
        return archive


# --- the steps ----------------------------------------------------------------------------------------------


def stash(stage: Path, cap_s: float, rehearse: bool, tree: Path = ROOT) -> None:
    have, missing = carry.stash(tree, KIT)
    message = f"parts here: {', '.join(have)}; still to carry: {', '.join(missing) or 'none'}"
    print(message)
    (stage / "stash.txt").write_text(message + "\n")


def install(stage: Path, cap_s: float, rehearse: bool) -> None:
    archive = carry.join(KIT)
    shutil.rmtree(KIT / "bundle", ignore_errors=True)
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(KIT, filter="data")
    archive.unlink()
    shutil.copy2(KIT / "bundle" / "manifest.json", stage / "manifest.json")
    wheels = sorted(str(w) for w in (KIT / "bundle" / "wheels").glob("*.whl"))
    shutil.rmtree(SITE, ignore_errors=True)
    log = stage / "install.log"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile"]
    if logged([*pip, "--target", str(SITE), *wheels], log, cap_s):
        raise StepFailed("pip install failed; see install.log")
    check = f"import importlib; [importlib.import_module(m) for m in {IMPORTS.split()!r}]"
    if logged([sys.executable, "-c", check], log, cap_s, label="python -c <import every latlab dependency>"):
        raise StepFailed("a latlab dependency does not import on this image; see install.log")
    print(f"installed {len(wheels)} wheels into {SITE}")


CUDA_CHECK = """
import json, sys
import numpy as np
import onnxruntime as ort
ort.preload_dlls()
from latlab.server.runtime.providers import provider_load_error
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
m = numpy_helper.from_array(rng.standard_normal((8 * 6 * 6, 16)).astype(np.float32), "m")
nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["y"])]
graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], [w, m])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
x = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
cuda = ort.InferenceSession(model, providers=[("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"])
cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
error = float(np.max(np.abs(cuda.run(None, x)[0] - cpu.run(None, x)[0])))
found = {"onnxruntime": ort.__version__, "file": ort.__file__, "available": ort.get_available_providers(),
         "session": cuda.get_providers(), "cuda_load_error": provider_load_error("CUDAExecutionProvider"),
         "conv_matmul_max_abs_error_vs_cpu": error}
print(json.dumps(found, indent=1))
sys.exit(0 if found["session"][0] == "CUDAExecutionProvider" and error < 1e-3 else 3)
"""
"""A Conv and a MatMul on CUDA against the CPU: the kernels the trimmed provider kept really run on this GPU."""


def cuda(stage: Path, cap_s: float, rehearse: bool) -> None:
    code = logged([sys.executable, "-c", CUDA_CHECK], stage / "cuda.log", cap_s, label="python -c <CUDA runs a Conv>")
    if code and not rehearse:
        raise StepFailed("CUDA did not run the check model (see cuda.log): nothing below would mean anything")
    if code:
        print("rehearsal: no CUDA here, going on with the CPU half")


def verify(stage: Path, cap_s: float, rehearse: bool) -> None:
    cuda(stage, cap_s, rehearse)
    log = stage / "verify.log"
    logged([*LATLAB, "doctor"], log, cap_s)
    suite = KIT / "suite"  # the tests outside the source tree, so they import the installed latlab
    shutil.rmtree(suite, ignore_errors=True)
    shutil.copytree(ROOT / "tests", suite / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", suite / "pyproject.toml")  # the markers
    files = sorted(
        str(p.relative_to(suite)) for p in (suite / "tests").rglob("test_*.py") if GPU_TEST_MARK in p.read_text()
    )
    report = stage / "gpu-tests.xml"
    pytest = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rs", "-p", "no:cacheprovider"]
    code = logged([*pytest, "--junitxml", str(report), *files], log, cap_s, cwd=suite)
    totals = ElementTree.parse(report).getroot().find("testsuite").attrib
    counts = {k: int(totals[k]) for k in ("tests", "failures", "errors", "skipped")}
    (stage / "gpu-tests.json").write_text(json.dumps(counts))
    print(f"GPU tests: {counts}")
    if (code or counts["skipped"]) and not rehearse:  # on a GPU machine a skip means CUDA did not work
        print(f"GPU tests not all passed: {counts}; see verify.log (going on: the rest still measures)")


def _script(name: str, args: list[str], stage: Path, cap_s: float) -> int:
    return logged([sys.executable, str(ROOT / "benchmarks" / name), *args], stage / f"{Path(name).stem}.log", cap_s)


def buckets(stage: Path, cap_s: float, rehearse: bool) -> None:
    provider = ["--provider", "cpu", "--quick"] if rehearse else ["--provider", "cuda"]
    args = [*provider, "--models-dir", str(MODELS / "bench"), "--out", str(stage / "gpu-buckets.json")]
    _script("gpu_buckets.py", args, stage, cap_s)


def _lab(stage: Path, cap_s: float, plan: str, extra: list[str], folder: str) -> None:
    """A lab run; its run folder's small files into stage/<folder>/ (results per model, report, logs)."""
    runs = KIT / "runs" / folder
    command = [*LATLAB, "lab", "--plan", plan, "--runs-dir", str(runs)]
    code = logged([*command, "--models-dir", str(MODELS), *extra], stage / f"{folder}.log", cap_s)
    done = [p for p in runs.glob("*") if p.is_dir()]
    if done:
        keep_run(max(done, key=lambda p: p.stat().st_mtime), stage / folder)
    print(f"lab: exit {code}")


def lab_model(model: str) -> Callable[[Path, float, bool], None]:
    """The serve leg's lab run of one model (plan gpu-serve): one call each, so a model's sweep to the device's
    ceiling fits one command and a model cut short by its cap leaves the other measured."""

    def step(stage: Path, cap_s: float, rehearse: bool) -> None:
        _lab(stage, cap_s, "gpu-serve-cpu" if rehearse else "gpu-serve", ["--models", model], f"lab-{model}")

    return step


def lab_small(stage: Path, cap_s: float, rehearse: bool) -> None:
    _lab(stage, cap_s, "quick" if rehearse else "gpu-quick", ["--models", "mlp,ffn"], "lab-small")


def lab_traffic(stage: Path, cap_s: float, rehearse: bool) -> None:
    # P99 100 tokens: a length past minilm's 512 positions comes about once in a million requests
    extra = ["--models", "minilm", "--traffic", "poisson,gamma:3", "--dim", "seq=lognormal:16:100"]
    _lab(stage, cap_s, "gpu-serve-cpu" if rehearse else "gpu-serve", extra, "lab-traffic")


def carried_haproxy(stage: Path) -> None:
    """Debian's haproxy from the kit, unpacked once per loan and first on every step's PATH; one that cannot run
    on this image fails the leg in one line before any fleet starts."""
    log = stage / "haproxy.log"
    if not (HAPROXY / haproxy.WRAPPER).is_file():
        try:
            haproxy.unpack(KIT / "bundle" / haproxy.DEBS_FOLDER, HAPROXY)
        except (haproxy.NotCarried, subprocess.CalledProcessError) as failed:
            raise StepFailed(f"the carried haproxy could not be unpacked: {failed}") from failed
    found = shutil.which("haproxy", path=device_env()["PATH"])
    log.write_text(f"haproxy on PATH: {found}\n")
    if found is None or logged(["haproxy", "-vv"], log, 30):
        raise StepFailed("the carried haproxy does not run on this image (see haproxy.log): no fleet to measure")


def fleet(stage: Path, cap_s: float, replicas: int) -> None:
    """minilm served by a CPU fleet of `replicas` behind the carried HAProxy (leastconn), the cores the load
    generator leaves split between the replicas (docs/fleet.md). The plan is gpu-serve's CPU half (short steps,
    p99 <= 25 and 50 ms, minilm batched and not), so three fleets fit one loan; the same on any machine."""
    carried_haproxy(stage)
    extra = ["--models", "minilm", "--replicas", str(replicas), "--balance", "leastconn"]
    extra += ["--machine-name", f"{os.cpu_count()}-core, {replicas} CPU replica(s)"]
    _lab(stage, cap_s, "gpu-serve-cpu", extra, f"fleet-{replicas}")


def fleet_step(replicas: int) -> Callable[[Path, float, bool], None]:
    """The step `fleet-N` (legs.py names one per replica count)."""

    def step(stage: Path, cap_s: float, rehearse: bool) -> None:
        fleet(stage, cap_s, replicas)

    return step


def search(stage: Path, cap_s: float, rehearse: bool) -> None:
    # one side-by-side round and 1.5 minutes of search per model: both models inside one call's cap
    provider, minutes = ("cpu", "0.5") if rehearse else ("cuda", "1.5")
    args = ["minilm", "cnn", "--provider", provider, "--slo", "50ms", "--search-minutes", minutes, "--rounds", "1"]
    args += ["--models-dir", str(MODELS), "--out", str(stage / "search-vs-lab")]
    _script("search_vs_lab.py", args, stage, cap_s)


def frontends(stage: Path, cap_s: float, rehearse: bool) -> None:
    provider = ["--provider", "cpu", "--quick"] if rehearse else ["--provider", "cuda"]
    args = [*provider, "--models-dir", str(MODELS / "bench"), "--out", str(stage / "frontends-gpu.json")]
    _script("frontends_gpu.py", args, stage, cap_s)


def bench(stage: Path, cap_s: float, rehearse: bool) -> None:
    backends = "ort-cpu,torch-cpu" + ("" if rehearse else ",ort-cuda,torch-cuda")
    # seed 003's batch, width and depth sweeps; up to 2**28 parameters (1 GiB of fp32), so the widest points,
    # whose export alone takes minutes, do not push the call past its limit
    args = ["--experiments", "batch_size,d_model,n_layers", "--backends", backends, "--min-time", "0.1"]
    args += ["--max-params", str(2**28), *(["--quick"] if rehearse else [])]
    bench_dir = KIT / "bench"
    command = [*LATLAB, "bench", *args, "--cache-dir", str(KIT / "bench-cache")]
    logged([*command, "--out", str(bench_dir)], stage / "bench.log", cap_s)
    keep_run(bench_dir, stage / "bench")


STEPS = {
    "stash": stash,
    "install": install,
    "cuda": cuda,
    "verify": verify,
    "buckets": buckets,
    "lab-cnn": lab_model("cnn"),
    "lab-minilm": lab_model("minilm"),
    "lab-small": lab_small,
    "lab-traffic": lab_traffic,
    "search": search,
    "frontends": frontends,
    "bench": bench,
    **{f"fleet-{n}": fleet_step(n) for n in FLEET_REPLICAS},
}


def keep_run(run: Path, dest: Path) -> None:
    """A run folder's small files (results, bench, logs, config, report and figures) into `dest`."""
    for source in run.rglob("*"):
        if (
            source.is_file()
            and source.suffix in (".json", ".log", ".toml", ".html", ".png", ".txt")
            and "prometheus" not in source.parts
            and source.stat().st_size < 8 * 2**20
        ):
            target = dest / source.relative_to(run)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def run_call(leg: int, steps: tuple[Step, ...], rehearse: bool, tree: Path = ROOT) -> int:
    """One device call: its steps in order, each packed into $OUT as it ends. A step that fails its leg stops
    the call (exit 3); a step stopped at its cap does not."""
    for step in steps:
        stage = Stage(leg, step.name)
        started, end = time.monotonic(), "done"
        try:
            if step.name == "stash":
                stash(stage.path, step.cap_s, rehearse, tree)
            else:
                STEPS[step.name](stage.path, step.cap_s, rehearse)
        except (StepFailed, SystemExit) as failed:
            end = f"failed: {failed}"
            print(end, flush=True)
            return 3
        finally:
            stage.pack(time.monotonic() - started, end)
    return 0
