"""The bundled emulator: a unicorn x86-64 machine holding a binary, a stack and uprobe
trampoline pages, with a model of the kernel. The only module that imports unicorn: the
equivalence check of rewrite (usdtpatch.verification.equivalence) builds its machines with
`new_x86_64`, loads the file with `load_segments` and uses the hook and register constants
exported here.

Loading: every PT_LOAD with a memory size is mapped (page-rounded) and its file bytes written
at its address. A segment whose file size exceeds its memory size is malformed (its bytes
would spill past the memory the segment claims): `load_segments` refuses it with a
MachineError, a one-line refusal of the file, where unicorn used to fail on the write.

The kernel model (docs/plan-verify.md, "The emulator and its kernel model"; Linux 6.18
arch/x86/kernel/uprobes.c):
- `int3` at the probed site while the uprobe exists: a hit is recorded with the registers the
  kernel reports (ip = the site), and the original NOP is emulated (ip += its length).
- `int3` at the site after the uprobe is gone: when the writer has meanwhile removed the int3
  (`late` bytes given to the run), the instruction restarts at the site; when the int3 is
  still there the thread would get SIGTRAP: a fault.
- `syscall` with rax = 336 from inside a trampoline page: the kernel reads {rax, r11, rcx,
  return address} from the stack, reports ip = return address - call length and sp as at the
  site (+32, and + the generation's `rsp_moved` more: 128 on nop10, whose site lowered rsp
  first), and returns to the instruction after the syscall with rcx/r11 clobbered as
  `syscall` does. From anywhere else syscall 336 fails with the modelled generation's errno
  (kernelfacts.GENERATIONS); any other syscall is a fault.
- any other int3, an invalid instruction, an unmapped or protected access: a fault.

One Machine serves every run on one file: registers are restored from a saved context, the
site bytes are rewritten (and unicorn's translation cache for them dropped), and only memory a
run actually wrote is restored.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from typing import Any

import unicorn as _unicorn
from unicorn import (
    UC_ARCH_X86,
    UC_HOOK_INSN,
    UC_HOOK_INTR,
    UC_HOOK_MEM_WRITE,
    UC_MODE_64,
    UC_PROT_ALL,
)
from unicorn import x86_const as X

from usdtpatch.elf.image import PT_LOAD, ElfImage
from usdtpatch.errors import UnsupportedError
from usdtpatch.kernelfacts import DEFAULT, PAGE, UPROBE_SYSCALL, Generation

_UC: Any = _unicorn  # the binding's own annotations are partial: use it untyped, here only
UcError: Any = _UC.UcError
# What the equivalence check's machines use (plain ints: no cost per use).
HOOK_CODE: int = _UC.UC_HOOK_CODE
HOOK_MEM_UNMAPPED: int = _UC.UC_HOOK_MEM_UNMAPPED
HOOK_MEM_WRITE: int = UC_HOOK_MEM_WRITE
HOOK_MEM_READ: int = _UC.UC_HOOK_MEM_READ
PROT_CODE: int = _UC.UC_PROT_READ | _UC.UC_PROT_EXEC  # what code pages are mapped as
MEM_FETCH_UNMAPPED: int = _UC.UC_MEM_FETCH_UNMAPPED
REG_RIP: int = X.UC_X86_REG_RIP
# What the fork model (usdtpatch.verification.fork) uses.
HOOK_INTR: int = UC_HOOK_INTR
HOOK_INSN: int = UC_HOOK_INSN
INS_SYSCALL: int = X.UC_X86_INS_SYSCALL
PROT_ALL: int = UC_PROT_ALL


def reg_id(name: str) -> int:
    """unicorn's id of an x86-64 register by its name ("rax", "r10", "rip")."""
    return int(getattr(X, f"UC_X86_REG_{name.upper()}"))


STACK_BASE = 0x7FFF_F000_0000
STACK_SIZE = 0x10000
ARRIVAL_RSP = STACK_BASE + 0x8000 - 8  # as inside a function body after a call
STACK_WINDOW = 1024  # bytes around rsp restored after a run that wrote to the stack
STACK_FILL = 0x5A

