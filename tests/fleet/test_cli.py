"""`latlab fleet` as a user runs it: a "ready" line and Prometheus targets, SIGHUP rolls the replicas, SIGTERM
drains the proxy and stops every replica, leaving no process and no targets behind."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import requests

from latlab.common import procs
from latlab.fleet.run import READY_TIMEOUT_S
from latlab.server.config import save_config
from tests.fleet.conftest import BODY, CLIENT_TIMEOUT_S


class Lines:
    """The command's stdout, line by line, read on a thread so that waiting for a line has a bound."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self._queue.put(line.rstrip("\n"))

    def wait_for(self, text: str) -> str:
        while True:
            line = self._queue.get(timeout=READY_TIMEOUT_S)  # a safety bound: queue.Empty fails the test
            self.seen.append(line)
            if text in line:
                return line


def test_fleet_command_starts_rolls_and_stops_leaving_no_process(tmp_path: Path, tiny_model: Path):
    config = save_config({"deployments": [{"name": "tiny", "model_path": tiny_model}]}, tmp_path / "server.toml")
    port = procs.free_port()
    command = [sys.executable, "-m", "latlab.cli", "fleet", "--config", str(config), "--replicas", "2"]
    command += ["--port", str(port), "--stats-port", str(procs.free_port()), "--dir", str(tmp_path / "fleet")]
    targets = tmp_path / "prometheus" / "targets" / "servers-fleet.json"  # where a Prometheus would watch
    command += ["--targets", str(targets)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: list[psutil.Process] = []
    try:
        lines = Lines(process)
        assert f"http://127.0.0.1:{port}" in lines.wait_for("ready:")
        assert len(json.loads(targets.read_text())) == 3  # two replicas and the proxy
        children = psutil.Process(process.pid).children(recursive=True)
        assert sum("haproxy" in c.name() for c in children) == 1
        assert sum("latlab.server" in " ".join(c.cmdline()) for c in children) >= 2
        url = f"http://127.0.0.1:{port}/v2/models/tiny/infer"
        assert requests.post(url, json=BODY, timeout=CLIENT_TIMEOUT_S).status_code == 200

        process.send_signal(signal.SIGHUP)
        lines.wait_for("rolling r1: back in rotation")
        assert requests.post(url, json=BODY, timeout=CLIENT_TIMEOUT_S).status_code == 200
        children += psutil.Process(process.pid).children(recursive=True)  # the replicas the roll started

        process.send_signal(signal.SIGTERM)
        lines.wait_for("draining the proxy, then stopping the replicas")
        assert process.wait(READY_TIMEOUT_S) == 0
        assert not targets.exists()  # nothing left for Prometheus to scrape
        left = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        assert not left, [c.cmdline() for c in left]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for child in children:  # a failed test leaves nothing behind either
            if child.is_running():
                child.kill()
