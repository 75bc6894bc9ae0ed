"""benchmarks/gpu_kit.py and gpukit/: the carry cut to what a GPU machine lacks, the legs laid out over the calls
of one loan and estimated from recorded costs, and every step's results brought back and collected."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
KIT_SCRIPT = BENCHMARKS / "gpu_kit.py"


def _load(name: str, path: Path, package: bool = False):
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(path.parent)] if package else None
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_load("gpukit", BENCHMARKS / "gpukit" / "__init__.py", package=True)
carry = _load("gpukit.carry", BENCHMARKS / "gpukit" / "carry.py")
fatbin = _load("gpukit.fatbin", BENCHMARKS / "gpukit" / "fatbin.py")
legs = _load("gpukit.legs", BENCHMARKS / "gpukit" / "legs.py")
kit = _load("gpu_kit", KIT_SCRIPT)
haproxy = importlib.import_module("gpukit.haproxy")


# --- a CUDA library in miniature: an ELF64 file with a .nv_fatbin section ----------------------------------


def fat_binary(entries: list[tuple[int, int, bytes]]) -> bytes:
    """One fat binary: header, then per (kind, arch, payload) an entry header of 64 bytes and its payload."""
    body = b""
    for kind, arch, payload in entries:
        head = struct.pack("<HHIQIIHHI", kind, 0x101, 64, len(payload), 0, 0, 0, 0, arch)
        body += head + bytes(64 - len(head)) + payload
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body


def cuda_library(section_body: bytes) -> bytearray:
    """An ELF64 little-endian file with sections: null, .text, .nv_fatbin, .shstrtab."""
    names = b"\0.text\0.nv_fatbin\0.shstrtab\0"
    text = b"\x90" * 40
    text_at = 64
    fat_at = text_at + len(text)
    fat_at += -fat_at % 8
    names_at = fat_at + len(section_body)
    headers_at = names_at + len(names)
    headers_at += -headers_at % 8
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    elf = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, headers_at, 0, 64, 0, 0, 64, 4, 3)
    data = bytearray(elf.ljust(text_at, b"\0"))
    data += text
    data = data.ljust(fat_at, b"\0") + section_body
    data += names
    data = data.ljust(headers_at, b"\0")

    def header(name: int, offset: int, size: int, kind: int = 1) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 1, 0)

    data += bytes(64) + header(1, text_at, len(text)) + header(7, fat_at, len(section_body))
    data += header(18, names_at, len(names), kind=3)
    return bytearray(data)


SM80, SM90, PTX = b"A" * 300, b"B" * 200, b"C" * 50


def library() -> bytearray:
    first = fat_binary([(2, 80, SM80), (2, 90, SM90)])
    second = fat_binary([(2, 80, SM80[:100]), (2, 90, SM90[:120]), (1, 80, PTX)])
    return cuda_library(first + bytes(-len(first) % 8) + second)


def test_trim_zeroes_only_other_architectures_and_keeps_the_layout() -> None:
    data = library()
    original = bytes(data)
    assert fatbin.by_arch(data) == {"elf sm_80": 400, "elf sm_90": 320, "ptx sm_80": 50}

    assert fatbin.trim(data, {90}) == {"kept_bytes": 370, "zeroed_bytes": 400}

    assert len(data) == len(original)
    for e in fatbin.entries(data):
        kept = original[e.payload_start : e.payload_start + e.payload_size]
        now = bytes(data[e.payload_start : e.payload_start + e.payload_size])
        assert now == (bytes(e.payload_size) if (e.kind, e.arch) == ("elf", 80) else kept)
    changed = [i for i, (a, b) in enumerate(zip(original, data)) if a != b]
    payloads = [range(e.payload_start, e.payload_start + e.payload_size) for e in fatbin.entries(data) if e.arch == 80]
    assert all(any(i in p for p in payloads) for i in changed)  # headers, offsets and other bytes untouched


def test_trim_refuses_a_library_without_the_kept_architecture_and_a_file_that_is_no_cuda_library() -> None:
    data = library()
    with pytest.raises(ValueError, match=r"no kernels for sm_120"):
        fatbin.trim(data, {120})
    assert data == library()
    plain = cuda_library(b"")
    plain[plain.index(b".nv_fatbin")] = ord("x")
    with pytest.raises(ValueError, match="no .nv_fatbin section"):
        fatbin.entries(plain)
    with pytest.raises(ValueError, match="not a 64-bit"):
        fatbin.entries(b"MZ" + bytes(100))


def wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        lines = [carry._record_line(n, d) for n, d in files.items()]
        z.writestr("demo-1.0.dist-info/RECORD", "\n".join([*lines, "demo-1.0.dist-info/RECORD,,"]) + "\n")
    return path


def test_a_restored_wheel_installs_with_pip_trimmed_stored_and_without_the_dropped_library(tmp_path: Path) -> None:
    meta = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"
    files = {
        "demo/__init__.py": b"",
        "demo/libcuda_kernels.so": bytes(library()),
        "demo/libunused.so.1.2": b"x" * 1000,
        "demo-1.0.dist-info/METADATA": meta,
        "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = wheel(tmp_path / "demo-1.0-py3-none-any.whl", files)

    changed = carry.restore(path, drop=("demo/libunused.so",), trim={"demo/libcuda_kernels.so": {90}})

    assert changed["dropped"] == ["demo/libunused.so.1.2"]
    assert changed["trimmed"]["demo/libcuda_kernels.so"]["zeroed_bytes"] == 400
    with zipfile.ZipFile(path) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
        record = z.read("demo-1.0.dist-info/RECORD").decode()
        for name in z.namelist():
            if not name.endswith("RECORD"):
                assert carry._record_line(name, z.read(name)) in record
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(site)]
    subprocess.run([*pip, str(path)], check=True)
    installed = bytearray((site / "demo" / "libcuda_kernels.so").read_bytes())
    assert fatbin.by_arch(installed)["elf sm_90"] == 320 and not (site / "demo" / "libunused.so.1.2").exists()
    sm80 = [e for e in fatbin.entries(installed) if e.arch == 80 and e.kind == "elf"]
    assert all(installed[e.payload_start : e.payload_start + e.payload_size] == bytes(e.payload_size) for e in sm80)


def test_restore_refuses_a_library_to_trim_that_the_wheel_lacks(tmp_path: Path) -> None:
    path = wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": b""})
    before = path.read_bytes()
    with pytest.raises(ValueError, match="has no demo/libcuda.so"):
        carry.restore(path, trim={"demo/libcuda.so": {90}})
    assert path.read_bytes() == before


def test_the_kit_brings_every_dependency_the_device_lacks() -> None:
    """Each of latlab's runtime dependencies is on the device's image already, or in the kit's download list
    (with its own dependencies): a package added to pyproject.toml and not to the kit fails here."""
    import tomllib

    declared = tomllib.loads((BENCHMARKS.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in declared}
    brought = set(carry.DEVICE_NEEDS) | carry.image_packages() | carry.NEVER_CARRIED
    assert names - brought - {carry.MINILM_WEIGHTS, "onnxruntime", "onnxruntime-gpu"} == set()
    assert "flask" not in carry.image_packages() and "torch" in carry.image_packages()


# --- parts -------------------------------------------------------------------------------------------------


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "kit.tar.xz"
    path.write_bytes(os.urandom(10_000) + b"end")
    return path


def test_parts_carried_one_call_each_join_into_the_same_archive(tmp_path: Path, archive: Path) -> None:
    store = tmp_path / "store"
    parts = carry.split(archive, tmp_path / "tree" / ".whl", 4096)
    assert [p.parent.name for p in parts] == ["carry-1", "carry-2", "carry-3"]
    assert all(p.stat().st_size <= 4096 for p in parts)
    expected = archive.read_bytes()
    archive.unlink()
    for index, part in enumerate(parts, start=1):  # each call's tree holds only the folder it carried
        call_tree = tmp_path / f"call-{index}"
        (call_tree / ".whl").mkdir(parents=True)
        os.rename(part.parent, call_tree / ".whl" / part.parent.name)
        have, missing = carry.stash(call_tree, store)
        assert len(have) == index and len(missing) == len(parts) - index
    assert carry.join(store).read_bytes() == expected


def test_a_missing_or_damaged_part_is_named_and_nothing_is_joined(tmp_path: Path, archive: Path) -> None:
    parts = carry.split(archive, tmp_path / "tree" / ".whl", 4096)
    for part in parts[1:]:
        part.unlink()
    have, missing = carry.stash(tmp_path / "tree", tmp_path / "store")
    assert have == [parts[0].name] and missing == [parts[1].name, parts[2].name]
    with pytest.raises(SystemExit, match=f"parts missing: {parts[1].name}, {parts[2].name}"):
        carry.join(tmp_path / "store")
    damaged = bytearray(parts[0].read_bytes())
    damaged[100] ^= 0xFF
    parts[0].write_bytes(bytes(damaged))
    with pytest.raises(SystemExit, match="arrived damaged"):
        carry.stash(tmp_path / "tree", tmp_path / "store2")


def test_a_call_carries_a_part_beside_the_working_tree_within_its_limit() -> None:
    tree = carry.tree_mib()
    assert 0 < tree < carry.CALL_LIMIT_MIB / 4
    assert carry.part_mib_for(tree) + tree < carry.CALL_LIMIT_MIB
    assert legs.part_sizes(150.0, 60.0, 2.0) == [62.0, 62.0, 32.0]
    assert legs.part_sizes(30.0, 60.0, 2.0) == [32.0]


# --- legs, their estimate and their bookkeeping -----------------------------------------------------------


COSTS = {
    "start_s": {"value": 100},
    "transfer_mib_per_s": {"value": 5.0},
    "call_overhead_s": {"value": 10},
    "gap_s": {"value": 20},
    "steps": {
        "stash": {"value": 2},
        "install": {"value": 30},
        "verify": {"value": 50},
        "buckets": {"value": 60},
        "lab-cnn": {"value": 200},
        "lab-minilm": {"value": 150},
        "cuda": {"value": 5},
        "search": {"value": 400},
        "frontends": {"value": 300},
        "bench": {"value": 70},
        "lab-small": {"value": 200},
    },
    "calls_observed": [],
}


def test_a_leg_carries_one_part_per_call_and_starts_its_work_in_the_last_parts_call() -> None:
    leg = legs.leg(1, 3)
    assert [c.carry for c in leg.calls] == [".whl/carry-1", ".whl/carry-2", ".whl/carry-3", None]
    assert [[s.name for s in c.steps] for c in leg.calls] == [
        ["stash"],
        ["stash"],
        ["stash", "install", "verify", "lab-cnn"],
        ["lab-minilm"],  # each model's lab in a call of its own: its CUDA sweep runs to the bench's ceiling
    ]
    for spec in legs.SPECS:
        for call in legs.lay_out(spec, 3).calls:
            assert call.timeout_s <= legs.CALL_LIMIT_S
            assert call.timeout_s >= sum(s.cap_s for s in call.steps)


def test_work_that_does_not_fit_the_last_parts_call_gets_calls_of_its_own() -> None:
    spec = legs.LegSpec(9, "long", "", ((legs.Step("lab", 540),), (legs.Step("bench", 100),)), ())
    leg = legs.lay_out(spec, 2)
    assert [[s.name for s in c.steps] for c in leg.calls] == [["stash"], ["stash", "install"], ["lab"], ["bench"]]
    with pytest.raises(ValueError, match="more than one command may run"):
        legs.lay_out(legs.LegSpec(9, "too long", "", ((legs.Step("lab", 700),),), ()), 1)


def test_the_estimate_adds_the_start_the_carries_the_steps_and_the_gaps() -> None:
    leg = legs.leg(1, 3)
    est = legs.estimate(leg, COSTS, [50.0, 50.0, 25.0])
    # call 1: start 100 + 50/5 + overhead 10 + stash 2; call 2: gap 20 + 10 + 10 + 2;
    # call 3: gap 20 + 25/5 + 10 + stash 2 + install 30 + verify 50 + lab-cnn 200; call 4: gap 20 + 10 + lab-minilm 150
    assert est.parts == [122.0, 42.0, 317.0, 180.0]
    assert est.calls == 4 and est.carried_mib == 125.0 and est.seconds == 661.0


def test_plan_shows_every_leg_within_the_limit_from_the_recorded_costs(tmp_path: Path) -> None:
    """As a fresh clone runs it: no kit prepared, so the carry is costs.json's record of the last prepare (on a
    machine holding a kit built from older code, `plan` also says so and exits 2)."""
    done = subprocess.run([sys.executable, str(KIT_SCRIPT), "plan"], capture_output=True, text=True, timeout=60)
    stale = kit.stale_code(carry.read_manifest(kit.KIT_DIR))
    assert done.returncode == (2 if stale else 0), done.stdout + done.stderr
    assert ("the device would run the older code" in done.stdout) == bool(stale)
    found = re.findall(r"^leg (\d) \w+: (\d) calls, (\d+) MiB carried, ~([\d.]+) device minutes", done.stdout, re.M)
    assert [n for n, *_ in found] == ["1", "2", "3", "4", "5", "6"]
    assert all(float(minutes) <= legs.LEG_LIMIT_MINUTES for *_, minutes in found)
    assert done.stdout.count("python3 benchmarks/gpu_kit.py leg 1 --call") == int(found[0][1])
    assert done.stdout.count("python3 benchmarks/gpu_kit.py leg 6 --call") == int(found[5][1])
    assert "leg 6 fleet:" in done.stdout and "# stash install fleet-1 fleet-2 fleet-4, ~" in done.stdout


def test_plan_fails_when_a_leg_leaves_no_time_for_a_retry(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    slow = {**legs.load_costs(), "transfer_mib_per_s": {"value": 0.2, "source": "a slow link"}}
    assert kit.plan(tmp_path / "no-kit", tmp_path / "reference", slow) == 1
    assert "no spare for a retry" in capsys.readouterr().out


def test_a_leg_has_landed_when_its_reference_folder_holds_every_file_it_lands(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    first = legs.SPECS[0]
    assert legs.next_leg(reference) is first
    folder = reference / "h100" / "leg-1"
    for model in ("cnn", "minilm"):
        (folder / f"lab-{model}" / model).mkdir(parents=True)
    (folder / "gpu-tests.json").write_text("{}")
    (folder / "lab-cnn" / "cnn" / "results.json").write_text("{}")
    assert legs.landed(first, reference) == [] and legs.next_leg(reference) is first  # minilm not served yet
    (folder / "lab-minilm" / "minilm" / "results.json").write_text("{}")
    assert legs.landed(first, reference) == ["h100"]
    assert legs.next_leg(reference) is legs.SPECS[1]


def test_a_trips_calls_fit_the_transfer_rate_the_overhead_and_the_start() -> None:
    costs = json.loads(json.dumps(COSTS))
    # 8 MiB/s, 10 s overhead, 20 s gap, 90 s start: held - wall = MiB / 8 + 10 + 20 (the first: + 90, no gap)
    legs.record_call(costs, 64.0, 5.0, 5.0 + 64 / 8 + 10 + 90, first=True, where="h100 call 1")
    legs.record_call(costs, 64.0, 5.0, 5.0 + 64 / 8 + 30, first=False, where="h100 call 2")
    assert costs["transfer_mib_per_s"]["value"] == 5.0  # one size after the first: nothing to fit yet
    legs.record_call(costs, 24.0, 300.0, 300.0 + 24 / 8 + 30, first=False, where="h100 call 3")
    assert costs["transfer_mib_per_s"]["value"] == pytest.approx(8.0)
    assert costs["call_overhead_s"]["value"] == pytest.approx(10.0)
    assert costs["start_s"]["value"] == pytest.approx(90.0)


# --- device calls: each step packed into $OUT as it ends, collected, its time learned ----------------------


def device_call(tmp_path: Path, tree: Path, steps: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "LATLAB_KIT": str(tmp_path / "kit")}
    code = (
        f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); from pathlib import Path;"
        "from gpukit import device, legs;"
        f"sys.exit(device.run_call(9, tuple(legs.Step(n, 120) for n in {steps.split()!r}), True, Path({str(tree)!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return done, out


def test_each_step_of_a_call_comes_back_in_its_own_archive_and_collect_learns_its_time(
    tmp_path: Path, archive: Path
) -> None:
    """A rehearsed call (no CUDA here: the CUDA check fails and the rehearsal goes on, as it says)."""
    tree = tmp_path / "tree"
    carry.split(archive, tree / ".whl", 1 << 20)
    done, out = device_call(tmp_path, tree, "stash cuda")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["leg9-cuda.tar.gz", "leg9-stash.tar.gz"]
    assert not (tmp_path / "kit" / "staged" / "leg9-cuda").exists()

    reference = tmp_path / "reference"
    kept = kit.collect(out, "rehearsal", 9, reference)
    names = sorted(p.relative_to(reference / "rehearsal" / "leg-9").as_posix() for p in kept)
    assert names == ["cuda.log", "stash.txt", "steps/leg9-cuda.json", "steps/leg9-stash.json"]
    costs = json.loads(json.dumps(COSTS))
    learned = kit.learn_step_times(reference, "rehearsal", 9, costs)
    assert [line.split()[0] for line in learned] == ["cuda", "stash"]
    assert costs["steps"]["stash"]["source"].startswith("measured: rehearsal, leg 9")


def test_a_failed_step_still_comes_back_and_stops_its_call(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / ".whl").mkdir(parents=True)  # nothing carried
    done, out = device_call(tmp_path, tree, "stash cuda")
    assert done.returncode == 3
    assert [p.name for p in out.iterdir()] == ["leg9-stash.tar.gz"]  # the CUDA check never ran
    with tarfile.open(out / "leg9-stash.tar.gz") as tar:
        step = json.load(tar.extractfile("step.json"))
    assert step["end"].startswith("failed: no part here")


def test_collect_refuses_an_archive_that_reaches_out_of_its_folder(tmp_path: Path) -> None:
    files_at = tmp_path / "out"
    files_at.mkdir()
    evil = tmp_path / "evil.json"
    evil.write_text("{}")
    with tarfile.open(files_at / "leg1-lab.tar.gz", "w:gz") as tar:
        tar.add(evil, arcname="../../escaped.json")
    with pytest.raises(tarfile.OutsideDestinationError):
        kit.collect(files_at, "h100", 1, tmp_path / "reference")
    assert not list(tmp_path.rglob("escaped.json"))
    with pytest.raises(SystemExit, match="nothing to collect"):
        kit.collect(tmp_path / "empty-does-not-exist", "h100", 1, tmp_path / "reference")


def test_the_gpu_serve_plan_and_its_cpu_half() -> None:
    from latlab.common.user_input import Slos
    from latlab.lab.plan import PLANS

    serve, cpu_half = PLANS["gpu-serve"], PLANS["gpu-serve-cpu"]
    assert [m.name for m in serve.models] == ["cnn", "minilm"] and serve.slos == Slos((0.025, 0.05))
    assert serve.providers == ("cpu", "cuda") and cpu_half.providers == ("cpu",)
    assert replace(cpu_half, providers=serve.providers) == serve


# --- leg 6: CPU fleets behind the haproxy the kit carries -------------------------------------------------


def test_the_fleet_leg_runs_1_2_and_4_replicas_in_the_last_parts_call_inside_the_loan(tmp_path: Path) -> None:
    leg = legs.leg(6, 3)
    assert [c.carry for c in leg.calls] == [".whl/carry-1", ".whl/carry-2", ".whl/carry-3"]
    assert [[s.name for s in c.steps] for c in leg.calls] == [
        ["stash"],
        ["stash"],
        ["stash", "install", "fleet-1", "fleet-2", "fleet-4"],
    ]
    assert all(c.timeout_s <= legs.CALL_LIMIT_S for c in leg.calls)
    assert leg.calls[-1].timeout_s == sum(s.cap_s for s in leg.calls[-1].steps) + legs.PACK_SPARE_S  # not cut
    assert leg.spec.lands == tuple(f"fleet-{n}/minilm/results.json" for n in (1, 2, 4))
    costs = legs.load_costs()
    sizes, _ = kit.carry_sizes(tmp_path / "no-kit", costs)
    assert legs.estimate(legs.leg(6, len(sizes)), costs, sizes).minutes <= legs.LEG_LIMIT_MINUTES
    at_caps = json.loads(json.dumps(costs))
    for step in leg.calls[-1].steps:
        at_caps["steps"][step.name]["value"] = step.cap_s
    assert legs.estimate(legs.leg(6, len(sizes)), at_caps, sizes).minutes <= legs.LOAN_MINUTES


def test_every_step_a_leg_names_is_run_by_the_device_and_estimated_in_costs_json() -> None:
    device = importlib.import_module("gpukit.device")
    named = {s.name for leg in legs.legs(3) for call in leg.calls for s in call.steps}
    assert {"fleet-1", "fleet-2", "fleet-4"} <= named
    assert named <= set(device.STEPS) | {"stash"}
    assert named <= set(legs.load_costs()["steps"])


def fake_haproxy(folder: Path, exit_code: int = 0) -> Path:
    """An unpacked haproxy in miniature: a script that says which it is and what LD_LIBRARY_PATH it got, and a
    library beside it."""
    binary = folder / "usr" / "sbin" / "haproxy"
    binary.parent.mkdir(parents=True)
    binary.write_text(f'#!/bin/sh\necho "carried haproxy $* LD=$LD_LIBRARY_PATH"\nexit {exit_code}\n')
    binary.chmod(0o755)
    library = folder / "usr" / "lib" / "x86_64-linux-gnu" / "liblua5.3.so.0"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    return library.parent


def test_the_carried_haproxy_comes_first_on_the_steps_path_with_its_libraries_for_it_alone(tmp_path: Path) -> None:
    kit_dir = tmp_path / "kit"
    libraries = fake_haproxy(kit_dir / "haproxy")
    haproxy.write_wrapper(kit_dir / "haproxy")
    system = tmp_path / "system-bin"  # a haproxy already on PATH must not win over the carried one
    system.mkdir()
    (system / "haproxy").write_text("#!/bin/sh\necho system haproxy\n")
    (system / "haproxy").chmod(0o755)
    code = (
        f"import shutil, subprocess, sys; sys.path.insert(0, {str(BENCHMARKS)!r}); from gpukit import device;"
        "env = device.device_env(); print(shutil.which('haproxy', path=env['PATH']));"
        "print(env['LD_LIBRARY_PATH']);"
        "print(subprocess.run(['haproxy', '-vv'], env=env, capture_output=True, text=True, check=True).stdout)"
    )
    env = {**os.environ, "LATLAB_KIT": str(kit_dir), "PATH": f"{system}:{os.environ['PATH']}"}
    env["LD_LIBRARY_PATH"] = "/image/lib"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found, step_libraries, said = done.stdout.splitlines()[:3]
    assert found == str(kit_dir / "haproxy" / "bin" / "haproxy")
    assert said == f"carried haproxy -vv LD={libraries.resolve()}:/image/lib"
    assert str(libraries) not in step_libraries  # the lab's Python keeps the image's own libraries


def fake_deb(folder: Path, package: str, exit_code: int = 0) -> Path:
    """A .deb built here, offline, with dpkg-deb: the fake haproxy and its library."""
    root = folder / package
    fake_haproxy(root, exit_code)
    (root / "DEBIAN").mkdir()
    control = f"Package: {package}\nVersion: 1.0\nArchitecture: amd64\nMaintainer: test\nDescription: fake\n"
    (root / "DEBIAN" / "control").write_text(control)
    deb = folder / f"{package}_1.0_amd64.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True, capture_output=True)
    return deb


def test_the_kits_debs_unpack_with_dpkg_into_a_haproxy_that_runs(tmp_path: Path) -> None:
    debs = tmp_path / "bundle" / "debs"
    debs.mkdir(parents=True)
    with pytest.raises(haproxy.NotCarried, match="prepared before it carried one"):
        haproxy.unpack(debs, tmp_path / "haproxy")
    fake_deb(debs, "haproxy")
    wrapper = haproxy.unpack(debs, tmp_path / "haproxy")
    said = subprocess.run([str(wrapper), "-c"], capture_output=True, text=True, check=True, timeout=30).stdout
    assert said.startswith("carried haproxy -c LD=") and "x86_64-linux-gnu" in said


def test_a_carried_haproxy_that_cannot_run_fails_the_fleet_step_in_one_line(tmp_path: Path) -> None:
    debs = tmp_path / "kit" / "bundle" / "debs"
    debs.mkdir(parents=True)
    fake_deb(debs, "haproxy", exit_code=1)
    tree = tmp_path / "tree"
    (tree / ".whl").mkdir(parents=True)
    done, out = device_call(tmp_path, tree, "fleet-4")
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert [p.name for p in out.iterdir()] == ["leg9-fleet-4.tar.gz"]  # the lab never started
    with tarfile.open(out / "leg9-fleet-4.tar.gz") as tar:
        step = json.load(tar.extractfile("step.json"))
        log = tar.extractfile("haproxy.log").read().decode()
    assert step["end"] == (
        "failed: the carried haproxy does not run on this image (see haproxy.log): no fleet to measure"
    )
    assert "carried haproxy -vv" in log


def test_the_kit_carries_every_library_debians_haproxy_links_but_glibc_and_the_cpp_runtime() -> None:
    """Against this machine's Debian haproxy (the one `prepare` downloads): a library it gains fails here."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    linked = re.findall(r"=> (/\S+)", subprocess.run(["ldd", binary], capture_output=True, text=True).stdout)
    # a merged /usr lists a library under /lib or /usr/lib as its package shipped it, not as ldd says: ask both
    both = [path for lib in linked for path in (lib.removeprefix("/usr"), "/usr" + lib.removeprefix("/usr"))]
    owners = subprocess.run(["dpkg", "-S", *both], capture_output=True, text=True).stdout
    packages = {line.split(":")[0] for line in owners.splitlines()}
    assert packages - {"libc6", "libstdc++6", "libgcc-s1"} == set(haproxy.DEBS) - {"haproxy"}


def test_plan_refuses_a_kit_whose_latlab_is_older_than_the_tree(tmp_path: Path) -> None:
    """The device installs latlab from the kit's wheel, not from the carried tree: a kit built before a change to
    latlab's sources would measure the older code, so `plan` says so and exits 2."""
    repo = tmp_path / "repo"
    (repo / "server").mkdir(parents=True)
    (repo / "tests").mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    (repo / "server" / "app.py").write_text("A = 1\n")
    (repo / "tests" / "test_app.py").write_text("B = 1\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "kit"], check=True)
    built = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert kit.stale_code({"commit": built}, repo) == []
    (repo / "tests" / "test_app.py").write_text("B = 2\n")  # tests travel with the tree: not stale
    assert kit.stale_code({"commit": built}, repo) == []
    (repo / "server" / "app.py").write_text("A = 2\n")
    assert kit.stale_code({"commit": built}, repo) == ["server/app.py"]
    assert kit.stale_code({"commit": f"{built}-dirty"}, repo) == ["?"] and kit.stale_code(None, repo) == []
