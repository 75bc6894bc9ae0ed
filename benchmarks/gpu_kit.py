"""Run latlab on a borrowed GPU machine in ranked legs, each inside one 15-minute loan, and keep what it measured.

The GPU machine has Python 3.12, torch with CUDA, onnx and the CUDA 13 / cuDNN 9 libraries but no network, no
onnxruntime-gpu and none of latlab's serving packages; a call carries at most 64 MiB and brings back at most 8
files; a loan is 15 minutes of machine time, its start, transfers and idle waits included. So:

    here:    .venv/bin/python benchmarks/gpu_kit.py prepare     # the kit: what the image lacks, slimmed, in parts
    here:    .venv/bin/python benchmarks/gpu_kit.py plan        # every leg: calls, MiB, estimated device minutes
    device:  python3 benchmarks/gpu_kit.py leg N --call K       # the calls `plan` prints, back to back
    here:    .venv/bin/python benchmarks/gpu_kit.py collect --files-at DIR --name h100 --leg N
    here:    .venv/bin/python benchmarks/gpu_kit.py rehearse --leg N   # a leg's calls end to end on this CPU

`plan` exits non-zero when a leg's estimate leaves less than three minutes of a loan for a retry (1), or when
the kit's latlab was built from older code than the tree's (2: the device installs latlab from the kit). What a
trip carries and why: docs/gpu.md; the legs and their costs: gpukit/legs.py and gpukit/costs.json. The device
side uses the standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from gpukit import carry, device, legs

ROOT = carry.ROOT
KIT_DIR = ROOT / ".whl"
REFERENCE = ROOT / "report" / "reference"
KEPT_SUFFIXES = (".json", ".txt", ".log", ".toml", ".xml")
"""What the reference folder keeps: results, bench, probes, logs and the lab's config (which says the threads)."""


def carry_sizes(kit_dir: Path, costs: dict) -> tuple[list[float], str]:
    """MiB each carry call moves (part + working tree): from the kit prepared here, else from costs.json's
    record of the last prepare."""
    manifest = carry.read_manifest(kit_dir)
    if manifest:
        archive, part, tree = manifest["archive_bytes"] / 2**20, manifest["part_mib"], carry.tree_mib()
        source = f"the kit in {kit_dir.name}/ ({manifest['commit']})"
    else:
        recorded = costs["carry"]
        archive, part, tree = recorded["archive_mib"], recorded["part_mib"], recorded["tree_mib"]
        source = f"costs.json: {recorded['source']}"
    return legs.part_sizes(archive, part, tree), source


def stale_code(manifest: dict | None, root: Path = ROOT) -> list[str]:
    """The latlab sources (Python files outside tests/ and benchmarks/) that differ from those the kit's latlab
    wheel was built from: the device installs latlab from the kit, not from the carried tree, so after a change
    it would run the older code. An unknown or dirty build commit counts as stale ("?")."""
    if not manifest:
        return []
    commit = str(manifest.get("commit", ""))
    if not commit or commit.endswith("-dirty"):
        return ["?"]
    changed = subprocess.run(
        ["git", "-C", str(root), "diff", "--name-only", commit, "--", "*.py", ":!tests/", ":!benchmarks/"],
        capture_output=True,
        text=True,
    )
    if changed.returncode != 0:
        return ["?"]
    return changed.stdout.split()


def plan(kit_dir: Path, reference: Path, costs: dict) -> int:
    stale = stale_code(carry.read_manifest(kit_dir))
    if stale:
        shown = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        print(
            f"the kit's latlab is older than this tree ({shown} changed since its build): the device would run the "
            "older code; run `gpu_kit.py prepare` again first\n"
        )
    sizes, source = carry_sizes(kit_dir, costs)
    upcoming = legs.next_leg(reference)
    print(f"carry per call (part + tree): {', '.join(f'{s:.1f}' for s in sizes)} MiB, from {source}")
    print(
        f"transfer {costs['transfer_mib_per_s']['value']} MiB/s, start {costs['start_s']['value']} s "
        f"({costs['transfer_mib_per_s']['source']})\n"
    )
    over = []
    for leg in legs.legs(len(sizes)):
        est = legs.estimate(leg, costs, sizes)
        done = legs.landed(leg.spec, reference)
        status = f"landed ({', '.join(done)})" if done else ("next" if leg.spec is upcoming else "to do")
        print(
            f"leg {leg.number} {leg.spec.name}: {est.calls} calls, {est.carried_mib:.0f} MiB carried, "
            f"~{est.minutes:.1f} device minutes  [{status}]"
        )
        print(f"  {leg.spec.why}")
        for k, call in enumerate(leg.calls, start=1):
            carry_arg = f'carry=["{call.carry}"], ' if call.carry else ""
            steps = " ".join(s.name for s in call.steps)
            print(
                f"  call {k}: run({carry_arg}timeout_s={call.timeout_s}) "
                f"python3 benchmarks/gpu_kit.py leg {leg.number} --call {k}   # {steps}, ~{est.parts[k - 1]:.0f} s"
            )
        print(
            f"  then give_back, and here: .venv/bin/python benchmarks/gpu_kit.py collect --files-at FILES_AT "
            f"--name MACHINE --leg {leg.number} (once per call that brought files; MACHINE: h100 or h200, as the "
            "reply names it)\n"
        )
        if est.minutes > legs.LEG_LIMIT_MINUTES:
            over.append(f"leg {leg.number} ~{est.minutes:.1f} min")
    if over:
        print(f"over {legs.LEG_LIMIT_MINUTES:g} estimated minutes (no spare for a retry): {', '.join(over)}")
        return 1
    return 2 if stale else 0


