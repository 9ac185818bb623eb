"""fork() in the emulator: a child of a process whose sites are optimized, with and without the
fork guard (docs/fork-guard.md).

The model of Linux 6.18 (measured on the real kernel; the tests in tests/test_fork_live*.py
check the same outcomes there):
- the parent: every site the kernel optimizes reads `e8 rel32`, a call into the
  `[uprobes-trampoline]` page the kernel placed nearest to it (usdtpatch.sequences.trampoline);
- fork: the child gets a copy of every mapping of the file, with those bytes, but not the
  trampoline page (VM_DONTCOPY);
- the child's atfork handlers run: when the file carries the guard (sys/sdt.h's table or the
  one `rewrite` adds: usdtpatch.forkguard.coverage), its child handler runs here, the
  committed machine code itself, under unicorn, with its system calls serviced by the model:
  mincore (ENOMEM for an unmapped page), open("/proc/self/mem") (or ENOENT when the model has
  no /proc), pwrite64 on it (a write that ignores page protection, as the kernel's
  FOLL_FORCE access does), mprotect, close; any other system call is a fault;
- a hit in the child: `cc` at byte 0 is the int3 path of a registered uprobe (the probe fires
  for the child, the NOP is emulated, the kernel may optimize the site again); `e8 rel32` into
  a page the child does not have is SIGSEGV at that address (what the real child dies of).

Nothing here runs the input: its code is only emulated.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from usdtpatch import forkguard
from usdtpatch.analysis.check import OPTIMIZABLE, check
from usdtpatch.analysis.probes import read_probes
from usdtpatch.elf.image import PT_LOAD, ElfImage
from usdtpatch.elf.marker import marker_of
from usdtpatch.errors import UsdtpatchError
from usdtpatch.findings import (
    FORK_GUARD_FAILED,
    FORK_GUARDED,
    PROCESS_CAN_FORK,
    Finding,
    Severity,
)
from usdtpatch.forkguard import _code
from usdtpatch.kernelfacts import PAGE
from usdtpatch.sequences.trampoline import (
    default_load_base,
    layout_from_load_base,
    place_trampoline,
)
from usdtpatch.verification.machine import (
    HOOK_INSN,
    HOOK_INTR,
    HOOK_MEM_UNMAPPED,
    INS_SYSCALL,
    PROT_ALL,
    STACK_BASE,
    STACK_SIZE,
    MachineError,
    UcError,
    load_segments,
    new_x86_64,
    reg_id,
)
from usdtpatch.x86.nops import nop5_offset

SYS_OPEN, SYS_CLOSE, SYS_MPROTECT, SYS_PWRITE64, SYS_MINCORE = 2, 3, 10, 18, 27
ENOENT, EBADF, ENOMEM = 2, 9, 12
MEM_FD = 3
RETURN_TO = STACK_BASE  # where the handler returns (never executed)
BUDGET = 200_000


@dataclass(frozen=True, slots=True)
class ChildSite:
    """One optimized site of the parent, as the child sees it."""

    address: int  # in the modelled process (load base applied)
    after_fork: bytes  # the bytes the child inherited
    after_handlers: bytes  # the bytes once the atfork handlers ran
    hit: str  # "int3" (the probe fires, the child goes on) or "SIGSEGV at 0x..."


@dataclass(frozen=True, slots=True)
class ForkModel:
    """The outcome of one modelled fork."""

    load_base: int
    trampoline: int | None  # the parent's trampoline page (None: no reachable page)
    guard: str | None  # how the file's guard registers ("sdt.h" / "rewrite"), None: no guard
    sites: tuple[ChildSite, ...]
    syscalls: tuple[str, ...]  # what the child handler asked the kernel, in order
    fault: str | None  # the handler itself faulted (a bug of the guard)

    @property
    def child_survives(self) -> bool:
        return self.fault is None and all(s.hit == "int3" for s in self.sites)


@dataclass
class _Child:
    uc: Any
    mapped: list[tuple[int, int]]
    proc: bool
    syscalls: list[str] = field(default_factory=list)
    protections: dict[int, int] = field(default_factory=dict)
    fault: str | None = None
    fd_open: bool = False

    def is_mapped(self, addr: int) -> bool:
        return any(lo <= addr < hi for lo, hi in self.mapped)


_reg = reg_id


def _cstring(uc: Any, addr: int, limit: int = 256) -> bytes:
    out = bytearray()
    while len(out) < limit:
        b = bytes(uc.mem_read(addr + len(out), 1))
        if b == b"\0":
            break
        out += b
    return bytes(out)


def _on_syscall(uc: Any, child: _Child) -> None:
    nr = uc.reg_read(_reg("rax"))
    a, b, c, d = (uc.reg_read(_reg(r)) for r in ("rdi", "rsi", "rdx", "r10"))
    ret: int
    if nr == SYS_MINCORE:
        page = a & ~(PAGE - 1)
        if all(child.is_mapped(p) for p in range(page, page + max(b, 1), PAGE)):
            uc.mem_write(c, b"\x01")
            ret = 0
        else:
            ret = -ENOMEM
        child.syscalls.append(f"mincore({page:#x}) = {ret}")
    elif nr == SYS_OPEN:
        path = _cstring(uc, a)
        ok = child.proc and path == b"/proc/self/mem"
        ret = MEM_FD if ok else -ENOENT
        child.fd_open = child.fd_open or ok
        child.syscalls.append(f"open({path.decode('ascii', 'replace')!r}) = {ret}")
    elif nr == SYS_PWRITE64:
        if a == MEM_FD and child.fd_open and child.is_mapped(d) and child.is_mapped(d + c - 1):
            data = bytes(uc.mem_read(b, c))
            uc.mem_write(d, data)  # the kernel's forced write: page protection does not apply
            uc.ctl_remove_cache(d, d + c)
            ret = c
            child.syscalls.append(f"pwrite64({d:#x}, {data.hex()}) = {ret}")
        else:
            ret = -EBADF
            child.syscalls.append(f"pwrite64({d:#x}) = {ret}")
    elif nr == SYS_MPROTECT:
        for p in range(a, a + b, PAGE):
            child.protections[p] = c
        uc.ctl_remove_cache(a, a + b)
        ret = 0
        child.syscalls.append(f"mprotect({a:#x}, {b:#x}, {c}) = 0")
    elif nr == SYS_CLOSE:
        ret = 0 if a == MEM_FD and child.fd_open else -EBADF
        child.syscalls.append(f"close({a}) = {ret}")
    else:
        child.fault = f"unexpected syscall {nr}"
        uc.emu_stop()
        return
    uc.reg_write(_reg("rax"), ret & 0xFFFF_FFFF_FFFF_FFFF)


def _new_child(image: ElfImage, load_base: int, proc: bool) -> _Child:
    uc = new_x86_64()
    mapped: list[tuple[int, int]] = []
    segs = load_segments(image, load_base)
    pages = sorted((s.lo, s.hi) for s in segs)
    merged: list[list[int]] = []
    for lo, hi in pages:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    try:
        for lo, hi in merged:
            uc.mem_map(lo, hi - lo, PROT_ALL)
            mapped.append((lo, hi))
        for s in segs:
            uc.mem_write(s.address, s.data)
        uc.mem_map(STACK_BASE, STACK_SIZE, PROT_ALL)
    except (UcError, OverflowError) as exc:
        raise MachineError(f"cannot map the file for the fork model: {exc}") from exc
    mapped.append((STACK_BASE, STACK_BASE + STACK_SIZE))
    child = _Child(uc, mapped, proc)
    uc.hook_add(HOOK_INSN, lambda u, _d: _on_syscall(u, child), None, 1, 0,
                INS_SYSCALL)
    return child


def _call(child: _Child, function: int, args: tuple[int, ...]) -> None:
    uc = child.uc
    rsp = STACK_BASE + STACK_SIZE // 2
    uc.mem_write(rsp, struct.pack("<Q", RETURN_TO))
    uc.reg_write(_reg("rsp"), rsp)
    for name, value in zip(("rdi", "rsi", "rdx", "rcx"), args, strict=False):
        uc.reg_write(_reg(name), value)
    try:
        uc.emu_start(function, RETURN_TO, count=BUDGET)
    except UcError as exc:
        child.fault = child.fault or f"{exc} at {uc.reg_read(_reg('rip')):#x}"
    if child.fault is None and uc.reg_read(_reg("rip")) != RETURN_TO:
        child.fault = f"the handler did not return within {BUDGET} instructions"


def _hit(child: _Child, site: int) -> str:
    """One thread of the child reaching `site`: what happens to it."""
    uc = child.uc
    outcome: list[str] = []

    def on_intr(u: Any, intno: int, _d: Any) -> None:
        rip = u.reg_read(_reg("rip"))
        outcome.append("int3" if intno == 3 and rip - 1 == site else f"interrupt {intno}")
        u.emu_stop()

    def on_unmapped(u: Any, _access: int, address: int, _size: int, _v: int, _d: Any) -> bool:
        outcome.append(f"SIGSEGV at {address:#x}")
        return False

    h1 = uc.hook_add(HOOK_INTR, on_intr)
    h2 = uc.hook_add(HOOK_MEM_UNMAPPED, on_unmapped)
    try:
        uc.reg_write(_reg("rsp"), STACK_BASE + STACK_SIZE // 2)
        try:
            uc.emu_start(site, site + 5, count=2)
        except UcError as exc:
            if not outcome:
                outcome.append(f"fault: {exc}")
        if not outcome:
            rip = uc.reg_read(_reg("rip"))
            outcome.append("int3" if rip == site + 5 else f"SIGSEGV at {rip:#x}"
                           if not child.is_mapped(rip) else f"ran on to {rip:#x}")
    finally:
        uc.hook_del(h1)
        uc.hook_del(h2)
    return outcome[0]


def _find_code(image: ElfImage, code: bytes) -> int | None:
    """The link-time address of `code` in an executable segment of `image`."""
    for seg in image.segments:
        if seg.type != PT_LOAD or not seg.flags & 1:
            continue
        blob = image.data[seg.offset: seg.offset + seg.filesz]
        at = blob.find(code)
        if at >= 0:
            return seg.vaddr + at
    return None


def model_fork(image: ElfImage, sites: tuple[int, ...] | None = None, *,
               load_base: int | None = None, guard: bool = True,
               proc: bool = True) -> ForkModel:
    """Fork a process running `image` whose `sites` (link-time addresses; default: every site
    the file's fork guard lists, else every site `check` finds optimizable) are optimized.

    `guard=False` models the same file with its handler not run (as if unregistered);
    `proc=False` a child without /proc (the handler then takes its mprotect path).
    """
    base = default_load_base(image) if load_base is None else load_base
    cov = forkguard.coverage(image)
    if sites is None:
        if cov is not None:
            sites = tuple(sorted(cov.sites))
        else:
            rep = check(read_probes(image))
            sites = tuple(sorted({s.probe.address + nop5_offset(s.probe.site.form)
                                  for s in rep.sites if s.outcome == OPTIMIZABLE}))
    layout = layout_from_load_base(image, base)
    tramp = place_trampoline(layout, base + sites[0]).address if sites else None
    child = _new_child(image, base, proc)
    after_fork: dict[int, bytes] = {}
    for s in sites:
        addr = base + s
        if tramp is None:
            continue
        rel = tramp - (addr + 5)
        code = b"\xe8" + struct.pack("<i", rel)
        child.uc.mem_write(addr, code)  # what the parent's optimization left
        after_fork[addr] = code
    kind: str | None = None
    if guard and cov is not None:
        kind = cov.kind
        rearm = _find_code(image, _code.CODE[_code.REARM:_code.REARM_END])
        table = _table_span(image, cov.kind)
        if rearm is None or table is None:
            child.fault = "the file's fork guard code or table was not found"
        else:
            _call(child, base + rearm, (base + table[0], base + table[1]))
    out = []
    for s in sites:
        addr = base + s
        now = bytes(child.uc.mem_read(addr, 5))
        hit = _hit(child, addr) if child.fault is None else "not reached"
        out.append(ChildSite(addr, after_fork.get(addr, now), now, hit))
    return ForkModel(load_base=base, trampoline=tramp, guard=kind, sites=tuple(out),
                     syscalls=tuple(child.syscalls), fault=child.fault)


def _table_span(image: ElfImage, kind: str) -> tuple[int, int] | None:
    if kind == "sdt.h":
        sec = image.section(forkguard.TABLE_SECTION)
        return None if sec is None else (sec.addr, sec.addr + sec.size)
    marker = marker_of(image)
    fg = marker.get("fork_guard") if marker is not None else None
    span = fg.get("table") if isinstance(fg, dict) else None
    if isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span):
        return span[0], span[1]
    return None


def describe(model: ForkModel) -> str:
    """One line for reports."""
    n = len(model.sites)
    if model.fault is not None:
        return f"fork: the guard's handler faulted in the child: {model.fault}"
    if model.child_survives:
        how = f"the {model.guard} fork guard re-armed" if model.guard else "no site to re-arm:"
        return f"fork: {how} {n} site(s); a child's hits take the int3 path"
    dead = next(s for s in model.sites if s.hit != "int3")
    return (f"fork: a child dies at its first hit of {dead.address:#x} ({dead.hit}): "
            f"{'no fork guard' if model.guard is None else 'the guard missed it'}")


def fork_findings(image: ElfImage, sites: tuple[int, ...], load_base: int | None = None
                  ) -> tuple[Finding, ...]:
    """What `verify` says about fork for a file whose `sites` (link-time addresses) the kernel
    optimizes: nothing when the file neither can fork nor carries a guard; `fork-guarded` when
    the modelled child survives, `fork-guard-failed` when a guarded file's child still dies,
    `process-can-fork` (a warning: the child dies, no guard) otherwise."""
    if not sites:
        return ()
    cov = forkguard.coverage(image)
    exposure = forkguard.fork_exposure(image)
    if cov is None and exposure is None:
        return ()
    try:
        model = model_fork(image, tuple(sorted(set(sites))), load_base=load_base)
    except (UsdtpatchError, UcError, struct.error, ValueError):
        return ()  # a file the model cannot load: the sequences' verdicts say enough
    text = f"in the emulator: {describe(model)}"
    if model.child_survives:
        return (FORK_GUARDED.finding(text),)
    if cov is not None:
        return (FORK_GUARD_FAILED.finding(text),)
    return (PROCESS_CAN_FORK.finding(f"{text} ({exposure})", severity=Severity.WARNING),)