GPR_NAMES = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
_GPR_IDS = [getattr(X, f"UC_X86_REG_{n.upper()}") for n in GPR_NAMES]
REG_NAMES = (*GPR_NAMES, "rflags", "rip", *(f"xmm{i}" for i in range(16)))
_REG_IDS = [*_GPR_IDS, X.UC_X86_REG_RFLAGS, X.UC_X86_REG_RIP,
            *(getattr(X, f"UC_X86_REG_XMM{i}") for i in range(16))]
# What the registers of a thread arriving at a site hold: distinct values, no two alike, so
# that a swapped or clobbered register cannot go unnoticed. Flags: CF PF AF ZF SF OF set.
_ARRIVAL_FLAGS = 0x0002 | 0x0001 | 0x0004 | 0x0010 | 0x0040 | 0x0080 | 0x0800
_ARRIVAL_GPR = {n: 0x1111_0000_0000_0000 + 0x0101_0101_0101 * (i + 1)
                for i, n in enumerate(GPR_NAMES)}


@dataclass(frozen=True, slots=True)
class KernelState:
    """What the kernel model knows during one run.

    `probe` the uprobe exists (int3 at the site emulates the original NOP of `nop_length` and
    records a hit); `late` the site's bytes once the writer has finished (a thread whose int3
    is handled after the uprobe is gone restarts on them); `call_length` how far before the
    return address the trampoline's caller site starts (5 nop5, 10 nop10); `extra_sp` what
    the site subtracted from rsp before its call (0 nop5, 128 nop10).
    """

    probe: bool
    nop_length: int
    late: bytes | None = None
    call_length: int = 5
    extra_sp: int = 0


