"""Trim a CUDA library's fat binaries to the GPU architectures a machine has, so that it carries in fewer calls.

A CUDA shared library holds its kernels in the ELF section `.nv_fatbin`: a row of fat binaries, each a header
(magic 0xBA55ED50, header size, payload size) followed by entries, one machine-code ELF (or PTX text) per GPU
architecture. ONNX Runtime's CUDA provider ships machine code for several architectures and no PTX (docs/gpu.md
lists them and their sizes); the payloads are compressed by nvcc already, so no general compressor shrinks them,
while the runtime loads only the entry whose architecture matches the GPU. `trim` zeroes the payloads of the
other architectures in place: every header, offset and size stays as it was (the file keeps its length and
layout), the kept entries are byte-identical, and the zeroed runs compress to nothing. The result runs only on
the architectures kept.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
SECTION = b".nv_fatbin"
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
_ENTRY_HEAD = struct.Struct("<HHIQ")  # kind (1 PTX, 2 ELF), version, entry header size, payload size
_ARCH_OFFSET = 28  # u32 sm number (90 = sm_90) inside an entry's header
KINDS = {1: "ptx", 2: "elf"}


@dataclass(frozen=True)
class Entry:
    kind: str
    arch: int
    payload_start: int
    """Offset of the payload in the whole file."""
    payload_size: int


def section(data: bytes | bytearray, name: bytes = SECTION) -> tuple[int, int]:
    """(file offset, size) of an ELF64 little-endian section, read from the section headers."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    header = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, align, entsize

    def read(index: int) -> tuple:
        return header.unpack_from(data, shoff + index * shentsize)

    names_offset = read(shstrndx)[4]
    for index in range(shnum):
        fields = read(index)
        start = names_offset + fields[0]
        if bytes(data[start : data.index(b"\0", start)]) == name:
            return fields[4], fields[5]
    raise ValueError(f"no {name.decode()} section: not a CUDA library")


def entries(data: bytes | bytearray) -> list[Entry]:
    """Every entry of every fat binary in the file's .nv_fatbin section."""
    start, size = section(data)
    found, pos, end = [], start, start + size
    while pos + _FATBIN_HEADER.size <= end:
        magic, _, header_size, body_size = _FATBIN_HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:  # fat binaries are 8-byte aligned, with padding between them
            pos += 8
            continue
        entry, body_end = pos + header_size, pos + header_size + body_size
        if body_end > end:
            raise ValueError(f"a fat binary at {pos:#x} runs past its section")
        while entry < body_end:
            kind, _, entry_header, payload = _ENTRY_HEAD.unpack_from(data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + _ARCH_OFFSET)
            if entry_header < _ARCH_OFFSET + 4 or entry + entry_header + payload > body_end:
                raise ValueError(f"a fat binary entry at {entry:#x} does not fit its fat binary")
            found.append(Entry(KINDS.get(kind, str(kind)), arch, entry + entry_header, payload))
            entry += entry_header + payload
        pos = start + -(-(body_end - start) // 8) * 8  # the next fat binary starts 8-byte aligned
    return found


def trim(data: bytearray, keep: set[int]) -> dict[str, int]:
    """Zero, in place, the payload of every machine-code entry for an architecture not in `keep` (PTX, which
    the driver can compile for any GPU, is kept). Refuses a library with no code for a kept architecture:
    it would load and then fail at the first kernel. Returns bytes kept and zeroed."""
    found = entries(data)
    if not any(e.arch in keep for e in found):
        have = sorted({e.arch for e in found})
        raise ValueError(f"no kernels for sm_{'/'.join(map(str, sorted(keep)))} here; it has sm_{have}")
    kept = zeroed = 0
    for e in found:
        if e.kind == "elf" and e.arch not in keep:
            data[e.payload_start : e.payload_start + e.payload_size] = bytes(e.payload_size)
            zeroed += e.payload_size
        else:
            kept += e.payload_size
    return {"kept_bytes": kept, "zeroed_bytes": zeroed}


def by_arch(data: bytes | bytearray) -> dict[str, int]:
    """Payload bytes per kind and architecture, e.g. {"elf sm_90": 76902400}."""
    sizes: dict[str, int] = {}
    for e in entries(data):
        key = f"{e.kind} sm_{e.arch}"
        sizes[key] = sizes.get(key, 0) + e.payload_size
    return sizes
