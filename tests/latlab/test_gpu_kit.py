"""benchmarks/gpu_kit.py: the parts a GPU machine is given one call at a time come back together intact."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

KIT_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_kit.py"
_SPEC = importlib.util.spec_from_file_location("gpu_kit", KIT_SCRIPT)
kit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kit)


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "kit.tar"
    path.write_bytes(os.urandom(10_000) + b"end")
    return path


def carried(tree: Path, archive: Path, part_bytes: int = 4096) -> list[Path]:
    """The parts as `prepare` leaves them in the source tree (.whl/carry-K/)."""
    return kit.split(archive, tree / ".whl", part_bytes)


def test_parts_carried_one_call_each_join_into_the_same_archive(tmp_path: Path, archive: Path) -> None:
    store = tmp_path / "store"
    parts = carried(tmp_path / "tree", archive)
    assert [p.parent.name for p in parts] == ["carry-1", "carry-2", "carry-3"]
    assert all(p.stat().st_size <= 4096 for p in parts)
    expected = archive.read_bytes()
    archive.unlink()

    for index, part in enumerate(parts, start=1):  # each call's tree holds only the folder it carried
        call_tree = tmp_path / f"call-{index}"
        shutil.copytree(part.parent, call_tree / ".whl" / part.parent.name)
        have, missing = kit.stash(call_tree, store)
        assert len(have) == index and len(missing) == len(parts) - index

    assert kit.join(store).read_bytes() == expected


def test_a_missing_part_is_named_and_nothing_is_joined(tmp_path: Path, archive: Path) -> None:
    parts = carried(tmp_path / "tree", archive)
    for part in parts[1:]:
        part.unlink()
    have, missing = kit.stash(tmp_path / "tree", tmp_path / "store")
    assert have == [parts[0].name] and missing == [parts[1].name, parts[2].name]
    with pytest.raises(SystemExit, match=f"parts missing: {parts[1].name}, {parts[2].name}"):
        kit.join(tmp_path / "store")
    assert not (tmp_path / "store" / "kit.tar").exists()


def test_a_damaged_part_is_refused_on_arrival(tmp_path: Path, archive: Path) -> None:
    parts = carried(tmp_path / "tree", archive)
    damaged = bytearray(parts[1].read_bytes())
    damaged[100] ^= 0xFF
    parts[1].write_bytes(bytes(damaged))
    with pytest.raises(SystemExit, match="arrived damaged"):
        kit.stash(tmp_path / "tree", tmp_path / "store")


def test_a_rehearsed_device_call_brings_everything_back_in_one_archive_that_collect_unpacks(tmp_path: Path) -> None:
    """The 24 Nov H100 trip left its results behind: a call returns at most 8 files and the lab step wrote
    ~15. Rehearsed here (no CUDA): a real bench call packs all it wrote into one archive, and collect puts
    the bench's results and log where --with-reference finds them."""
    out, kit_dir = tmp_path / "out", tmp_path / "kit"
    env = {**os.environ, "OUT": str(out), "LATLAB_KIT": str(kit_dir)}
    bench = ["--experiments", "batch_size", "--batches", "1,4", "--backends", "ort-cpu", "--min-time", "0.01"]
    done = subprocess.run(
        [sys.executable, str(KIT_SCRIPT), "bench", "--rehearse", *bench],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [p.name for p in out.iterdir()] == ["bench.tar.gz"]  # one file, however many the step wrote
    assert not (kit_dir / "staged").exists()  # packed and cleared: the next call starts empty

    kept = kit.collect(out, "rehearsal", tmp_path / "reference")
    names = sorted(p.relative_to(tmp_path / "reference").as_posix() for p in kept)
    assert "rehearsal/bench.log" in names and any(
        n.startswith("rehearsal/bench/") and n.endswith(".json") for n in names
    ), names
    bench_doc = next(p for p in kept if p.suffix == ".json" and "bench" in p.parent.name)
    assert json.loads(bench_doc.read_text())["experiments"][0]["points"]


def test_collect_refuses_an_archive_that_reaches_out_of_its_folder(tmp_path: Path) -> None:
    files_at = tmp_path / "out"
    files_at.mkdir()
    evil = tmp_path / "evil.json"
    evil.write_text("{}")
    with tarfile.open(files_at / "lab.tar.gz", "w:gz") as tar:
        tar.add(evil, arcname="../../escaped.json")
    with pytest.raises(tarfile.OutsideDestinationError):
        kit.collect(files_at, "h100", tmp_path / "reference")
    assert not list(tmp_path.rglob("escaped.json"))


def test_collect_keeps_result_files_where_the_report_finds_them(tmp_path: Path) -> None:
    files_at = tmp_path / "out"
    (files_at / "lab" / "ffn").mkdir(parents=True)
    (files_at / "lab" / "ffn" / "results.json").write_text('{"schema": "latlab.results/1"}')
    (files_at / "lab" / "report.png").write_bytes(b"\x89PNG")
    (files_at / "verify.log").write_text("CUDAExecutionProvider")
    kept = kit.collect(files_at, "h100", tmp_path / "reference")
    assert sorted(p.relative_to(tmp_path / "reference").as_posix() for p in kept) == [
        "h100/lab/ffn/results.json",
        "h100/verify.log",
    ]
    with pytest.raises(SystemExit, match="nothing to collect"):
        kit.collect(tmp_path / "empty-does-not-exist", "h100", tmp_path / "reference")


def test_the_kit_brings_every_dependency_the_device_lacks() -> None:
    """Each of latlab's runtime dependencies is on the device already, or in the kit's download list (with its
    own dependencies): a package added to pyproject.toml and not to the kit fails on the device, not here."""
    import re
    import tomllib

    declared = tomllib.loads((KIT_SCRIPT.parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in declared}
    brought = set(kit.DEVICE_NEEDS) | kit.DEVICE_HAS | {kit.MINILM_WEIGHTS, "onnxruntime", "onnxruntime-gpu"}
    assert names - brought == set(), names - brought
