"""What the processes of a server share: the log format, and for a multi-front-end server its run folder's layout
and the state kept there in memory-mapped files: the engine's status (is it up, which start of it) and each
deployment's admission count across front ends.

Both are read on every request, so both are plain int64 words in an mmap: a read is a memory load, with no
system call and no message. Only admission's `enter` under a bound takes a lock across processes (an flock on
the file), because two front ends must not both admit the last place."""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from latlab.server.config import MAX_FRONTENDS
from latlab.server.errors import QueueFull

STATUS_FILE = "engine-{}.status"
ADMISSION_FILE = "admission.counts"
METRICS_FOLDER = "metrics"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Every process of a server logs its lines so: the one process, the front ends and the engines."""
CONFIG_ENV = "LATLAB_CONFIG"
"""The config file every process of a server reads (set by serve(), server/processes/wsgi.py)."""
RUN_DIR_ENV = "LATLAB_RUN_DIR"
"""The run folder of a multi-front-end server (server/processes/supervisor.py): set, the worker is a front end."""


def endpoint(run_dir: str | Path, engine: int = 0) -> str:
    """Where engine `engine` listens and the front ends connect: a Unix socket in the server's run folder."""
    return f"ipc://{Path(run_dir) / f'engine-{engine}.sock'}"


def metrics_folder(run_dir: str | Path) -> str:
    """Where every process of the server writes its metrics (prometheus_client's multiprocess files)."""
    return str(Path(run_dir) / METRICS_FOLDER)


def _mapped(path: Path, words: int, create: bool) -> tuple[int, mmap.mmap, np.ndarray]:
    """The file's first `words` int64 words as a shared, writable array (created zeroed with `create`)."""
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    if create:
        os.ftruncate(fd, words * 8)
    memory = mmap.mmap(fd, words * 8)
    return fd, memory, np.frombuffer(memory, dtype=np.int64, count=words)


class EngineStatus:
    """The engine's state as the supervisor and the engine write it and every front end reads it: `pid` (0 while
    no engine runs), `generation` (one more at every engine start: a front end waiting on an answer from an
    engine that died sees it change) and `ready` (the engine has loaded its deployments and listens)."""

    PID, GENERATION, READY = range(3)

    def __init__(self, run_dir: Path, engine: int = 0, create: bool = False) -> None:
        self._fd, self._memory, self._words = _mapped(Path(run_dir) / STATUS_FILE.format(engine), 3, create)

    @property
    def pid(self) -> int:
        return int(self._words[self.PID])

    @property
    def generation(self) -> int:
        return int(self._words[self.GENERATION])

    @property
    def ready(self) -> bool:
        return bool(self._words[self.READY])

    def up(self) -> int | None:
        """The generation of the engine now serving, or None when none is."""
        words = self._words
        return int(words[self.GENERATION]) if words[self.READY] else None

    def starting(self, pid: int) -> None:
        """The supervisor started an engine: a new generation, not ready yet."""
        self._words[self.READY] = 0
        self._words[self.PID] = pid
        self._words[self.GENERATION] += 1

    def set_ready(self, ready: bool) -> None:
        self._words[self.READY] = int(ready)

    def down(self) -> None:
        """The engine is gone (the supervisor saw it exit): front ends refuse at once."""
        self._words[self.READY] = 0
        self._words[self.PID] = 0

    def close(self) -> None:
        del self._words
        self._memory.close()
        os.close(self._fd)


class SharedAdmission:
    """Every deployment's count of admitted infer requests across all front-end processes, bounded as one
    process's Admission is (server/batching/admission.py): a request past the bound gets QueueFull (503 + Retry-After)
    before its body is read, whichever front end it reached.

    The file holds MAX_FRONTENDS rows: [owner pid, count of deployment 0, count of deployment 1, ...]. A front end
    claims a row when it starts (reclaiming any whose owner died: a front end killed with requests in flight
    leaves its counts behind, and its replacement clears them) and is the only writer of its counts. `enter`
    sums the column under an flock, so that two front ends never both take the last place; `leave` lowers the
    process's own count, a single aligned store that readers see whole."""

    def __init__(self, run_dir: Path, deployments: int, create: bool = False) -> None:
        self._width = deployments + 1
        self._fd, self._memory, words = _mapped(Path(run_dir) / ADMISSION_FILE, MAX_FRONTENDS * self._width, create)
        self._table = words.reshape(MAX_FRONTENDS, self._width)
        self._words = memoryview(self._memory).cast("q")
        """The same words as plain ints: a column summed and a count moved without numpy's per-call cost."""
        self._lock = threading.Lock()
        self._row: np.ndarray | None = None
        self._row_start = 0

    def claim(self) -> int:
        """Take a row for this process; returns its index. Raises RuntimeError when all are held by live ones."""
        with self._locked():
            for index, row in enumerate(self._table):
                owner = int(row[0])
                if owner == os.getpid() or owner == 0 or not _alive(owner):
                    row[1:] = 0
                    row[0] = os.getpid()
                    self._row, self._row_start = row, index * self._width
                    return index
        raise RuntimeError(f"all {MAX_FRONTENDS} front-end rows of the admission table are held")

    def front_ends(self) -> int:
        """Front ends serving now: rows claimed by live processes (a front end claims its row before it takes
        requests, after Granian bound the main port)."""
        return sum(1 for owner in self._table[:, 0] if owner and _alive(int(owner)))

    def release(self) -> None:
        """This process stops serving: its row is free again."""
        if self._row is not None:
            with self._locked():
                self._row[:] = 0
            self._row = None

    def for_deployment(
        self, index: int, limit: int | None, on_refused: Callable[[], None] = lambda: None, detail: str = ""
    ) -> "SharedCount":
        return SharedCount(self, index + 1, limit, on_refused, detail)

    def total(self, column: int) -> int:
        return sum(self._words[column :: self._width])

    def _locked(self) -> "_FileLock":
        return _FileLock(self._lock, self._fd)

    def close(self) -> None:
        self.release()
        del self._table, self._row
        self._words.release()
        self._memory.close()
        os.close(self._fd)


class _FileLock:
    """The thread lock, then the file's flock (flock excludes other processes, not other threads of this one)."""

    __slots__ = ("_lock", "_fd")

    def __init__(self, lock: threading.Lock, fd: int) -> None:
        self._lock, self._fd = lock, fd

    def __enter__(self) -> None:
        self._lock.acquire()
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._lock.release()


class SharedCount:
    """One deployment's admission across front ends, with Admission's interface (enter, leave, count, limit)."""

    __slots__ = ("limit", "_shared", "_column", "_on_refused", "_detail")

    def __init__(
        self, shared: SharedAdmission, column: int, limit: int | None, on_refused: Callable[[], None], detail: str
    ) -> None:
        self.limit = limit
        self._shared, self._column = shared, column
        self._on_refused, self._detail = on_refused, detail

    @property
    def count(self) -> int:
        return self._shared.total(self._column)

    def enter(self) -> None:
        shared = self._shared
        words, column = shared._words, self._column
        if self.limit is None:  # counted (a replacement front end clears what a dead one left), never refused
            with shared._lock:
                words[shared._row_start + column] += 1
            return
        with shared._locked():
            if sum(words[column :: shared._width]) < self.limit:
                words[shared._row_start + column] += 1
                return
        self._on_refused()
        raise QueueFull(f"deployment is full ({self.limit} requests admitted across the front ends{self._detail})")

    def leave(self) -> None:
        shared = self._shared
        with shared._lock:
            shared._words[shared._row_start + self._column] -= 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