@dataclass(frozen=True, slots=True)
class Hit:
    via: str  # "int3" or "syscall"
    regs: dict[str, int]


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one thread did: where it stopped, its registers, its hits, its writes, a fault."""

    end_rip: int
    regs: dict[str, int]
    hits: tuple[Hit, ...]
    stack_writes: tuple[int, ...]  # byte offsets relative to the arrival rsp (negative: below)
    other_writes: tuple[int, ...]  # addresses written outside the stack
    fault: str | None
    instructions_left: bool  # False when the instruction budget ran out


@dataclass
class _RunRecord:
    hits: list[Hit] = field(default_factory=list)
    writes: list[tuple[int, int]] = field(default_factory=list)
    fault: str | None = None
    restart: bool = False


class MachineError(UnsupportedError):
    """The machine cannot be built (overlapping trampoline, unmappable or malformed segment);
    the message is one line about the file."""


def new_x86_64() -> Any:
    """A bare unicorn x86-64 machine (no memory, no hooks)."""
    return _UC.Uc(UC_ARCH_X86, UC_MODE_64)


@dataclass(frozen=True, slots=True)
class LoadedSegment:
    """A PT_LOAD as the emulator maps it: pages [lo, hi), `data` written at `address`."""

    address: int
    memsz: int
    data: bytes
    lo: int
    hi: int
    flags: int = 0  # p_flags (PF_X, PF_W, PF_R)


def load_segments(image: ElfImage, load_base: int = 0) -> tuple[LoadedSegment, ...]:
    """The PT_LOAD segments of `image` with a memory size, at `load_base` + p_vaddr.

    Raises MachineError for a segment whose file size exceeds its memory size (also one with
    file bytes and no memory: the file's bytes there would be read but never loaded).
    """
    out = []
    for seg in image.segments:
        if seg.type != PT_LOAD:
            continue
        if seg.filesz > seg.memsz:
            raise MachineError(f"program header {seg.index} (PT_LOAD at {seg.vaddr:#x}) has "
                               f"p_filesz {seg.filesz:#x} > p_memsz {seg.memsz:#x}: a malformed "
                               f"segment the emulator does not load")
        if seg.memsz == 0:
            continue
        addr = load_base + seg.vaddr
        out.append(LoadedSegment(address=addr, memsz=seg.memsz,
                                 data=bytes(image.data[seg.offset: seg.offset + seg.filesz]),
                                 lo=addr & ~(PAGE - 1),
                                 hi=(addr + seg.memsz + PAGE - 1) & ~(PAGE - 1), flags=seg.flags))
    return tuple(out)


class Machine:
    """A unicorn machine with `image` loaded at `load_base` and trampoline pages.

    `trampolines` maps a page address to the code at its start.
    """

    def __init__(self, image: ElfImage, load_base: int, trampolines: dict[int, bytes],
                 gen: Generation = DEFAULT) -> None:
        self.image = image
        self.gen = gen  # the modelled kernel: its errno outside a trampoline
        self.load_base = load_base
        self.uc: Any = new_x86_64()
        self._ranges: list[tuple[int, int]] = []
        self._segments: list[tuple[int, bytes]] = []
        pages: list[tuple[int, int]] = []
        for seg in load_segments(image, load_base):
            pages.append((seg.lo, seg.hi))
            self._segments.append((seg.address, seg.data))
        for lo, hi in _merge(pages):
            self._map(lo, hi - lo)
        self.trampolines = dict(trampolines)
        for addr, code in self.trampolines.items():
            if addr % PAGE:
                raise MachineError(f"trampoline {addr:#x} is not page aligned")
            if any(lo < addr + PAGE and addr < hi for lo, hi in self._ranges):
                raise MachineError(f"trampoline page {addr:#x} overlaps a mapping of the file "
                                   f"or another trampoline")
            self._map(addr, PAGE)
            self._segments.append((addr, code))
        self._map(STACK_BASE, STACK_SIZE)
        self._reset_memory()
        self._rec = _RunRecord()
        self._kernel = KernelState(True, 5)
        self._site = 0
        self._site_bytes: dict[int, bytes] = {}
        self.uc.hook_add(UC_HOOK_INTR, self._on_intr)
        self.uc.hook_add(UC_HOOK_INSN, self._on_syscall, None, 1, 0, X.UC_X86_INS_SYSCALL)
        self.uc.hook_add(UC_HOOK_MEM_WRITE, self._on_write)
        for n in GPR_NAMES:
            self.uc.reg_write(getattr(X, f"UC_X86_REG_{n.upper()}"), _ARRIVAL_GPR[n])
        self.uc.reg_write(X.UC_X86_REG_RSP, ARRIVAL_RSP)
        self.uc.reg_write(X.UC_X86_REG_RFLAGS, _ARRIVAL_FLAGS)
        for i in range(16):
            self.uc.reg_write(getattr(X, f"UC_X86_REG_XMM{i}"),
                              0x3C3C_0000_0000_0000_0000_0000_0000_0000 + (i + 1) * 0x0101_0101)
        self._regs = RegReader(self.uc)
        self._arrival_ctx = self.uc.context_save()
        self.arrival = self._read_regs()

    # -- memory ---------------------------------------------------------------------------
    def _map(self, addr: int, size: int) -> None:
        if not (addr >= 0 and addr + size <= 1 << 64):
            raise MachineError(f"cannot map {size:#x} bytes at {addr:#x}: not a 64-bit address")
        try:
            self.uc.mem_map(addr, size, UC_PROT_ALL)
        except (UcError, OverflowError, ctypes.ArgumentError) as exc:
            raise MachineError(f"cannot map {size:#x} bytes at {addr:#x}: {exc}") from exc
        self._ranges.append((addr, addr + size))

    def _reset_memory(self, written: list[tuple[int, int]] | None = None) -> None:
        """Put memory back as loaded: the file's bytes, the trampolines, the filled stack.

        `written` (the (address, size) writes of a run): only the pages they touched are
        restored. None: a fresh machine, whose mapped memory unicorn hands out zeroed, so only
        the file's bytes are written: a segment's memory beyond its file bytes (a large .bss,
        or a p_memsz of 4 GiB in a damaged file) is never touched, nor held in memory.
        """
        if written is None:
            for addr, data in self._segments:
                self.uc.mem_write(addr, data)
            self.uc.mem_write(STACK_BASE, bytes([STACK_FILL]) * STACK_SIZE)
            self._site_bytes = {}
            return
        pages = sorted({page for addr, size in written
                        for page in range(addr & ~(PAGE - 1), addr + size, PAGE)
                        if self.mapped(page)})
        for page in pages:
            end = page + PAGE
            if STACK_BASE <= page < STACK_BASE + STACK_SIZE:
                self.uc.mem_write(page, bytes([STACK_FILL]) * PAGE)
            else:
                self.uc.mem_write(page, bytes(PAGE))
                for addr, data in self._segments:  # in load order, as the first time
                    lo, hi = max(addr, page), min(addr + len(data), end)
                    if lo < hi:
                        self.uc.mem_write(lo, data[lo - addr: hi - addr])
            self.uc.ctl_remove_cache(page, end)
            for site in [a for a, b in self._site_bytes.items()
                         if a < end and page < a + len(b)]:
                del self._site_bytes[site]  # its page now holds the file's bytes again

    def read(self, address: int, size: int) -> bytes:
        return bytes(self.uc.mem_read(address, size))

    def write_site(self, address: int, data: bytes) -> None:
        """Put `data` at `address` (a site) and drop translated code covering it."""
        if self._site_bytes.get(address) == data:
            return
        self.uc.mem_write(address, data)
        self.uc.ctl_remove_cache(address, address + len(data))
        self._site_bytes[address] = data

    def mapped(self, address: int) -> bool:
        return any(lo <= address < hi for lo, hi in self._ranges)

    # -- registers ------------------------------------------------------------------------
    def _read_regs(self) -> dict[str, int]:
        return self._regs.read()

    # -- hooks ----------------------------------------------------------------------------
    def _on_intr(self, uc: Any, intno: int, _user: Any) -> None:
        rip = uc.reg_read(X.UC_X86_REG_RIP)
        k = self._kernel
        if intno == 3 and rip - 1 == self._site:
            if k.probe:
                regs = self._read_regs()
                regs["rip"] = self._site
                self._rec.hits.append(Hit("int3", regs))
                uc.reg_write(X.UC_X86_REG_RIP, self._site + k.nop_length)
                return
            if k.late is not None and not self._rec.restart:
                self._rec.restart = True  # the writer finished: restart on the new bytes
                uc.emu_stop()
                return
            self._rec.fault = f"SIGTRAP: int3 at {self._site:#x} with no uprobe"
        else:
            where = rip - 1 if intno == 3 else rip
            self._rec.fault = f"interrupt {intno} at {where:#x}"
        uc.emu_stop()

    def _in_trampoline(self, rip: int) -> bool:
        return any(t <= rip < t + PAGE for t in self.trampolines)

    def _on_syscall(self, uc: Any, _user: Any) -> None:
        rip = uc.reg_read(X.UC_X86_REG_RIP)
        rax = uc.reg_read(X.UC_X86_REG_RAX)
        rflags = uc.reg_read(X.UC_X86_REG_RFLAGS)
        k = self._kernel
        if rax != UPROBE_SYSCALL:
            self._rec.fault = f"unexpected syscall {rax} at {rip:#x}"
            uc.emu_stop()
            return
        if not self._in_trampoline(rip):
            ret = -self.gen.errno & 0xFFFF_FFFF_FFFF_FFFF
        else:
            rsp = uc.reg_read(X.UC_X86_REG_RSP)
            raw = bytes(uc.mem_read(rsp, 32))
            ax, r11, cx, retaddr = (int.from_bytes(raw[i:i + 8], "little")
                                    for i in range(0, 32, 8))
            if k.probe:
                regs = self._read_regs()
                regs.update(rax=ax, r11=r11, rcx=cx, rsp=rsp + 32 + k.extra_sp,
                            rip=retaddr - k.call_length)
                self._rec.hits.append(Hit("syscall", regs))
            ret = ax
        uc.reg_write(X.UC_X86_REG_RAX, ret)
        uc.reg_write(X.UC_X86_REG_RCX, rip + 2)  # syscall/sysret clobber rcx and r11
        uc.reg_write(X.UC_X86_REG_R11, rflags)

    def _on_write(self, _uc: Any, _access: int, address: int, size: int, _value: int,
                  _user: Any) -> None:
        self._rec.writes.append((address, size))

    # -- a run ----------------------------------------------------------------------------
    def run(self, entry: int, end: int, site: int, state: bytes, kernel: KernelState,
            budget: int = 64, park: tuple[int, bytes, KernelState] | None = None) -> RunResult:
        """A thread arrives at `entry` with the arrival registers, the site holding `state`;
        run it until it reaches `end`, faults, or executes `budget` instructions.

        `park` = (n, bytes, kernel): after n instructions, stop the thread, write `bytes` at
        the site and switch the kernel state (a writer acting while the thread is parked,
        e.g. inside the trampoline), then let it go on.
        """
        uc: Any = self.uc
        uc.context_restore(self._arrival_ctx)
        self.write_site(site, state)
        self._site = site
        self._kernel = kernel
        self._rec = rec = _RunRecord()
        left = budget
        rip = entry
        phases: list[tuple[int, bytes, KernelState] | None] = [park] if park else []
        while True:
            count = left
            if phases and phases[0] is not None:
                count = min(left, phases[0][0])
            try:
                uc.emu_start(rip, end, count=count)
            except UcError as exc:
                rec.fault = f"{exc} at {uc.reg_read(X.UC_X86_REG_RIP):#x}"
            rip = uc.reg_read(X.UC_X86_REG_RIP)
            if rec.fault is not None or rip == end:
                break
            if rec.restart and kernel.late is not None:
                self.write_site(site, kernel.late)
                rip = site
                self._kernel = kernel = KernelState(probe=False, nop_length=kernel.nop_length,
                                                    late=None, call_length=kernel.call_length,
                                                    extra_sp=kernel.extra_sp)
                left -= 1
                continue
            if phases and phases[0] is not None:
                n, new_bytes, new_kernel = phases.pop(0)  # type: ignore[misc]
                left -= n
                self.write_site(site, new_bytes)
                self._kernel = kernel = new_kernel
                continue
            left = 0
            break
        regs = self._read_regs()
        stack_writes: set[int] = set()
        other: list[int] = []
        for addr, size in rec.writes:
            for a in range(addr, addr + size):
                if STACK_BASE <= a < STACK_BASE + STACK_SIZE:
                    stack_writes.add(a - ARRIVAL_RSP)
                else:
                    other.append(a)
        if other or any(not -STACK_WINDOW <= w < STACK_WINDOW for w in stack_writes):
            self._reset_memory(rec.writes)
        elif stack_writes:
            lo = ARRIVAL_RSP - STACK_WINDOW
            uc.mem_write(lo, bytes([STACK_FILL]) * (2 * STACK_WINDOW))
        return RunResult(end_rip=rip, regs=regs, hits=tuple(rec.hits),
                         stack_writes=tuple(sorted(stack_writes)), other_writes=tuple(other[:16]),
                         fault=rec.fault, instructions_left=left > 0)

    def call(self, function: int, args: tuple[int, ...], site: int, state: bytes,
             kernel: KernelState, budget: int = 100_000) -> RunResult:
        """Call `function` (SysV: args in rdi, rsi, rdx, rcx, r8, r9) with the site holding
        `state`, until it returns; the result's regs["rax"] is its return value."""
        if len(args) > 6:
            raise ValueError("at most 6 register arguments")
        uc: Any = self.uc
        uc.context_restore(self._arrival_ctx)
        self.write_site(site, state)
        self._site = site
        self._kernel = kernel
        self._rec = rec = _RunRecord()
        for name, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args, strict=False):
            uc.reg_write(getattr(X, f"UC_X86_REG_{name.upper()}"), value)
        uc.mem_write(ARRIVAL_RSP, CALL_RETURN.to_bytes(8, "little"))
        try:
            uc.emu_start(function, CALL_RETURN, count=budget)
        except UcError as exc:
            rec.fault = f"{exc} at {uc.reg_read(X.UC_X86_REG_RIP):#x}"
        rip = uc.reg_read(X.UC_X86_REG_RIP)
        regs = self._read_regs()
        self._reset_memory(rec.writes)
        return RunResult(end_rip=rip, regs=regs, hits=tuple(rec.hits), stack_writes=(),
                         other_writes=(), fault=rec.fault, instructions_left=rip == CALL_RETURN)


