"""perf_event_open uprobes through ctypes: the consumer the live tests attach with.

Reference: perf_event_open(2) and the uprobe PMU (kernel/events/core.c perf_uprobe_init):
`type` is read from /sys/bus/event_source/devices/uprobe/type, `config1` is a pointer to the
file's path, `config2` the file offset of the probed instruction, config bit 0 asks for a
return probe, config bits 32..63 a semaphore (ref_ctr) offset. The syscall numbers are the
x86-64 ones: perf_event_open 298; the uprobe syscall and what its answer means are
usdtpatch/kernelfacts.py's.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

from usdtpatch.errors import UnsupportedError
from usdtpatch.kernelfacts import PAGE, kernel_of_errno, uprobe_syscall_errno

SYS_PERF_EVENT_OPEN = 298
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
    """True when the kernel has the uprobe syscall: its answer is one a kernel generation
    that optimizes uprobes gives (a row of kernelfacts.GENERATIONS that optimizes)."""
    return kernel_of_errno(uprobe_syscall_errno())[0] is not None


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


# --- one trace event for every site, sampled per CPU -------------------------------------

PERF_TYPE_TRACEPOINT = 2
PERF_SAMPLE_IP = 1 << 0
PERF_SAMPLE_TID = 1 << 1
PERF_RECORD_LOST = 2
PERF_RECORD_THROTTLE = 5
PERF_RECORD_SAMPLE = 9
RING_PAGES = 512  # data pages of each CPU's ring buffer (a power of two)
CPU_ONLINE_PATH = "/sys/devices/system/cpu/online"
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
GROUP_PREFIX = "usdtpatch_kc"  # + the pid of the kcheck that defined the event


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


def tracefs() -> str:
    for d in TRACEFS:
        if os.path.exists(os.path.join(d, "uprobe_events")):
            return d
    raise UnsupportedError("no tracefs with uprobe_events (mount -t tracefs nodev "
                           "/sys/kernel/tracing)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_events() -> None:
    """Remove the trace events of kcheck runs that are gone (killed before their cleanup)."""
    root = tracefs()
    with open(os.path.join(root, "uprobe_events")) as f:
        groups = {line[2:].split("/", 1)[0] for line in f if line[2:].startswith(GROUP_PREFIX)}
    for g in groups:
        pid = g[len(GROUP_PREFIX):].split("_", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _write_event(root, f"-:{g}/sites")


_SERIAL = itertools.count()


def _write_event(root: str, line: str) -> None:
    fd = os.open(os.path.join(root, "uprobe_events"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


class SiteSampler:
    """Every site of `sites` ((file offset, semaphore offset) of `path`) as one probe of ONE
    trace event (tracefs uprobe_events: `p:usdtpatch_kc<pid>_<n>/sites PATH:OFFSET(REF)`, each
    line adding a probe to the same event), and one sampling perf event per online CPU on it
    for every process (pid -1): each hit a sample (PERF_SAMPLE_IP, PERF_SAMPLE_TID) in that
    CPU's ring buffer. The kernel registers the sites' uprobes when the first CPU event is
    opened and unregisters them all when the last is closed, with ONE wait for the RCU grace
    periods an unregistration needs (a uprobe perf event of its own per site and CPU waits
    once per event, ~0.25 s each here, under a global mutex). `drain()` reads the buffers;
    `hits(pid, address)` counts the samples of process `pid` at a site's run-time address;
    `lost` counts samples the kernel dropped (a full buffer) and `throttled` how often it
    throttled sampling (more than perf_event_max_sample_rate hits a second on a CPU). The
    event count is the number of CPUs. close() detaches every site and removes the event."""

    def __init__(self, path: str, sites: list[tuple[int, int]]) -> None:
        if any(c.isspace() for c in path):
            raise UnsupportedError(f"{path}: a path with white space cannot be named in "
                                   f"uprobe_events")
        self.path = path
        self.errors: dict[int, str] = {}
        self.lost = 0
        self.throttled = 0
        self.fds: list[int] = []
        self._rings: list[mmap.mmap] = []
        self._samples: dict[tuple[int, int], int] = {}  # (pid, ip) -> samples
        self.root = tracefs()
        remove_stale_events()
        self.group = f"{GROUP_PREFIX}{os.getpid()}_{next(_SERIAL)}"  # one per sampler
        self._defined = False
        size = os.stat(path).st_size
        try:
            for i, (offset, ref_ctr) in enumerate(sites):
                if offset >= size:  # refused at registration, which would fail them all
                    self.errors[i] = f"file offset {offset:#x} past the end of the file"
                    continue
                ref = f"(0x{ref_ctr:x})" if ref_ctr else ""
                try:
                    _write_event(self.root, f"p:{self.group}/sites {path}:0x{offset:x}{ref}")
                    self._defined = True
                except OSError as exc:
                    self.errors[i] = exc.strerror or str(exc)
            if not self._defined:
                return
            with open(os.path.join(self.root, "events", self.group, "sites", "id")) as f:
                ident = int(f.read())
            for cpu in online_cpus():
                attr = bytearray(PERF_ATTR_SIZE)
                struct.pack_into("<IIQQQ", attr, 0, PERF_TYPE_TRACEPOINT, PERF_ATTR_SIZE,
                                 ident, 1, PERF_SAMPLE_IP | PERF_SAMPLE_TID)
                buf = (ctypes.c_char * PERF_ATTR_SIZE).from_buffer(attr)
                fd = _libc.syscall(ctypes.c_long(SYS_PERF_EVENT_OPEN), buf, ctypes.c_int(-1),
                                   ctypes.c_int(cpu), ctypes.c_int(-1),
                                   ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
                if fd < 0:  # a site the kernel cannot probe fails the event as a whole
                    err = ctypes.get_errno()
                    raise UnsupportedError(
                        f"{path}: the kernel refused the sites' trace event "
                        f"{self.group}/sites on CPU {cpu}: {os.strerror(err)} (name the "
                        f"probes that matter with --probe)")
                self.fds.append(int(fd))
                self._rings.append(mmap.mmap(fd, (1 + RING_PAGES) * mmap.PAGESIZE,
                                             mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        except BaseException:
            self.close()
            raise

    @property
    def event_count(self) -> int:
        return len(self.fds)

    def drain(self) -> None:
        """Read every record the kernel wrote since the last drain."""
        for ring in self._rings:
            head, tail, data_offset, data_size = struct.unpack_from("<QQQQ", ring, 1024)
            if not data_size:  # kernels before 4.1: the data follow the first page
                data_offset, data_size = PAGE, len(ring) - PAGE
            pos = tail
            while pos + 8 <= head:
                rtype, _misc, size = struct.unpack("<IHH", self._at(ring, pos, 8, data_offset,
                                                                    data_size))
                if size < 8 or pos + size > head:
                    break
                if rtype == PERF_RECORD_SAMPLE and size >= 24:
                    ip, pid = struct.unpack_from("<QI", self._at(ring, pos, 24, data_offset,
                                                                 data_size), 8)
                    key = (pid, ip)
                    self._samples[key] = self._samples.get(key, 0) + 1
                elif rtype == PERF_RECORD_LOST and size >= 24:
                    self.lost += struct.unpack_from("<Q", self._at(ring, pos, 24, data_offset,
                                                                   data_size), 16)[0]
                elif rtype == PERF_RECORD_THROTTLE:
                    self.throttled += 1
                pos += size
            struct.pack_into("<Q", ring, 1032, pos)

    @staticmethod
    def _at(ring: Any, pos: int, size: int, data_offset: int, data_size: int) -> bytes:
        start = pos % data_size
        if start + size <= data_size:
            return bytes(ring[data_offset + start : data_offset + start + size])
        first = data_size - start
        return bytes(ring[data_offset + start : data_offset + data_size]) + \
            bytes(ring[data_offset : data_offset + size - first])

    def pids(self) -> set[int]:
        """The processes that hit a site so far."""
        return {pid for pid, _ip in self._samples}

    def hits(self, pid: int, address: int) -> int:
        """Samples of process `pid` at the site at run-time `address` (the sample's ip is
        the breakpoint's address, or the byte after it)."""
        return self._samples.get((pid, address), 0) + self._samples.get((pid, address + 1), 0)

    def close(self) -> None:
        """Close the CPU events (the last close unregisters every site) and remove the
        trace event."""
        for ring in self._rings:
            ring.close()
        self._rings = []
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        if self._defined:
            with contextlib.suppress(OSError):
                _write_event(self.root, f"-:{self.group}/sites")
            self._defined = False
