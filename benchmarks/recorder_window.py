"""CPU time of one window's summary (Recorder.window_detail) as a step's samples grow, this checkout against another.

    .venv/bin/python benchmarks/recorder_window.py [--samples 5000,20000,50000] [--other /tmp/before/pkg]

A window is summarised on the event loop the open-loop senders of that process wait on, so its CPU is a stretch
in which no request leaves on time. Fills a recorder with requests one every millisecond, then summarises the
last second twenty times, one more request added between each (as windows come during a step), and prints the
median CPU time per summary (time.process_time). With `--other`, the same in a child process importing `latlab`
from that folder (a `git archive` of the code before, laid out as a package: see benchmarks/server_cpu.py)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def median_cpu_ms(samples: int, rounds: int = 20) -> float:
    from latlab.loadtest.recorder import Recorder

    recorder, t0 = Recorder(), time.time()
    for i in range(samples):
        key = recorder.begin(t0 + i * 0.001, t0 + i * 0.001)
        recorder.end(key, t0 + i * 0.001 + 0.002, True, 200)
    end = t0 + samples * 0.001
    spent = []
    for n in range(rounds):
        began = time.process_time()
        recorder.window_detail(end - 1.0, end, end + 1.0)
        spent.append((time.process_time() - began) * 1e3)
        key = recorder.begin(end + n * 0.001, end + n * 0.001)
        recorder.end(key, end + 0.5, True, 200)
    return sorted(spent)[rounds // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="5000,20000,50000")
    parser.add_argument("--other", default="", help="a folder holding another version's `latlab` package")
    parser.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(median_cpu_ms(args.one))
        return
    print("samples  this checkout ms" + ("  other ms  ratio" if args.other else ""))
    for samples in (int(s) for s in args.samples.split(",")):
        mine = median_cpu_ms(samples)
        line = f"{samples:7d}  {mine:16.2f}"
        if args.other:
            env = {**os.environ, "PYTHONPATH": args.other}
            command = [sys.executable, __file__, "--one", str(samples)]
            other = float(subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout)
            line += f"  {other:8.2f}  {mine / other:5.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
