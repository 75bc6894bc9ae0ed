"""Native code that ships with latlab as C source, built on first use with the machine's C compiler (`cc`) into
latlab's cache folder, once per source version, and loaded with ctypes: a `pip install` needs no compiler, and
where none is found the caller runs its Python path and says why."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CACHE_ENV = "LATLAB_CACHE"
"""Where built native code is kept (default: $XDG_CACHE_HOME/latlab, else ~/.cache/latlab)."""


def cache_folder() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "latlab"


def build(source_path: Path) -> tuple[ctypes.CDLL | None, str]:
    """The library built from `source_path`, and ""; or None and why it could not be built. Raises OSError when the
    source cannot be read or the cache folder cannot be written."""
    source = source_path.read_bytes()
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    target = cache_folder() / f"{source_path.stem}-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if not target.exists():
        if compiler is None:
            return None, "no C compiler (cc) on this machine"
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            built = Path(work) / target.name
            args = [compiler, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(built), str(source_path)]
            try:
                done = subprocess.run(args, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"{compiler} failed: {exc}"
            if done.returncode != 0:
                return None, f"{compiler} failed: {done.stderr.strip()[-300:]}"
            os.replace(built, target)  # atomic: processes building at once each load a whole file
    try:
        return ctypes.CDLL(str(target)), ""
    except OSError as exc:
        return None, f"cannot load {target}: {exc}"