def collect(files_at: Path, name: str, leg: int, reference: Path) -> list[Path]:
    """Unpack a device call's archives (and take its loose files) into reference/<name>/leg-<N>/, where `plan`
    sees the leg as landed and `latlab report --with-reference` finds the results, unedited."""
    target = reference / name / f"{legs.LEG_PREFIX}{leg}"
    kept = []
    with tempfile.TemporaryDirectory() as scratch:
        sources = [files_at]
        for archive in sorted(files_at.rglob(f"*{device.ARCHIVE_SUFFIX}")) if files_at.is_dir() else []:
            unpacked = Path(scratch) / archive.name.removesuffix(device.ARCHIVE_SUFFIX)
            with tarfile.open(archive) as tar:
                tar.extractall(unpacked, filter="data")  # refuses absolute paths and links out of the folder
            sources.append(unpacked)
        for root in sources:
            for source in sorted(root.rglob("*")) if root.is_dir() else []:
                if source.is_file() and source.suffix in KEPT_SUFFIXES:
                    dest = target / source.relative_to(root)
                    if source.name == "step.json":
                        dest = target / "steps" / f"{root.name}.json"
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, dest)
                    kept.append(dest)
    if not kept:
        raise SystemExit(f"nothing to collect under {files_at}")
    return kept


def learn_step_times(reference: Path, name: str, leg: int, costs: dict) -> list[str]:
    """The step times a trip's calls measured (their step.json, kept by collect) into costs.json."""
    learned = []
    for path in sorted((reference / name / f"{legs.LEG_PREFIX}{leg}" / "steps").glob("*.json")):
        step = json.loads(path.read_text())
        kind = step["step"].split("-", 1)[1]
        legs.record_step(costs, kind, step["seconds"], step["end"], f"{name}, leg {leg} ({time.strftime('%Y-%m-%d')})")
        learned.append(f"{kind} {step['seconds']:.0f} s ({step['end']})")
    return learned


