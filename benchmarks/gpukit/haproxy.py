"""Debian's haproxy carried to the GPU machine, whose image has none and no network to fetch one: `prepare` packs
the .deb files beside the wheels, and the device unpacks them with `dpkg -x` into the kit's folder and puts a
wrapper named `haproxy` first on PATH, where `latlab fleet` finds it (standard library only)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

DEBS = (
    "haproxy",
    "liblua5.3-0",
    "libopentracing-c-wrapper0",
    "libopentracing1",
    "libssl3",
    "libcrypt1",
    "libpcre2-8-0",
    "libsystemd0",
    "libcap2",
    "libgcrypt20",
    "libgpg-error0",
    "liblzma5",
    "libzstd1",
    "liblz4-1",
)
"""haproxy and the package of every library `ldd /usr/sbin/haproxy` names, but glibc's and the C++ runtime's
(the image's torch needs those, so it has them). Lua and opentracing are on no base image; the others most images
have, but carried they cost a few MiB and keep haproxy on the libraries it was built against."""
DEBS_FOLDER = "debs"
"""Where the .deb files sit in the kit's bundle (and so in KIT/bundle/ on the device after `install`)."""
BINARY = Path("usr/sbin/haproxy")
WRAPPER = Path("bin/haproxy")


class NotCarried(Exception):
    """The carried haproxy cannot be unpacked here (no .deb in the kit, or no dpkg)."""


def download(dest: Path) -> dict[str, int]:
    """`apt-get download` every package of DEBS into `dest`, here before a trip (a Debian 12 machine, as the one
    the kit is prepared on); returns each file's bytes."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", *DEBS], cwd=dest, check=True, capture_output=True, timeout=300)
    return {deb.name: deb.stat().st_size for deb in sorted(dest.glob("*.deb"))}


def library_dirs(root: Path) -> list[Path]:
    """The folders of the shared libraries unpacked under `root` (OpenSSL's engines and modules, which haproxy
    loads by path if at all, are not library folders)."""
    return sorted({lib.parent for lib in root.rglob("lib*.so*") if lib.is_file()})


def write_wrapper(root: Path) -> Path:
    """root/bin/haproxy: the unpacked binary with the carried libraries first on LD_LIBRARY_PATH. The variable is
    set for haproxy alone, so the lab's Python keeps the image's libssl and liblzma, which its own modules were
    built against. `exec` keeps the process id, which the fleet signals to drain the proxy."""
    libraries = ":".join(str(d.resolve()) for d in library_dirs(root))
    binary = (root / BINARY).resolve()
    wrapper = root / WRAPPER
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(
        "#!/bin/sh\n"
        f'export LD_LIBRARY_PATH={shlex.quote(libraries)}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
        f'exec {shlex.quote(str(binary))} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def unpack(debs: Path, root: Path) -> Path:
    """`dpkg -x` every .deb in `debs` into `root`, then the wrapper; returns the wrapper."""
    found = sorted(debs.glob("*.deb"))
    if not any(deb.name.startswith("haproxy_") for deb in found):
        raise NotCarried(f"no haproxy .deb in {debs}: the kit was prepared before it carried one; prepare it again")
    dpkg = shutil.which("dpkg")
    if dpkg is None:
        raise NotCarried("no dpkg on this machine to unpack the carried haproxy")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for deb in found:
        subprocess.run([dpkg, "-x", str(deb), str(root)], check=True, capture_output=True, timeout=120)
    if not (root / BINARY).is_file():
        raise NotCarried(f"the haproxy .deb in {debs} holds no {BINARY}")
    return write_wrapper(root)
