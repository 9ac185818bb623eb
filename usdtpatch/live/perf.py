"""perf_event_open uprobes through ctypes: the consumer the live tests attach with.

Reference: perf_event_open(2) and the uprobe PMU (kernel/events/core.c perf_uprobe_init):
`type` is read from /sys/bus/event_source/devices/uprobe/type, `config1` is a pointer to the
file's path, `config2` the file offset of the probed instruction, config bit 0 asks for a
return probe, config bits 32..63 a semaphore (ref_ctr) offset. The syscall numbers are the
x86-64 ones: perf_event_open 298, the uprobe syscall 336 (which, called from outside a
trampoline, fails with ENXIO on kernels that have it and ENOSYS on the others).
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass

from usdtpatch.errors import UnsupportedError

SYS_PERF_EVENT_OPEN = 298
SYS_UPROBE = 336
UPROBE_TYPE_PATH = "/sys/bus/event_source/devices/uprobe/type"
PERF_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7
PERF_FLAG_FD_CLOEXEC = 1 << 3

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def uprobe_pmu_type() -> int:
    try:
        with open(UPROBE_TYPE_PATH) as f:
            return int(f.read().strip())
    except (OSError, ValueError) as exc:
        raise UnsupportedError(f"{UPROBE_TYPE_PATH}: no uprobe PMU ({exc})") from exc


def has_uprobe_syscall() -> bool:
    """True when the kernel has the uprobe syscall (336 fails with ENXIO, not ENOSYS)."""
    rc = _libc.syscall(ctypes.c_long(SYS_UPROBE))
    return rc == -1 and ctypes.get_errno() == 6  # ENXIO


@dataclass
class Uprobe:
    """An open perf event counting hits of a uprobe; close() detaches it."""

    fd: int
    path: str
    offset: int

    def count(self) -> int:
        return int(struct.unpack("<Q", os.read(self.fd, 8))[0])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Uprobe:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_uprobe(path: str, offset: int, pid: int = -1, cpu: int = -1,
                ref_ctr_offset: int = 0) -> Uprobe:
    """Attach a counting uprobe at file `offset` of `path` for `pid` (-1: every process;
    then `cpu` must be a CPU number)."""
    ptype = uprobe_pmu_type()
    cpath = ctypes.create_string_buffer(os.fsencode(path))
    attr = bytearray(PERF_ATTR_SIZE)
    struct.pack_into("<IIQ", attr, 0, ptype, PERF_ATTR_SIZE, ref_ctr_offset << 32)
    struct.pack_into("<QQ", attr, 56, ctypes.addressof(cpath), offset)
    buf = (ctypes.c_char * PERF_ATTR_SIZE).from_buffer(attr)
    fd = _libc.syscall(ctypes.c_long(SYS_PERF_EVENT_OPEN), buf, ctypes.c_int(pid),
                       ctypes.c_int(cpu), ctypes.c_int(-1), ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open uprobe {path}:{offset:#x}: {os.strerror(err)}")
    return Uprobe(int(fd), path, offset)