CALL_RETURN = STACK_BASE  # where a function called by Machine.call returns to (never run)


class RegReader:
    """Reads REG_NAMES in one uc_reg_read_batch call into a preallocated buffer.

    The binding's reg_read_batch builds ctypes objects per register per call (about 2 us
    each, the largest cost of a run); this reuses one buffer of 16-byte slots. When the
    binding lacks the raw batch call it falls back to reg_read_batch.
    """

    def __init__(self, uc: Any) -> None:
        self.uc = uc
        n = len(_REG_IDS)
        self.n = n
        self.buf = ctypes.create_string_buffer(16 * n)
        base = ctypes.addressof(self.buf)
        self.ids = (ctypes.c_int * n)(*_REG_IDS)
        self.ptrs = (ctypes.c_void_p * n)(*(base + 16 * i for i in range(n)))
        self.count = ctypes.c_int(n)
        self.raw = getattr(uc, "_do_reg_read_batch", None)
        self.n64 = len(GPR_NAMES) + 2  # GPRs, rflags, rip: 8 bytes each
        if self.raw is not None and self.read() != self._slow():
            self.raw = None  # the raw call does not behave as expected: use the binding

    def _slow(self) -> dict[str, int]:
        return dict(zip(REG_NAMES, self.uc.reg_read_batch(_REG_IDS), strict=True))

    def read(self) -> dict[str, int]:
        if self.raw is None:
            return self._slow()
        ctypes.memset(self.buf, 0, 16 * self.n)
        if self.raw(self.ids, self.ptrs, self.count) != 0:
            return self._slow()
        raw = self.buf.raw
        out = dict(zip(REG_NAMES[: self.n64],
                       struct.unpack_from(f"<{self.n64 * 2}Q", raw)[::2], strict=True))
        for i in range(self.n64, self.n):
            out[REG_NAMES[i]] = int.from_bytes(raw[16 * i: 16 * i + 16], "little")
        return out

    def read_raw(self) -> bytes:
        """REG_NAMES as 16-byte little-endian slots, in order (a GPR, rflags or rip fills the
        low 8 bytes of its slot, the rest zero): a value to compare without building ints."""
        if self.raw is not None and self.raw(self.ids, self.ptrs, self.count) == 0:
            return self.buf.raw  # the high halves of the 8-byte slots stay zero (memset)
        r = self._slow()
        return b"".join(r[n].to_bytes(16, "little") for n in REG_NAMES)