def rehearse(number: int, kit_dir: Path, keep: Path | None) -> int:
    """A leg's calls end to end on this machine, as the device would run them: a kit prepared for this Python,
    one fresh tree per call holding only the folder it carries, one kit folder for the loan, one $OUT per call
    (checked against the 8-file limit), every call's archives collected as `collect` would."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    manifest = carry.read_manifest(kit_dir)
    if not manifest or manifest.get("python") != python or "debs" not in manifest:  # none, or from before haproxy
        print(f"preparing a kit for this Python ({python}) in {kit_dir} ...", flush=True)
        manifest = carry.prepare(kit_dir, python)
    print(carry.summary(manifest), flush=True)
    leg = legs.leg(number, manifest["parts"])
    work = Path(tempfile.mkdtemp(prefix="latlab-rehearse-"))
    timings, code = [], 0
    for k, call in enumerate(leg.calls, start=1):
        tree, out = work / f"tree-{k}", work / f"out-{k}"
        (tree / ".whl").mkdir(parents=True)
        out.mkdir()
        if call.carry:
            shutil.copytree(kit_dir / Path(call.carry).name, tree / ".whl" / Path(call.carry).name)
        env = {**os.environ, "OUT": str(out), "LATLAB_KIT": str(work / "kit")}
        command = [sys.executable, __file__, "leg", str(number), "--call", str(k), "--rehearse", "--tree", str(tree)]
        started = time.monotonic()
        try:
            done = subprocess.run(command, env=env, timeout=call.timeout_s)
            code = code or done.returncode
        except subprocess.TimeoutExpired:
            code = 124
        seconds = time.monotonic() - started
        files = sorted(p.name for p in out.iterdir())
        timings.append({"call": k, "seconds": round(seconds), "timeout_s": call.timeout_s, "files": files})
        print(f"rehearsal call {k}: {seconds:.0f} s of {call.timeout_s}; {len(files)} files back: {files}", flush=True)
        if len(files) > 8:
            print(f"call {k} would leave files behind: a call brings back at most 8")
            code = code or 2
        shutil.rmtree(tree)
    reference = keep or work / "reference"
    for k in range(1, len(leg.calls) + 1):
        if any((work / f"out-{k}").iterdir()):
            collect(work / f"out-{k}", "rehearsal", number, reference)
    folder = reference / "rehearsal" / f"{legs.LEG_PREFIX}{number}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "calls.json").write_text(json.dumps(timings, indent=1))
    missing = [pattern for pattern in leg.spec.lands if not any(folder.glob(pattern))]
    if missing:  # what a trip would bring back would not count as landed
        print(f"the leg's results lack {', '.join(missing)}")
        code = code or 4
    print(f"rehearsal of leg {number}: exit {code}; collected into {folder}")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="here: the kit's parts into .whl/carry-K/")
    prep.add_argument("--python", default=carry.DEVICE_PYTHON, help="the device's Python (wheels' tags)")
    prep.add_argument("--part-mib", type=float, help="size of one part (default: 64 MiB less the working tree)")
    prep.add_argument("--keep-all-sm", action="store_true", help="do not trim the CUDA kernels to sm_90")
    sub.add_parser("plan", help="here: every leg's calls, carries and estimated device minutes")
    run = sub.add_parser("leg", help="device: one call of a leg")
    run.add_argument("number", type=int)
    run.add_argument("--call", type=int, required=True)
    run.add_argument("--rehearse", action="store_true", help="no CUDA here: skip the CUDA-only parts, say so")
    run.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    col = sub.add_parser("collect", help="here: a call's archives into report/reference/NAME/leg-N/")
    col.add_argument("--files-at", type=Path, required=True)
    col.add_argument("--name", required=True, help="the machine, e.g. h100")
    col.add_argument("--leg", type=int, required=True)
    col.add_argument("--reference", type=Path, default=REFERENCE)
    rec = sub.add_parser("record", help="here: one device call's reply (carried MiB, wall_s, held_s added)")
    rec.add_argument("--carried-mib", type=float, required=True, help="the part and tree the call carried")
    rec.add_argument("--wall-s", type=float, required=True, help="the reply's wall_s")
    rec.add_argument("--held-s", type=float, required=True, help="the reply's lease held_s less the previous one's")
    rec.add_argument("--first", action="store_true", help="the loan's first call (its held time includes the start)")
    rec.add_argument("--where", help="the machine and leg, e.g. 'h100 leg 1 call 2'")
    reh = sub.add_parser("rehearse", help="here: a leg's calls end to end without CUDA")
    reh.add_argument("--leg", type=int, default=1)
    reh.add_argument("--kit-dir", type=Path, default=ROOT / ".whl" / "rehearsal")
    reh.add_argument("--keep", type=Path, help="collect the rehearsal's archives under this reference folder")
    args = parser.parse_args(argv)
    costs = legs.load_costs()
    if args.command == "prepare":
        manifest = carry.prepare(KIT_DIR, args.python, args.part_mib, set() if args.keep_all_sm else carry.HOPPER)
        print(carry.summary(manifest))
        return plan(KIT_DIR, REFERENCE, costs)
    if args.command == "plan":
        return plan(KIT_DIR, REFERENCE, costs)
    if args.command == "leg":
        carried = sorted(args.tree.glob(f".whl/{carry.CARRY_PREFIX}*/{carry.PARTS_FILE}"))
        indexes = [*carried, device.KIT / carry.PARTS_FILE]
        index = next((p for p in indexes if p.is_file()), None)
        if index is None:
            parser.error("no kit here: the leg's first call carries .whl/carry-1 (see `gpu_kit.py plan`)")
        leg = legs.leg(args.number, len(json.loads(index.read_text())["parts"]))
        if not 1 <= args.call <= len(leg.calls):
            parser.error(f"leg {args.number} has calls 1 to {len(leg.calls)}")
        return device.run_call(args.number, leg.calls[args.call - 1].steps, args.rehearse, args.tree)
    if args.command == "collect":
        kept = collect(args.files_at, args.name, args.leg, args.reference)
        print(f"{len(kept)} files into {args.reference / args.name}/{legs.LEG_PREFIX}{args.leg}/")
        learned = learn_step_times(args.reference, args.name, args.leg, costs)
        legs.save_costs(costs)
        print(f"step times into {legs.COSTS_FILE.name}: {', '.join(learned) or 'none'}")
        return 0
    if args.command == "record":
        where = f"{args.where or 'a trip'} ({time.strftime('%Y-%m-%d')})"
        legs.record_call(costs, args.carried_mib, args.wall_s, args.held_s, args.first, where)
        legs.save_costs(costs)
        print(f"transfer {costs['transfer_mib_per_s']}, overhead {costs['call_overhead_s']}, start {costs['start_s']}")
        return 0
    return rehearse(args.leg, args.kit_dir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
