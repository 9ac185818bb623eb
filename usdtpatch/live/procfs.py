"""The real kernel's view of a process: /proc/PID/maps, /proc/PID/mem, vm.mmap_min_addr.

Reference: proc(5). /proc/PID/mem reads need ptrace access (root here); the uprobe trampoline
page itself cannot be read this way (EIO, see docs/kernel.md, "The trampoline").
"""

from __future__ import annotations

import os

from usdtpatch.errors import InputError
from usdtpatch.io import read_input
from usdtpatch.sequences.trampoline import MapEntry, parse_maps


def read_maps(pid: int) -> tuple[MapEntry, ...]:
    """The mappings of a live process."""
    path = f"/proc/{pid}/maps"
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError as exc:
        raise InputError(f"pid {pid}: no such process") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_maps(text, path)


def read_maps_file(path: str) -> tuple[MapEntry, ...]:
    """A saved /proc/PID/maps snapshot."""
    return parse_maps(read_input(path).decode("utf-8", "replace"), path)


def read_mem(pid: int, address: int, size: int) -> bytes:
    """`size` bytes of the process's memory at `address`."""
    path = f"/proc/{pid}/mem"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from exc
    try:
        data = os.pread(fd, size, address)
    except OSError as exc:
        raise InputError(f"{path}: cannot read {size} bytes at {address:#x}: "
                         f"{exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) != size:
        raise InputError(f"{path}: short read at {address:#x}: {len(data)} of {size} bytes")
    return data


def mmap_min_addr() -> int:
    """vm.mmap_min_addr (the lowest address a mapping may take), 4096 when unreadable."""
    try:
        with open("/proc/sys/vm/mmap_min_addr") as f:
            return max(4096, int(f.read().strip()))
    except (OSError, ValueError):
        return 4096
