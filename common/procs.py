"""Child processes the lab starts: free ports, readiness waits, and stopping every one of them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import requests


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:port (so we may bind it)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start(args: list[str], log_path: Path | None = None, env: dict | None = None) -> subprocess.Popen:
    """Start a child in its own process group, so stopping it also stops its workers."""
    out = open(log_path, "wb") if log_path else None
    try:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    finally:
        if out:
            out.close()  # the child holds its own descriptor


def stop(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's group, then SIGKILL what is left after the grace period."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 120.0, log_path: Path | None = None) -> None:
    """Poll a readiness URL until 200; fail early, with the log's tail, if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path and log_path.exists() else ""
            raise RuntimeError(f"server exited with status {process.returncode} before it was ready:\n{tail}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread runs so that it unwinds as Ctrl-C does (every `finally` stops its
    children); `latlab` exits 143 on it."""


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated instead of ending the process at once (Python's default,
    which leaves the children of a lab sent `kill` running). Only the main thread can take signals: elsewhere
    (a test's thread) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
