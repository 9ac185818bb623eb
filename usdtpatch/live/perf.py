"""perf_event_open uprobes through ctypes: the consumer the live tests attach with.

Reference: perf_event_open(2) and the uprobe PMU (kernel/events/core.c perf_uprobe_init):
`type` is read from /sys/bus/event_source/devices/uprobe/type, `config1` is a pointer to the
file's path, `config2` the file offset of the probed instruction, config bit 0 asks for a
return probe, config bits 32..63 a semaphore (ref_ctr) offset. The syscall numbers are the
x86-64 ones: perf_event_open 298, the uprobe syscall 336 (which, called from outside a
trampoline, fails with ENXIO on kernels that have it and ENOSYS on the others).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from dataclasses import dataclass
from typing import Any

from usdtpatch.errors import UnsupportedError

SYS_PERF_EVENT_OPEN = 298
SYS_UPROBE = 336
UPROBE_TYPE_PATH = "/sys/bus/event_source/devices/uprobe/type"
PERF_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7
PERF_FLAG_FD_CLOEXEC = 1 << 3

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.ioctl.restype = ctypes.c_int


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


# --- per-CPU sampling uprobes: one event per site and CPU, every hit a sample -------------

PERF_SAMPLE_TID = 1 << 1
PERF_SAMPLE_IDENTIFIER = 1 << 16
PERF_RECORD_LOST = 2
PERF_RECORD_SAMPLE = 9
PERF_EVENT_IOC_SET_OUTPUT = 0x2405  # _IO('$', 5)
PERF_EVENT_IOC_ID = 0x80082407  # _IOR('$', 7, __u64 *)
RING_PAGES = 256  # data pages of each CPU's ring buffer (a power of two)
CPU_ONLINE_PATH = "/sys/devices/system/cpu/online"


def online_cpus() -> list[int]:
    """The online CPUs (e.g. "0-1,4"), or range(os.cpu_count()) where the list is unreadable."""
    try:
        with open(CPU_ONLINE_PATH) as f:
            text = f.read().strip()
        out: list[int] = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
        return out
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


class SiteSampler:
    """Sampling uprobes on `sites` ((file offset, semaphore offset) of `path`), one event per
    site and online CPU for every process (pid -1), each hit a PERF_SAMPLE_TID sample in its
    CPU's ring buffer (the CPU's first event owns the buffer; the others write into it,
    PERF_EVENT_IOC_SET_OUTPUT). `drain()` reads the buffers; `hits(i, pid)` is how many of
    site i's hits came from process `pid` (the sample's pid is the thread group id);
    `total(i)` counts every process's hits (the events' counters: exact even when the
    kernel dropped samples, which `lost` counts). The event count is sites x CPUs, whatever
    the number of threads or processes. close() detaches every site."""

    def __init__(self, path: str, sites: list[tuple[int, int]]) -> None:
        import mmap

        self.path = path
        self.errors: dict[int, str] = {}
        self.fds: list[list[int]] = [[] for _ in sites]  # per site: its CPUs' events
        self.lost = 0
        self._by_id: dict[int, int] = {}  # event id -> site index
        self._counts: dict[tuple[int, int], int] = {}  # (site, pid) -> samples
        self._rings: list[mmap.mmap] = []
        self._owners: list[int] = []
        ptype = uprobe_pmu_type()
        cpath = ctypes.create_string_buffer(os.fsencode(path))
        try:
            for cpu in online_cpus():
                owner = -1
                for i, (offset, ref_ctr) in enumerate(sites):
                    attr = bytearray(PERF_ATTR_SIZE)
                    struct.pack_into("<IIQQQ", attr, 0, ptype, PERF_ATTR_SIZE, ref_ctr << 32,
                                     1, PERF_SAMPLE_IDENTIFIER | PERF_SAMPLE_TID)
                    struct.pack_into("<QQ", attr, 56, ctypes.addressof(cpath), offset)
                    buf = (ctypes.c_char * PERF_ATTR_SIZE).from_buffer(attr)
                    fd = _libc.syscall(ctypes.c_long(SYS_PERF_EVENT_OPEN), buf,
                                       ctypes.c_int(-1), ctypes.c_int(cpu), ctypes.c_int(-1),
                                       ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
                    if fd < 0:
                        err = ctypes.get_errno()
                        self.errors.setdefault(i, os.strerror(err))
                        continue
                    self.fds[i].append(int(fd))
                    ident = ctypes.c_uint64()
                    if _libc.ioctl(ctypes.c_int(fd), ctypes.c_ulong(PERF_EVENT_IOC_ID),
                                   ctypes.byref(ident)) < 0:
                        raise OSError(ctypes.get_errno(), "PERF_EVENT_IOC_ID")
                    self._by_id[ident.value] = i
                    if owner < 0:
                        owner = int(fd)
                        self._rings.append(mmap.mmap(fd, (1 + RING_PAGES) * mmap.PAGESIZE,
                                                     mmap.MAP_SHARED,
                                                     mmap.PROT_READ | mmap.PROT_WRITE))
                        self._owners.append(owner)
                    elif _libc.ioctl(ctypes.c_int(fd), ctypes.c_ulong(PERF_EVENT_IOC_SET_OUTPUT),
                                     ctypes.c_int(owner)) < 0:
                        raise OSError(ctypes.get_errno(), "PERF_EVENT_IOC_SET_OUTPUT")
        except BaseException:
            self.close()
            raise

    @property
    def event_count(self) -> int:
        return sum(len(f) for f in self.fds)

    def drain(self) -> None:
        """Read every record the kernel wrote since the last drain."""
        for ring in self._rings:
            head, tail, data_offset, data_size = struct.unpack_from("<QQQQ", ring, 1024)
            if not data_size:  # kernels before 4.1: the data follow the first page
                data_offset, data_size = 4096, len(ring) - 4096
            pos = tail
            while pos + 8 <= head:
                at = data_offset + pos % data_size
                raw = ring[at : at + 8] if at + 8 <= data_offset + data_size else \
                    self._wrapped(ring, pos, 8, data_offset, data_size)
                rtype, _misc, size = struct.unpack("<IHH", raw)
                if size < 8 or pos + size > head:
                    break
                rec = ring[at : at + size] if at + size <= data_offset + data_size else \
                    self._wrapped(ring, pos, size, data_offset, data_size)
                if rtype == PERF_RECORD_SAMPLE and size >= 24:
                    ident, pid = struct.unpack_from("<QI", rec, 8)
                    site = self._by_id.get(ident)
                    if site is not None:
                        key = (site, pid)
                        self._counts[key] = self._counts.get(key, 0) + 1
                elif rtype == PERF_RECORD_LOST and size >= 24:
                    self.lost += struct.unpack_from("<Q", rec, 16)[0]
                pos += size
            struct.pack_into("<Q", ring, 1032, pos)

    @staticmethod
    def _wrapped(ring: Any, pos: int, size: int, data_offset: int, data_size: int) -> bytes:
        start = pos % data_size
        first = data_size - start
        return bytes(ring[data_offset + start : data_offset + data_size]) + \
            bytes(ring[data_offset : data_offset + size - first])

    def hits(self, site: int, pid: int) -> int:
        return self._counts.get((site, pid), 0)

    def total(self, site: int) -> int:
        """Every process's hits of `site` (the sum of its CPUs' counters)."""
        n = 0
        for fd in self.fds[site]:
            with contextlib.suppress(OSError):
                n += struct.unpack("<Q", os.read(fd, 8))[0]
        return n

    def close(self) -> None:
        """Close every event (in parallel: a uprobe's removal waits for RCU grace periods,
        which overlap across threads)."""
        from concurrent.futures import ThreadPoolExecutor

        for ring in self._rings:
            ring.close()
        self._rings = []
        fds = [fd for f in self.fds for fd in f]
        self.fds = [[] for _ in self.fds]

        def shut(fd: int) -> None:
            with contextlib.suppress(OSError):
                os.close(fd)

        if fds:
            with ThreadPoolExecutor(max_workers=min(32, len(fds))) as pool:
                list(pool.map(shut, fds))