def raw_regs(raw: bytes) -> dict[str, int]:
    """RegReader.read_raw's slots as {name: value}."""
    return {n: int.from_bytes(raw[16 * i: 16 * i + 16], "little")
            for i, n in enumerate(REG_NAMES)}


class RegWriter:
    """Writes GPRs, rflags and xmm0-15 in one uc_reg_write_batch call (see RegReader); falls
    back to one reg_write per register when the raw call is missing or misbehaves."""

    IDS = (*_GPR_IDS, X.UC_X86_REG_RFLAGS, *(getattr(X, f"UC_X86_REG_XMM{i}") for i in range(16)))

    def __init__(self, uc: Any) -> None:
        self.uc = uc
        n = len(self.IDS)
        self.n = n
        self.buf = ctypes.create_string_buffer(16 * n)
        base = ctypes.addressof(self.buf)
        self.ids = (ctypes.c_int * n)(*self.IDS)
        self.ptrs = (ctypes.c_void_p * n)(*(base + 16 * i for i in range(n)))
        self.count = ctypes.c_int(n)
        self.raw = getattr(uc, "_do_reg_write_batch", None)

    def write(self, gprs: list[int], rflags: int, xmm: list[int]) -> None:
        """`gprs` in GPR_NAMES order, then rflags, then xmm0-15."""
        values = [*gprs, rflags, *xmm]
        if self.raw is not None:
            raw = b"".join(v.to_bytes(16, "little") for v in values)
            ctypes.memmove(self.buf, raw, len(raw))
            if self.raw(self.ids, self.ptrs, self.count) == 0:
                return
            self.raw = None
        for rid, v in zip(self.IDS, values, strict=True):
            self.uc.reg_write(rid, v)

    def write_raw(self, raw: bytes) -> None:
        """IDS as 16-byte little-endian slots (GPRs, rflags, xmm0-15), one call."""
        if len(raw) != 16 * self.n:
            raise ValueError(f"{len(raw)} bytes, not {16 * self.n}")
        if self.raw is not None:
            ctypes.memmove(self.buf, raw, len(raw))
            if self.raw(self.ids, self.ptrs, self.count) == 0:
                return
            self.raw = None
        for i, rid in enumerate(self.IDS):
            self.uc.reg_write(rid, int.from_bytes(raw[16 * i: 16 * i + 16], "little"))


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
