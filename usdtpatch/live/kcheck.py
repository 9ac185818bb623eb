"""kcheck: the running kernel, asked. Attach a counting uprobe to every USDT site of a file in
a process (a command started here, or a running pid), let it run, and report per site what
the kernel did: hits, whether the site became the optimized `call` into the process's
[uprobes-trampoline] page, whether its bytes and trampoline are the ones `usdtpatch plan`
predicts for that process's mappings, and whether detaching restored the original bytes.

How (docs/kcheck.md; docs/kernel.md has the kernel facts):
- uprobes: every site a probe of one tracefs trace event (usdtpatch.live.perf.SiteSampler),
  one sampling perf event per CPU on it for every process: a hit is a sample with the pid,
  which tells the target's hits apart; the kernel unregisters all the sites at the last
  close with one RCU wait (per-site, per-thread uprobe events waited once per event). A
  site's semaphore is raised through its reference counter offset.
- threads and forks: ptrace (PTRACE_SEIZE with fork/vfork/clone/exec/exit events). Threads
  need no events of their own. A forked child is not a target: it
  inherits the parent's site bytes (the optimized `call` included) but not its trampoline
  mapping, exactly as under any tracer on Linux 6.18, and registering a probe in the child
  would re-arm its sites with int3 and hide what happens. Its signals are watched instead: a
  child stopped with SIGSEGV has its fault address, rip and the return address at [rsp] read
  (a `call` into a missing trampoline pushes site + 5), then the signal is delivered as it
  would have been. A child that execs a new program becomes a target of its own.
- the sites are read through /proc/PID/mem at the target's exit (the PTRACE_EVENT_EXIT stop of
  its main thread, where its memory is still there) or at the end of --duration for --pid;
  the events are closed right there (unless another target still runs) and the bytes read
  again.

Nothing stays attached: every perf fd is closed in a finally block (the kernel removes the
uprobes when the event's last fd closes; the trace event definition is removed then), a
started command is killed by pid, a --pid process is detached. The uprobe trampoline page
itself stays mapped in the process (the kernel never unmaps it).

Deferred imports: fnmatch (only with --probe patterns), sequences/trampoline.py
(place_trampoline: looked up when a moved trampoline is explained, so that a test can change
the rule).
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import resource
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from usdtpatch.analysis.probes import ProbeSet, no_match, read_probes
from usdtpatch.elf.image import parse_elf
from usdtpatch.errors import InputError, UnsupportedError, UsdtpatchError
from usdtpatch.io import read_elf
from usdtpatch.kernelfacts import (
    CALL_REL32,
    INT3,
    Generation,
    generation_of_errno,
    uprobe_syscall_errno,
)
from usdtpatch.live import ptrace
from usdtpatch.live.perf import SiteSampler, uprobe_pmu_type
from usdtpatch.live.procfs import read_maps
from usdtpatch.sequences.plan import Plan, SitePlan, plan_for
from usdtpatch.sequences.trampoline import TRAMPOLINE_NAME, MapEntry

_OPTIONS = (ptrace.O_TRACEFORK | ptrace.O_TRACEVFORK | ptrace.O_TRACECLONE
            | ptrace.O_TRACEEXEC | ptrace.O_TRACEEXIT)
_STOP_SIGNALS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGTRAP}
# kcheck's plans are asked for their sequences only: check's red-zone verdict (a finding of
# the plan, never a change of its bytes) is not worked out for them
NO_RED_ZONE: Mapping[int, str] = MappingProxyType({})
MAX_OTHER_FAULTS = 20  # per process, faults not at a site that are analysed and listed


def kernel_support() -> Generation:
    """The running kernel's generation (kernelfacts.GENERATIONS, told by the uprobe syscall's
    answer); UnsupportedError (one sentence) unless kcheck can run here. A kernel without the
    uprobe syscall is the generation that optimizes nothing: kcheck runs there too, and plans
    every site on the int3 path."""
    if os.geteuid() != 0:
        raise UnsupportedError("kcheck needs root (perf_event_open uprobes in another "
                               "process, ptrace, /proc/PID/mem)")
    uprobe_pmu_type()  # raises: no uprobe PMU
    gen, why = generation_of_errno(uprobe_syscall_errno())
    if gen is None:
        raise UnsupportedError(f"the kernel ({platform.release()}): {why}: kcheck cannot "
                               f"tell what it does with a uprobe")
    return gen


# ------------------------------------------------------------------------------ results


@dataclass
class SiteResult:
    probe: str
    index: int
    file_offset: int
    address: int | None = None  # run-time address in the process
    original: bytes = b""
    semaphore_offset: int = 0
    attach_error: str = ""  # why perf_event_open refused the site
    hits: int = 0  # hits of this process (its samples)
    attached: bytes | None = None  # the site's bytes while attached (at the end of the run)
    optimized: bool = False  # e8 whose target lies in a [uprobes-trampoline] mapping
    call_target: int | None = None
    planned_protocol: str = ""  # nop5 | int3 (the plan for this process's mappings)
    planned: bytes | None = None  # the bytes the plan predicts after the run's hits
    planned_trampoline: int | None = None
    matches_plan: bool | None = None
    detached: bytes | None = None  # after the events were closed
    restored: bool | None = None


@dataclass(frozen=True)
class Fault:
    pid: int
    tid: int
    signal: int
    address: int  # si_addr
    rip: int
    return_address: int | None  # the 8 bytes at rsp
    site: str | None  # the probe whose site + 5 is the return address
    in_trampoline: bool  # rip inside the parent's [uprobes-trampoline] page


@dataclass
class ProcessResult:
    pid: int
    kind: str  # command | pid | exec | fork
    parent: int | None = None
    threads: int = 1
    sites: list[SiteResult] = field(default_factory=list)
    trampolines: list[int] = field(default_factory=list)
    optimized_at_fork: int | None = None  # fork children: parent's sites optimized then
    other_faults: int = 0  # faults not at a site (the first MAX_OTHER_FAULTS are in faults)
    exit_code: int | None = None
    exit_signal: int | None = None
    inspected: bool = False
    note: str = ""
    samples_lost: int = 0  # samples the kernel dropped (full ring buffer) by the inspection
    throttled: int = 0  # times the kernel throttled the sampling (hits then undercounted)

@dataclass(frozen=True)
class KcheckReport:
    path: str
    command: list[str] | None
    pid: int | None
    kernel: str
    processes: list[ProcessResult]
    faults: list[Fault]
    seconds: float
    interrupted: bool = False
    attach_seconds: float = 0.0  # opening the events (sites x CPUs)
    detach_seconds: float = 0.0  # closing them
    generation: str = ""  # the running kernel's generation (kernelfacts.GENERATIONS), planned

    @property
    def targets(self) -> list[ProcessResult]:
        return [p for p in self.processes if p.kind != "fork"]

    @property
    def site_faults(self) -> list[Fault]:
        return [f for f in self.faults if f.site is not None or f.in_trampoline]

    @property
    def problems(self) -> list[str]:
        """What makes kcheck exit 1: a site the plan says the kernel optimizes that it did not
        (or the other way), bytes unlike the plan's, a detach that left bytes behind, a
        process dying at a site."""
        out = []
        for p in self.targets:
            for s in p.sites:
                if s.matches_plan is False:
                    out.append(f"pid {p.pid} {s.probe}: bytes {_hx(s.attached)} are not the "
                               f"plan's {_hx(s.planned)}")
                if s.restored is False:
                    out.append(f"pid {p.pid} {s.probe}: detach left {_hx(s.detached)}, not "
                               f"{_hx(s.original)}")
        for f in self.site_faults:
            out.append(f"pid {f.pid} died with {signal.Signals(f.signal).name} at "
                       f"{f.rip:#x}" + (f" called from {f.site}" if f.site else ""))
        return out



def _hx(b: bytes | None) -> str:
    return "-" if b is None else b.hex(" ")


# ------------------------------------------------------------------------------ the sites


@dataclass(frozen=True, slots=True)
class SiteSpec:
    probe: str
    index: int
    file_offset: int
    length: int
    semaphore_offset: int
    unprobeable: str  # non-empty: the plan's reason the kernel refuses the site


def load_probes(path: str) -> ProbeSet:
    """The probes of `path`, read once for the run (every plan of it is made from them)."""
    return read_probes(parse_elf(read_elf(path)))


def site_specs(ps: ProbeSet, path: str, probes: Sequence[str] = (),
               gen: Generation | None = None) -> list[SiteSpec]:
    """The instruction the kernel probes for every USDT site of `ps` (the file `path`), where
    the consumers of generation `gen` attach (the plan's choice: `90` + the generation's NOP ->
    the NOP at pc + 1, a guarded nop5 -> the nop5, else the pc; default: the running kernel's
    generation); with `probes`, only the sites whose provider:name matches one of these shell
    patterns."""
    import fnmatch

    if gen is None:
        gen = kernel_support()
    sems = {p.index: (p.semaphore.offset or 0) if p.semaphore is not None else 0
            for p in ps.probes}
    plan = plan_for(ps, path, gen.name, red_zone=NO_RED_ZONE)
    out = []
    for s in plan.sites:
        if s.file_offset is None:
            continue
        if probes and not any(fnmatch.fnmatchcase(s.probe, p) for p in probes):
            continue
        length = len(s.sequences.original) if s.sequences is not None else 1
        why = "" if s.sequences is not None else (
            s.findings[0].message if s.findings else "the kernel cannot probe this site")
        out.append(SiteSpec(probe=s.probe, index=s.index, file_offset=s.file_offset, length=length,
                            semaphore_offset=sems.get(s.index, 0), unprobeable=why))
    if probes and not any(fnmatch.fnmatchcase(s.probe, p) for s in plan.sites for p in probes):
        raise InputError(no_match(path, probes, (s.probe for s in plan.sites)))
    if not out:
        raise InputError(f"{path}: no USDT probe sites to attach to")
    return out


def _runtime(maps: Sequence[MapEntry], real: str, offset: int) -> int | None:
    for m in maps:
        if m.path == real and m.offset <= offset < m.offset + (m.end - m.start):
            return m.start + offset - m.offset
    return None


def _read(pid: int, address: int, size: int) -> bytes | None:
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.pread(fd, size, address)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) == size else None


def process_plan(ps: ProbeSet, path: str, maps: Sequence[MapEntry],
                 gen: Generation) -> Plan | None:
    """`usdtpatch plan --kernel GEN` for this process, from its mappings without the
    trampoline pages (a prediction: where would the kernel put the trampoline, what would it
    write)."""
    free = tuple(m for m in maps if m.path != TRAMPOLINE_NAME)
    try:
        return plan_for(ps, path, gen.name, maps=free, maps_source="the process's maps",
                        red_zone=NO_RED_ZONE)
    except UsdtpatchError:
        return None


# ------------------------------------------------------------------------------ the run


class _Target:
    """A process whose sites kcheck reads (its hits are told apart in the samples)."""

    def __init__(self, result: ProcessResult, specs: list[SiteSpec]) -> None:
        self.result = result
        self.specs = specs
        # the mappings soon after its first hit, before the trampoline page is placed or just
        # after: what the kernel saw when it placed it (a JVM maps more later)
        self.first_maps: list[MapEntry] | None = None


class Kcheck:
    """One run. `run_command(argv)` or `run_pid(pid, duration)`, then `.report`."""

    def __init__(self, path: str, *, settle: float = 2.0, probes: Sequence[str] = (),
                 progress: Callable[[str], None] | None = None,
                 gen: Generation | None = None) -> None:
        self.path = path
        self.real = os.path.realpath(path)
        # the running kernel's generation: where its consumers attach, what it writes
        self.gen = gen if gen is not None else kernel_support()
        self.probeset = load_probes(path)  # one reading: the specs and every process's plan
        self.specs = site_specs(self.probeset, path, probes, self.gen)
        self.settle = settle
        self._explained: dict[tuple[int, int], bool] = {}
        self.progress = progress
        self.processes: dict[int, ProcessResult] = {}
        self.targets: dict[int, _Target] = {}
        self.faults: list[Fault] = []
        self.tids: dict[int, int] = {}  # traced tid -> its process (tgid)
        self.newborn: set[int] = set()  # tids whose first stop is their birth stop
        self.command: list[str] | None = None
        self.pid: int | None = None
        self.t0 = time.monotonic()
        self.interrupted = False
        self._tramps: dict[int, list[int]] = {}  # pid -> trampolines its site calls may reach
        self.sampler: SiteSampler | None = None  # every site's events, opened once
        self._probed = [i for i, s in enumerate(self.specs) if not s.unprobeable]
        self._drained = 0.0
        self.attach_seconds = 0.0  # opening the events
        self.detach_seconds = 0.0  # closing them

    # -- bookkeeping

    def _tgid(self, tid: int) -> int:
        try:
            with open(f"/proc/{tid}/status") as f:
                for line in f:
                    if line.startswith("Tgid:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return self.tids.get(tid, tid)

    def _make_target(self, pid: int, kind: str, parent: int | None) -> _Target:
        res = ProcessResult(pid, kind, parent)
        res.sites = [SiteResult(s.probe, s.index, s.file_offset,
                                semaphore_offset=s.semaphore_offset) for s in self.specs]
        self.processes[pid] = res
        t = _Target(res, self.specs)
        self.targets[pid] = t
        return t

    def _attach_target(self, t: _Target) -> None:
        """Open the sites' events (once for the run: one per site and CPU, for every
        process; SiteSampler) and note why a site has none."""
        if self.sampler is None:
            t0 = time.monotonic()
            self.sampler = SiteSampler(self.real, [(self.specs[i].file_offset,
                                                    self.specs[i].semaphore_offset)
                                                   for i in self._probed])
            self.attach_seconds = time.monotonic() - t0
        for j, err in self.sampler.errors.items():
            t.result.sites[self._probed[j]].attach_error = err
        for i, spec in enumerate(self.specs):
            if spec.unprobeable:
                t.result.sites[i].attach_error = f"not probeable: {spec.unprobeable}"

    # -- inspection

    def _state(self, pid: int) -> tuple[list[MapEntry], list[int]]:
        try:
            maps = list(read_maps(pid))
        except InputError:
            return [], []
        return maps, [m.start for m in maps if m.path == TRAMPOLINE_NAME]

    def _inspect(self, pid: int) -> None:
        """Read the sites while attached, close the events, read them again."""
        t = self.targets.get(pid)
        if t is None or t.result.inspected:
            return
        res = t.result
        res.inspected = True
        maps, tramps = self._state(pid)
        res.trampolines = tramps
        tranges = [(m.start, m.end) for m in maps if m.path == TRAMPOLINE_NAME]
        plan = process_plan(self.probeset, self.path, t.first_maps or maps,
                            self.gen) if maps else None
        planned: dict[int, SitePlan] = {s.index: s for s in plan.sites} if plan else {}
        sampler = self.sampler
        if sampler is not None:
            sampler.drain()
            res.samples_lost, res.throttled = sampler.lost, sampler.throttled
        for spec, site in zip(self.specs, res.sites, strict=True):
            site.address = _runtime(maps, self.real, spec.file_offset)
            if site.address is None:
                continue
            if sampler is not None and not site.attach_error:
                site.hits = sampler.hits(pid, site.address)
            site.attached = _read(pid, site.address, spec.length)
            site.call_target = self._call_target(site.address, site.attached)
            if site.call_target is not None:
                site.optimized = any(a <= site.call_target < b for a, b in tranges)
            ps = planned.get(spec.index)
            seqs = ps.sequences if ps is not None else None
            if seqs is not None:
                site.original = seqs.original
                site.planned_protocol = seqs.protocol
                site.planned_trampoline = seqs.trampoline
                if site.attach_error:
                    site.planned = None
                elif seqs.protocol == self.gen.name and seqs.optimized is not None \
                        and site.hits:
                    site.planned = seqs.optimized
                else:
                    site.planned = seqs.attach.end  # int3 at byte 0
                if site.planned is not None and site.attached is not None:
                    site.matches_plan = site.attached == site.planned
                    if not site.matches_plan and site.planned == seqs.optimized and \
                            seqs.trampoline is not None and site.call_target is not None and \
                            any(site.call_target == a for a, _b in tranges) and \
                            self._placement_explained(t, maps, site.call_target):
                        # the write protocol's bytes, with a call to the start of the
                        # trampoline page the kernel placed, a page the mappings read around
                        # the first hit explain (a runtime that maps and unmaps memory while
                        # it starts, a JVM, changed them in between): said, not a problem; a
                        # page no reading explains stays a problem
                        site.matches_plan = True
                        res.note = res.note or (
                            f"the kernel placed the trampoline at {site.call_target:#x}, the "
                            f"plan at {seqs.trampoline:#x}: the mappings changed around the "
                            f"first hit")
        others = [p for p, o in self.targets.items() if p != pid and not o.result.inspected
                  and p in self.tids]
        if others:  # the events serve them too: this process's detach is not seen
            res.note = res.note or (f"events kept for pid {others[0]}: bytes after detach "
                                    f"not read")
            return
        self._close_events()
        for spec, site in zip(self.specs, res.sites, strict=True):
            if site.address is None or site.attach_error:
                continue
            site.detached = _read(pid, site.address, spec.length)
            if site.original and site.detached is not None:
                site.restored = site.detached in self._restored_bytes(site)
        if self.progress:
            n = sum(1 for s in res.sites if s.optimized)
            self.progress(f"pid {pid}: {n} of {len(res.sites)} site(s) optimized, detached")

    def _restored_bytes(self, site: SiteResult) -> tuple[bytes, ...]:
        """What a site may read after detach: its original bytes, or, where the kernel had
        optimized it, the end of its generation's unoptimize sequence (the nop10 generation
        leaves `e8 rel32` in bytes 5..9, the same NOP's SIB and disp32)."""
        if not site.optimized or site.call_target is None or site.address is None:
            return (site.original,)
        from usdtpatch.sequences.sequences import optimized_sequences

        seqs = optimized_sequences(self.gen, site.address, site.original, site.call_target)
        assert seqs.unoptimize is not None
        return (site.original, seqs.unoptimize.end)

    def _call_target(self, address: int, attached: bytes | None) -> int | None:
        """Where the optimized call of the running generation in `attached` goes (None: the
        bytes are not its optimized form: `e8 rel32`, after its head, ending at the end of
        its NOP)."""
        gen = self.gen
        at = gen.call_offset
        if not gen.optimizes or attached is None or len(attached) < gen.nop_length or \
                attached[:at] != gen.optimized_head or attached[at] != CALL_REL32:
            return None
        return address + gen.nop_length + int.from_bytes(attached[at + 1:at + 5], "little",
                                                         signed=True)

    def _placement_explained(self, t: _Target, maps: Sequence[MapEntry], page: int) -> bool:
        """Whether the kernel's trampoline `page` is where the placement rule puts it for one
        of the target's sites in the mappings read soon after the first hit or now (the
        trampoline pages taken out): with the rule's two-page gap, or one page where a
        mapping made after the placement now follows it."""
        from usdtpatch.sequences.trampoline import place_trampoline

        key = (id(t), page)
        if key in self._explained:
            return self._explained[key]
        ok = False
        for m in ([t.first_maps] if t.first_maps else []) + [list(maps)]:
            free = tuple(e for e in m if e.path != TRAMPOLINE_NAME)
            addrs = {a for a in (s.address for s in t.result.sites) if a is not None}
            if any(place_trampoline(free, a, gap_pages=g).address == page
                   for a in addrs for g in (2, 1)):
                ok = True
                break
        self._explained[key] = ok
        return ok

    def _optimized_now(self, pid: int) -> int:
        t = self.targets.get(pid)
        if t is None:
            return 0
        maps, _ = self._state(pid)
        tr = [(m.start, m.end) for m in maps if m.path == TRAMPOLINE_NAME]
        n = 0
        for spec in self.specs:
            a = _runtime(maps, self.real, spec.file_offset)
            b = _read(pid, a, 5) if a is not None else None
            if a is not None and b is not None and b[0] == CALL_REL32:
                dest = a + 5 + int.from_bytes(b[1:5], "little", signed=True)
                n += any(x <= dest < y for x, y in tr)
        return n

    def _fault(self, tid: int, info: ptrace.SigInfo) -> None:
        pid = self.tids.get(tid, tid)
        res = self.processes.get(pid)
        if res is not None and res.other_faults >= MAX_OTHER_FAULTS:
            res.other_faults += 1  # a runtime that faults on purpose (a JVM): count the rest
            return
        try:
            regs = ptrace.registers(tid)
        except OSError:
            return
        raw = _read(tid, regs["rsp"], 8)
        ret = int.from_bytes(raw, "little") if raw is not None else None
        # a fork child has its parent's layout: its sites are where the parent's are
        maps, _ = self._state(tid)
        site = None
        for spec in self.specs:
            a = _runtime(maps, self.real, spec.file_offset)
            if a is not None and ret is not None and ret == a + 5:
                site = spec.probe
        in_tramp = any(a <= regs["rip"] < a + 4096 for a in self._tramps.get(pid, []))
        if site is None and not in_tramp and res is not None:
            res.other_faults += 1
        self.faults.append(Fault(pid=pid, tid=tid, signal=info.signo, address=info.addr,
                                 rip=regs["rip"], return_address=ret, site=site,
                                 in_trampoline=in_tramp))
        if self.progress:
            where = f" called from {site}" if site else ""
            self.progress(f"pid {pid}: {signal.Signals(info.signo).name} at "
                          f"{regs['rip']:#x}{where}")

    # -- the event loop

    def _handle(self, tid: int, status: int) -> None:
        pid = self.tids.get(tid, tid)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            self.tids.pop(tid, None)
            res = self.processes.get(pid)
            if res is not None and tid == pid:
                if os.WIFEXITED(status):
                    res.exit_code = os.WEXITSTATUS(status)
                else:
                    res.exit_signal = os.WTERMSIG(status)
            return
        if not os.WIFSTOPPED(status):
            return
        sig = os.WSTOPSIG(status)
        event = status >> 16
        if event in (ptrace.EVENT_FORK, ptrace.EVENT_VFORK, ptrace.EVENT_CLONE):
            new = ptrace.event_message(tid)
            self.newborn.add(new)
            if event == ptrace.EVENT_CLONE and self._tgid(new) == pid:
                self.tids[new] = pid
                t = self.targets.get(pid)
                if t is not None:
                    t.result.threads += 1
            else:
                self.tids[new] = new
                child = ProcessResult(new, "fork", pid)
                child.optimized_at_fork = self._optimized_now(pid)
                self.processes[new] = child
                if pid in self.targets or pid in self._tramps:
                    self._tramps[new] = self._state(pid)[1] or self._tramps.get(pid, [])
                else:
                    self._tramps[new] = []
            ptrace.cont(tid)
            return
        if event == ptrace.EVENT_EXEC:
            res = self.processes.get(pid)
            if res is not None and res.kind == "fork":
                res.kind = "exec"  # a new program: a target of its own
                t = _Target(res, self.specs)
                res.sites = [SiteResult(s.probe, s.index, s.file_offset,
                                        semaphore_offset=s.semaphore_offset)
                             for s in self.specs]
                self.targets[pid] = t
                self._attach_target(t)
            ptrace.cont(tid)
            return
        if event == ptrace.EVENT_EXIT:
            if tid == pid and pid in self.targets:
                self._inspect(pid)
            ptrace.cont(tid)
            return
        if event == ptrace.EVENT_STOP:
            if tid in self.newborn or sig not in _STOP_SIGNALS:
                self.newborn.discard(tid)
                ptrace.cont(tid)
            else:
                ptrace.listen(tid)  # a group-stop: stay stopped until SIGCONT
            return
        # a signal-delivery-stop: look, then deliver the signal as it would have been
        if sig in _FAULTS:
            info = ptrace.siginfo(tid)
            if info is not None and info.signo == sig:
                self._fault(tid, info)
        ptrace.cont(tid, sig)

    def _reap(self, handle: Callable[[int, int], None]) -> bool:
        """Give every pending wait status of the traced tids to `handle(tid, status)`; a tid
        that is no longer a child of ours is forgotten. True when there was a status."""
        any_ = False
        for tid in list(self.tids):
            try:
                got, status = os.waitpid(tid, ptrace.WALL | os.WNOHANG)
            except ChildProcessError:
                self.tids.pop(tid, None)
                continue
            if got == 0:
                continue
            any_ = True
            handle(got, status)
        return any_

    def _handle_live(self, tid: int, status: int) -> None:
        """`_handle`, for a task that may have died since it stopped."""
        try:
            self._handle(tid, status)
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                raise

    def _poll(self) -> bool:
        """Handle every pending stop of the traced tids; True when something happened."""
        return self._reap(self._handle_live)

    def _detach_stopped(self, tid: int, status: int) -> None:
        """Detach a task stopped by `ptrace.interrupt` (a signal it stopped for is delivered
        on the way out) and forget it."""
        if os.WIFSTOPPED(status):
            sig = os.WSTOPSIG(status)
            event = status >> 16
            pending = sig if event == 0 and sig != signal.SIGTRAP else 0
            with contextlib.suppress(OSError):
                ptrace.detach(tid, pending)
        self.tids.pop(tid, None)

    def _drain(self, handle: Callable[[int, int], None], seconds: float = 5.0) -> None:
        """`_reap` with `handle` until no tid is traced, for at most `seconds`."""
        deadline = time.monotonic() + seconds
        while self.tids and time.monotonic() < deadline:
            if not self._reap(handle):
                time.sleep(0.005)

    def _loop(self, until: Callable[[], bool]) -> None:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            while self.tids and not until():
                if not self._poll():
                    signal.sigtimedwait({signal.SIGCHLD}, 0.02)
                now = time.monotonic()
                if self.sampler is not None and now - self._drained > 0.02:
                    self.sampler.drain()  # before the ring buffers fill
                    self._drained = now
                    self._first_hits()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _first_hits(self) -> None:
        """Note the mappings of each target that hit a site for the first time."""
        assert self.sampler is not None
        waiting = [t for t in self.targets.values()
                   if t.first_maps is None and not t.result.inspected]
        if not waiting:
            return
        hit = self.sampler.pids()
        for t in waiting:
            if t.result.pid in hit:
                t.first_maps = self._state(t.result.pid)[0] or None

    def _close_events(self) -> None:
        if self.sampler is not None:
            t0 = time.monotonic()
            self.sampler.close()
            self.sampler = None
            self.detach_seconds = time.monotonic() - t0
            if self.progress:
                self.progress(f"events closed in {self.detach_seconds:.2f} s")

    def _release(self, kill: bool) -> None:
        """Close every event; kill (command) or detach (pid) every traced task."""
        self._close_events()
        for tid in list(self.tids):
            with contextlib.suppress(OSError):
                if kill:
                    os.kill(tid, signal.SIGKILL)
                else:
                    ptrace.interrupt(tid)
        self._drain(self._handle_live if kill else self._detach_stopped)

    def run_command(self, argv: list[str], stdout: int | None = None) -> KcheckReport:
        """Start `argv`, held before exec until it is traced, and follow it to its end
        (`stdout`: a descriptor to give it as its standard output)."""
        self.command = list(argv)
        _raise_nofile()
        gate_r, gate_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: wait for the tracer, then become the command
            try:
                os.close(gate_w)
                os.read(gate_r, 1)
                os.close(gate_r)
                if stdout is not None:
                    os.dup2(stdout, 1)
                os.execvp(argv[0], argv)
            except BaseException:
                pass
            os._exit(127)
        os.close(gate_r)
        self.tids[pid] = pid
        main = self._make_target(pid, "command", None)
        self._tramps[pid] = []
        done = False
        try:
            try:
                ptrace.seize(pid, _OPTIONS | ptrace.O_EXITKILL)
            finally:
                os.write(gate_w, b"g")
                os.close(gate_w)
            # the first stop of interest is the exec of the command: attach there
            exec_seen = False
            deadline = time.monotonic() + 10

            def execed() -> bool:
                return exec_seen or time.monotonic() > deadline
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            try:
                while not exec_seen and self.tids and time.monotonic() < deadline:
                    try:
                        got, status = os.waitpid(pid, ptrace.WALL | os.WNOHANG)
                    except ChildProcessError:
                        break
                    if got == 0:
                        signal.sigtimedwait({signal.SIGCHLD}, 0.02)
                        continue
                    if os.WIFSTOPPED(status) and status >> 16 == ptrace.EVENT_EXEC:
                        exec_seen = True
                        self._attach_target(main)
                        ptrace.cont(pid)
                    elif os.WIFSTOPPED(status):
                        sig = os.WSTOPSIG(status)
                        ptrace.cont(pid, 0 if status >> 16 else sig)
                    else:
                        self._handle(pid, status)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            if not exec_seen:
                code = main.result.exit_code
                raise InputError(f"cannot run {argv[0]!r}" + (
                    " (not found or not executable)" if code == 127 else ""))
            self._loop(lambda: main.result.exit_code is not None
                       or main.result.exit_signal is not None)
            # the command is gone; its remaining descendants get `settle` seconds, then are
            # left to run, detached
            end = time.monotonic() + self.settle
            self._loop(lambda: time.monotonic() > end)
            done = True
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        finally:
            self._release(kill=not done)
            if not done and main.result.exit_code is None:
                main.result.note = "stopped by kcheck"
        return self._report()

    def run_pid(self, pid: int, duration: float) -> KcheckReport:
        """Trace the running process `pid` for `duration` seconds."""
        self.pid = pid
        _raise_nofile()
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except OSError as exc:
            raise InputError(f"pid {pid}: no such process") from exc
        if self._tgid(pid) != pid:
            raise InputError(f"pid {pid} is a thread, not a process: give its process id "
                             f"{self._tgid(pid)}")
        maps, tr = self._state(pid)
        if not any(m.path == self.real for m in maps):
            raise InputError(f"{self.path}: not mapped in pid {pid}")
        self._tramps = {pid: tr}
        main = self._make_target(pid, "pid", None)
        try:
            for tid in tids:
                try:
                    ptrace.seize(tid, _OPTIONS)
                except OSError as exc:
                    if exc.errno == 3:
                        continue
                    raise UnsupportedError(f"pid {pid}: cannot trace thread {tid}: "
                                           f"{exc.strerror} (is a debugger attached?)") from exc
                self.tids[tid] = pid
            self._attach_target(main)
            main.result.threads = len(self.tids)
            end = time.monotonic() + duration
            self._loop(lambda: time.monotonic() > end or pid not in self.tids)
            if pid in self.tids:
                self._inspect(pid)
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        finally:
            self._release(kill=False)
        return self._report()

    def _report(self) -> KcheckReport:
        return KcheckReport(path=self.path, command=self.command, pid=self.pid,
                            kernel=platform.release(), generation=self.gen.name,
                            processes=sorted(self.processes.values(), key=lambda p: p.pid),
                            faults=self.faults, seconds=time.monotonic() - self.t0,
                            interrupted=self.interrupted, attach_seconds=self.attach_seconds,
                            detach_seconds=self.detach_seconds)


def _raise_nofile() -> None:
    """One perf fd and ring buffer per CPU, and the traced command's: lift the soft fd limit
    to the hard one (kept from the per-thread design; harmless)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


__all__ = [
    "INT3",
    "Fault",
    "Kcheck",
    "KcheckReport",
    "ProcessResult",
    "SiteResult",
    "kernel_support",
    "load_probes",
    "site_specs",
]
