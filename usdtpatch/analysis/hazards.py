"""Hazards of optimized probe sites, each a Finding.

References (docs/findings.md, `red-zone-live` and `process-can-fork`, measured on 6.18):
- Red zone: the optimized path's `call` and the trampoline's three pushes overwrite the 32
  bytes below %rsp. The x86-64 psABI (section 3.2.2, "The Stack Frame") lets a function keep
  data in the 128 bytes below %rsp. `red_zone` decides conservatively whether the function
  holding a site may do so: "free" only when its code proves it does not.
- fork(): a child inherits the `e8` call bytes but not the trampoline page and dies with
  SIGSEGV at the site. Any import of the fork family makes a process exposed.
- Semaphores: an `unsigned short` counter the kernel increments, by convention in `.probes`;
  it must be 2-byte aligned and in a writable segment.
- Argument specs through %rsp or %rip: a detour moves the probe (rip changes) and a
  red-zone-safe detour lowers %rsp by 128 around it; such arguments must be rewritten.
- rseq: restartable-sequence critical sections described by `struct rseq_cs` records in the
  `__rseq_cs` section (Linux uapi/linux/rseq.h: u32 version, u32 flags, u64 start_ip,
  u64 post_commit_offset, u64 abort_ip); code in them must not move.
"""

from __future__ import annotations

import re
import struct
from bisect import bisect_left
from dataclasses import dataclass

from usdtpatch.analysis.functions import FunctionBounds
from usdtpatch.analysis.index import Recent
from usdtpatch.analysis.probes import Probe
from usdtpatch.analysis.targets import (
    ENTRY,
    LANDING_PAD,
    SYMBOL,
    CodeContext,
    FunctionCode,
    _copies,
    _Graph,
    _reaching_defs,
    _regs_alias,
)
from usdtpatch.analysis.waysin import code_ranges, references_to
from usdtpatch.elf.args import MemOperand
from usdtpatch.elf.cfi import CfiError, CfiIndex, eh_frame_unindexed, load_cfi
from usdtpatch.elf.image import PF_W, PT_LOAD, ElfImage
from usdtpatch.elf.relocs import import_slots
from usdtpatch.elf.symbols import load_symbols, symbol_names, symbol_value
from usdtpatch.findings import (
    DETOUR_UNWIND_LEFT_OUT,
    SEMAPHORE_MISALIGNED,
    SEMAPHORE_NOT_IN_PROBES,
    SEMAPHORE_NOT_WRITABLE,
    SEMAPHORE_UNMAPPED,
    Finding,
)
from usdtpatch.kernelfacts import OPTIMIZING
from usdtpatch.x86.decode import CodeInsn, Flow

# bytes below rsp an optimized hit writes, on the generation that writes most (nop5's return
# address and the trampoline's 3 pushes)
CLOBBERED = max(g.writes_below_rsp for g in OPTIMIZING)

FORK_FAMILY = frozenset({"fork", "vfork", "clone", "clone3", "daemon", "posix_spawn",
                         "posix_spawnp", "_Fork", "__libc_fork", "forkpty", "system",
                         "popen"})
# Of those, the ones whose child gets a copy of the address space (without the trampoline
# page); vfork, posix_spawn, system and popen run the child in the parent's mm until exec.
FORK_COPIES_MM = frozenset({"fork", "_Fork", "__libc_fork", "daemon", "forkpty", "clone",
                            "clone3"})
RSEQ_SECTION = "__rseq_cs"
RSEQ_CS_SIZE = 32


@dataclass(frozen=True, slots=True)
class RedZone:
    """Whether the function holding a site may keep live data below %rsp there."""

    may_use: bool
    reason: str
    evidence: int | None  # address of the instruction (or None for an argument / unknown)


_RSP_COPY = re.compile(r"^%rsp, %(\w+)$")


@dataclass(frozen=True, slots=True)
class _FunctionStack:
    """What a function's code says about its stack, whatever probe is in it."""

    below: RedZone | None  # the first access below %rsp (or below the frame), if any
    frame_at: int | None  # address of `mov %rsp,%rbp`
    lowered: int  # bytes the prologue reserves below the frame pointer


class StackMemo:
    """The probe-independent part of `red_zone` (what a function's code says about its stack),
    worked out once per function for one analysis run: pass one to every `red_zone` call of a
    run (a function with several probes is walked once)."""

    def __init__(self) -> None:
        # the latest functions' (index.Recent): the sites come in address order
        self._got: dict[int, tuple[FunctionCode, _FunctionStack]] = Recent()

    def __call__(self, fc: FunctionCode) -> _FunctionStack:
        got = self._got.get(id(fc))
        if got is None or got[0] is not fc:  # the FunctionCode is kept: its id stays its own
            got = (fc, _function_stack(fc))
            self._got[id(fc)] = got
        return got[1]


def red_zone(fc: FunctionCode | None, probe: Probe, stacks: StackMemo | None = None) -> RedZone:
    """Conservative red-zone analysis: "may use" unless the code proves otherwise.

    Proof obligations, over the function's whole linear disassembly (not path-sensitive):
    1. no memory operand (load, store or lea) at a negative displacement from %rsp, or from a
       register copied from %rsp;
    2. with a frame pointer (`mov %rsp,%rbp`), no %rbp-relative operand deeper than the bytes
       the prologue pushes and subtracts from %rsp right after that copy;
    3. no probe argument addressed below %rsp (or below the frame as in 2);
    4. the function decoded completely.
    """
    for a in probe.args:
        op = a.operand
        if isinstance(op, MemOperand) and op.base == "rsp" and op.disp < 0:
            return RedZone(True, f"argument {a.raw} lives {-op.disp} bytes below %rsp at the "
                                 "site", None)
    if fc is None:
        return RedZone(True, "the function's bounds are unknown: nothing proves the red zone "
                             "free", None)
    if fc.bad or not fc.insns:
        return RedZone(True, "the function did not decode completely", None)
    guard = _guarded(fc, probe)
    if guard is not None:
        return RedZone(False, guard, None)
    stack = _function_stack(fc) if stacks is None else stacks(fc)
    if stack.below is not None:
        return stack.below
    if stack.frame_at is not None:
        for a in probe.args:
            op = a.operand
            if isinstance(op, MemOperand) and op.base == "rbp" and -op.disp > stack.lowered:
                return RedZone(True, f"argument {a.raw} lies below the reserved frame", None)
    return RedZone(False, "no access below %rsp in the function", None)


def _function_stack(fc: FunctionCode) -> _FunctionStack:
    copies: set[str] = set()
    frame_at: int | None = None
    lowered = 0
    in_prologue = False
    graph: _Graph | None = None
    for k, ins in enumerate(fc.insns):
        m = ins.mem
        op = ins.op_str
        if m is None and not in_prologue and not op.startswith("%rsp, %"):
            continue  # no memory operand, no copy of %rsp, outside the prologue: nothing to see
        if op.endswith(", %rsp") and ins.base_mnemonic.startswith("lea"):  # _adjusts_rsp
            continue  # lea -N(%rsp),%rsp moves the stack pointer; it reads no memory
        if m is not None and (m.base == "rsp" or m.base in copies) and m.disp < 0:
            return _FunctionStack(RedZone(True, f"{ins.text} at {ins.address:#x} addresses "
                                                f"{-m.disp} bytes below %{m.base}",
                                          ins.address), frame_at, lowered)
        if m is not None and (m.base == "rsp" or m.base in copies) and m.index is not None:
            # a register index may be negative, unless every value reaching it here is known
            # not to be (a loop counter counted up from zero, a zero-extended value, a mask)
            graph = graph or _Graph(fc.insns, {a for a, t in fc.targets.items()
                                               if t.kind in (ENTRY, SYMBOL, LANDING_PAD)})
            if nonnegative(graph, k, _regs_alias(m.index), frozenset()):
                continue
            return _FunctionStack(RedZone(True, f"{ins.text} at {ins.address:#x} addresses "
                                                f"%{m.base} plus the register %{m.index}, "
                                                f"which may reach below it", ins.address),
                                  frame_at, lowered)
        mc = _RSP_COPY.match(op) if op.startswith("%rsp, %") else None
        if mc is not None and ins.base_mnemonic.startswith("mov"):
            reg = mc.group(1)
            if reg == "rbp" and frame_at is None:
                frame_at = ins.address
                in_prologue = True
            elif reg != "rbp":
                copies.add(reg)
            continue
        if in_prologue:
            # the frame's reservation: pushes and `sub $N,%rsp` right after `mov %rsp,%rbp`,
            # up to the first control transfer (whatever the site's position)
            if ins.flow is not Flow.NONE:
                in_prologue = False
            else:
                lowered += _lowers_rsp(ins)
    if frame_at is not None:
        for ins in fc.insns:
            m = ins.mem
            if (m is not None and m.base == "rbp" and m.disp < 0 and -m.disp > lowered
                    and ins.address > frame_at):
                return _FunctionStack(
                    RedZone(True, f"{ins.text} at {ins.address:#x} addresses {-m.disp} bytes "
                                  f"below the frame pointer, but only {lowered} bytes were "
                                  "reserved below it", ins.address), frame_at, lowered)
    return _FunctionStack(None, frame_at, lowered)


# A value below this, scaled by 8 and added to a base, stays above the base (no wrap around
# 2^64 into the 128 bytes below it). A register counted up by a small step from such a value
# is taken to stay below it (`index-counters-bounded` in usdtpatch/prove/assumptions.py).
_NONNEG_STEP = 1 << 16


def _width(reg: str) -> int:
    """The width in bits of a general register's name (rax 64, eax 32, ax 16, al 8)."""
    r = reg.lstrip("%")
    if r[0] == "r" and r[1:].isdigit():
        return 64
    if r[0] == "r" and r[-1] in "dwb":
        return {"d": 32, "w": 16, "b": 8}[r[-1]]
    if r.startswith("r"):
        return 64
    if r.startswith("e"):
        return 32
    return 8 if r[-1] in "lh" else 16


def nonnegative(g: _Graph, k: int, reg: str, assumed: frozenset[tuple[int, str]],
                 depth: int = 0) -> bool:
    """Whether every value of the 64-bit register `reg` that reaches instruction k is below
    2^60 (so non-negative): each definition reaching it writes a 32-bit register (zero
    extended), zero-extends a byte or word, masks with a non-negative immediate, shifts right,
    copies such a register, or adds a small non-negative step to one (a loop counter: the
    definitions around a loop are taken as proved while they are being proved). An argument,
    a call's result, or any other definition: not known."""
    if depth > 8:
        return False
    defs = _reaching_defs(g, k, reg)
    if not defs:
        return False
    for kind, p in defs:
        if kind != "def":
            return False
        ins = g.insns[p]
        ops = ins.operands
        base = ins.base_mnemonic
        dest = ops[-1] if ops and ops[-1].startswith("%") else None
        if dest is None or _regs_alias(dest) != reg or ins.flow is not Flow.NONE:
            return False  # an implicit write (cqto, div, ...)
        width = _width(dest)
        if width == 32 and not base.startswith(("xchg", "cmpxchg", "xadd")):
            continue  # a 32-bit write zero-extends: below 2^32
        if width != 64:
            return False  # a byte or word write keeps the upper bits
        src = ops[0] if len(ops) == 2 else None
        imm = _imm64(src)
        if base.startswith("movz"):
            continue  # movzbq, movzwq: below 2^16
        if base.startswith("and") and imm is not None and 0 <= imm < 1 << 60:
            continue
        if base.startswith("shr") and imm is not None and imm >= 4:
            continue
        if base.startswith("mov") and not base.startswith("movs") and imm is not None and \
                0 <= imm < 1 << 60:
            continue  # mov $N
        before: str | None = None
        if base.startswith("mov") and not base.startswith(("movs", "movab")) and \
                src is not None and src.startswith("%") and _width(src) == 64:
            before = _regs_alias(src)  # a copy
        elif (base.startswith("add") and imm is not None and 0 <= imm < _NONNEG_STEP) or \
                (base.startswith("inc") and len(ops) == 1):
            before = reg
        elif base.startswith("lea") and ins.mem is not None and ins.mem.index is None and \
                ins.mem.base not in (None, "rip") and 0 <= ins.mem.disp < _NONNEG_STEP:
            before = _regs_alias(ins.mem.base)
        if before is None:
            return False
        if (p, before) in assumed:
            continue  # around a loop: holds if the other definitions hold
        if not nonnegative(g, p, before, assumed | {(p, before)}, depth + 1):
            return False
    return True


def _imm64(op: str | None) -> int | None:
    """An immediate operand's value as a signed 64-bit number, or None."""
    if op is None or not op.startswith("$"):
        return None
    try:
        v = int(op[1:], 0)
    except ValueError:
        return None
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


GUARD_IN_TEXT = "-0x80(%rsp), %rsp"  # 48 8d 64 24 80: lea -0x80(%rsp),%rsp
GUARD_OUT_TEXT = "0x80(%rsp), %rsp"  # 48 8d a4 24 80 00 00 00: lea 0x80(%rsp),%rsp


def _adjusts_rsp(ins: CodeInsn) -> bool:
    return ins.base_mnemonic.startswith("lea") and ins.op_str.endswith(", %rsp")


def _guarded(fc: FunctionCode, probe: Probe) -> str | None:
    """The reason the site is safe when usdtpatch's sdt.h red-zone guard wraps it:
    `lea -0x80(%rsp),%rsp; <site>; lea 0x80(%rsp),%rsp` (the optimized path's writes land
    below the red zone), else None."""
    i = fc.index_of(probe.address)
    if i is None or i == 0:
        return None
    length = probe.site.length or fc.insns[i].size
    after = fc.index_of(probe.address + length)
    before = fc.insns[i - 1]
    if after is None:
        return None
    out = fc.insns[after]
    if (before.base_mnemonic.startswith("lea") and before.op_str == GUARD_IN_TEXT
            and out.base_mnemonic.startswith("lea") and out.op_str == GUARD_OUT_TEXT):
        return ("the site is wrapped in lea -0x80(%rsp),%rsp / lea 0x80(%rsp),%rsp: the "
                "optimized path writes below the red zone")
    return None


def _lowers_rsp(ins: CodeInsn) -> int:
    base = ins.base_mnemonic
    if base in ("push", "pushq"):
        return 8
    if base.startswith("sub") and ins.op_str.endswith("%rsp") and ins.op_str.startswith("$"):
        try:
            return int(ins.op_str.split(",")[0][1:], 0)
        except ValueError:
            return 0
    return 0


def imported_fork_family(image: ElfImage) -> tuple[str, ...]:
    """Names of the fork family the file imports (undefined dynamic symbols), or defines
    (a static executable's `.symtab`)."""
    found = {name for name in symbol_names(image) if name in FORK_FAMILY}
    return tuple(sorted(found))


@dataclass(frozen=True, slots=True)
class RseqCs:
    start: int
    end: int  # start_ip + post_commit_offset
    abort: int


def rseq_sections(ctx: CodeContext) -> tuple[RseqCs, ...]:
    """Every `struct rseq_cs` in `__rseq_cs` (values from the file or RELATIVE relocations)."""
    image = ctx.image
    sec = image.section(RSEQ_SECTION)
    if sec is None or not image.is64 or not sec.addr:
        return ()
    out: list[RseqCs] = []
    for addr in range(sec.addr, sec.addr + sec.size - RSEQ_CS_SIZE + 1, RSEQ_CS_SIZE):
        start = ctx.read_pointer(addr + 8)
        raw = image.read_vaddr(addr + 16, 8)
        abort = ctx.read_pointer(addr + 24)
        if start is None or abort is None or len(raw) < 8:
            continue
        length: int = struct.unpack(image.byteorder + "Q", raw)[0]
        out.append(RseqCs(start, start + length, abort))
    return tuple(out)


def semaphore_problems(probe: Probe, image: ElfImage, where: str) -> tuple[Finding, ...]:
    """What is wrong with a probe's semaphore (nothing when it has none)."""
    sem = probe.semaphore
    if sem is None:
        return ()
    out: list[Finding] = []
    seg = None
    for s in image.segments:
        if s.type == PT_LOAD and s.vaddr <= sem.address and sem.address + 2 <= s.vaddr + s.memsz:
            seg = s
            break
    if seg is None:
        out.append(SEMAPHORE_UNMAPPED.finding(
            f"semaphore {sem.address:#x} is in no loadable segment", where))
    elif not seg.flags & PF_W:
        out.append(SEMAPHORE_NOT_WRITABLE.finding(
            f"semaphore {sem.address:#x} is in a read-only segment (program header "
            f"{seg.index})", where))
    if sem.address % 2:
        out.append(SEMAPHORE_MISALIGNED.finding(
            f"semaphore {sem.address:#x} is not 2-byte aligned", where))
    if seg is not None and sem.section != ".probes":
        out.append(SEMAPHORE_NOT_IN_PROBES.finding(
            f"semaphore {sem.address:#x} is in {sem.section or 'no section'}, not .probes",
            where))
    return tuple(out)


# --- the detours' unwind tables ------------------------------------------------------------

def detour_unwind_left_out(image: ElfImage) -> Finding | None:
    """`detour-unwind-left-out` for a file whose `.eh_frame` has no PT_GNU_EH_FRAME header:
    rewrite adds the detours' unwind rows only beside one (rewriter.plan's unwind tables);
    None otherwise. check (for a site it moves to a detour) and rewrite (for a detour it adds)
    both say it through this function."""
    at = eh_frame_unindexed(image)
    if at is None:
        return None
    return DETOUR_UNWIND_LEFT_OUT.finding(
        f"the file has .eh_frame at {at:#x} but no PT_GNU_EH_FRAME header, the table "
        f"runtime unwinders find FDEs by: the detours get no unwind rows, and a backtrace or "
        f"an exception passing through a detour stops there")


# --- fork in code: the system calls themselves ---------------------------------------------

SYS_CLONE, SYS_FORK, SYS_VFORK, SYS_CLONE3 = 56, 57, 58, 435
CLONE_VM = 0x100
FORK_SYSCALL_NAMES = {SYS_CLONE: "clone", SYS_FORK: "fork", SYS_VFORK: "vfork",
                      SYS_CLONE3: "clone3"}


@dataclass(frozen=True, slots=True)
class ForkEvidence:
    """What the file's code says about forking, where its symbols say nothing (a stripped
    static executable): each entry is (address of the `syscall`, what it is).

    `forks`: a fork, or a clone without CLONE_VM (the child gets a copy of the address space,
    without the trampoline page); `shared`: vfork, or clone with CLONE_VM (the child shares
    the parent's memory); `unknown`: a system call whose number (or clone's flags) the code
    does not fix before it, or a call of the `syscall` function: it may fork."""

    forks: tuple[tuple[int, str], ...]
    shared: tuple[tuple[int, str], ...]
    unknown: tuple[tuple[int, str], ...]

    def describe(self) -> str | None:
        """Why the process forks a copy of itself, or None."""
        if self.forks:
            at, what = self.forks[0]
            more = f" (and {len(self.forks) - 1} more)" if len(self.forks) > 1 else ""
            return f"its code makes the {what} system call at {at:#x}{more}"
        return None

    def uncertainty(self) -> str | None:
        """Why it cannot be told whether the process forks (no fork found), or None."""
        if self.unknown and not self.forks:
            at, what = self.unknown[0]
            more = f" (and {len(self.unknown) - 1} more)" if len(self.unknown) > 1 else ""
            where = f" at {at:#x}" if at else ""
            return f"it may fork: {what}{where}{more}"
        return None


def fork_evidence(ctx: CodeContext, raw: bool = True) -> ForkEvidence:
    """Every `syscall` instruction of the file's executable code, classified by the constant
    the instructions before it (in its function's linear disassembly, on straight-line code)
    put in %eax: fork, vfork, clone (with clone's flags from %edi), clone3; and every call of
    the C library's `syscall()` function (imported, or defined in a static file), classified
    by the constant its caller puts in %edi (clone's flags: %esi). A `syscall` instruction or
    a call whose number is not such a constant, or a reference to `syscall()` that is not a
    call (its address taken), is `unknown`. The system call inside a defined `syscall()` is
    judged by its callers. `raw=False` leaves out the `syscall` instructions (only the calls
    of `syscall()`: a shared object's code, scanned by its process's executable)."""

    image = ctx.image
    forks: list[tuple[int, str]] = []
    shared: list[tuple[int, str]] = []
    unknown: list[tuple[int, str]] = []
    buckets = {"forks": forks, "shared": shared, "unknown": unknown}
    wrapper = _syscall_function(ctx)
    if ctx.syscall_calls is None:  # asked with and without `raw` of one file (check, guard)
        ctx.syscall_calls = _syscall_calls(ctx, wrapper)
    for pc, (bucket, what) in ctx.syscall_calls:
        buckets[bucket].append((pc, what))
    for vaddr, off, size in code_ranges(image) if raw else ():
        data = bytes(image.data[off:off + size])
        at = data.find(b"\x0f\x05")
        while at >= 0:
            pc = vaddr + at
            kind = None if wrapper is not None and wrapper.contains(pc) else \
                _syscall_kind(ctx, pc)
            if kind is not None:
                buckets[kind[0]].append((pc, kind[1]))
            at = data.find(b"\x0f\x05", at + 1)
    return ForkEvidence(tuple(forks), tuple(shared), tuple(unknown))


def _syscall_function(ctx: CodeContext) -> FunctionBounds | None:
    """The bounds of the C library's `syscall()` defined in the file (a static executable with
    symbols), or None."""
    at = symbol_value(ctx.image, "syscall")
    return ctx.bounds(at) if at is not None and ctx.bounds(at) is not None else None


def _syscall_calls(ctx: CodeContext, wrapper: FunctionBounds | None
                   ) -> list[tuple[int, tuple[str, str]]]:
    """(call site, (bucket, what)) of every reference to `syscall()`: its PLT stubs and GOT
    slots (an import) or its entry (a definition); calls classified by their number."""
    image = ctx.image
    slots = set(import_slots(image, "syscall"))
    entries = {wrapper.start} if wrapper is not None else set()
    for src, name, _t in references_to(image, slots, ("jmp-indirect",)):
        if name == "jmp-indirect":  # a PLT stub: `[endbr64] [bnd] jmp *slot(%rip)`
            entries.update(_stub_starts(image, src))
    out: list[tuple[int, tuple[str, str]]] = []
    if not slots and not entries:
        return out
    refs = [*references_to(image, entries, ("call", "jmp", "lea")),
            *references_to(image, slots, ("call-indirect", "jmp-indirect", "mov"))]
    for src, name, t in sorted(refs):
        if (name == "jmp-indirect" and src in entries) or src in entries:
            continue  # the PLT stub itself
        kind = _call_kind(ctx, src, name, t)
        if kind is not None:
            out.append((src, kind))
    return out


def _stub_starts(image: ElfImage, jmp: int) -> set[int]:
    """Where a PLT stub whose `jmp *slot(%rip)` is at `jmp` may start (its prefixes)."""
    out = {jmp}
    at = jmp
    if image.read_vaddr(at - 1, 1) == b"\xf2":  # bnd
        at -= 1
        out.add(at)
    if image.read_vaddr(at - 4, 4) == b"\xf3\x0f\x1e\xfa":  # endbr64
        out.add(at - 4)
    return out


def _call_kind(ctx: CodeContext, src: int, name: str, target: int
               ) -> tuple[str, str] | None:
    """What the reference to `syscall()` at `src` does (bucket, what), or None when the bytes
    are not an instruction referring to it, or it is a call of a number that is not a fork."""
    bounds = ctx.bounds(src)
    if bounds is None:
        return "unknown", "a reference to syscall() in code of no known function"
    sw = ctx.sweep(bounds.start, bounds.end)
    k = bisect_left(sw.insns, src, key=lambda x: x.address)
    if k >= len(sw.insns) or sw.insns[k].address != src:
        # a prefixed instruction starts one byte before (notrack, bnd, rex)
        k -= 1
        if k < 0 or not sw.insns[k].address <= src < sw.insns[k].end:
            return ("unknown", "a reference to syscall() in code that does not decode") \
                if sw.bad else None
    ins = sw.insns[k]
    if target not in (ins.target, ins.rip_target):
        return None
    if name in ("lea", "mov"):
        return "unknown", "the address of syscall() is taken"
    fc = ctx.function(bounds)
    number = _constant_before(sw.insns, k, "rdi", fc)
    if number is None:
        return "unknown", "syscall() is called with a number not fixed in the code"
    return _classify(ctx, sw.insns, k, number, "rsi", fc, "{} (through syscall())")


def _classify(ctx: CodeContext, insns: tuple[CodeInsn, ...], k: int, number: int,
              flags_reg: str, fc: FunctionCode, what: str) -> tuple[str, str] | None:
    """The bucket of a system call of `number` made by instruction k (clone's flags in
    `flags_reg`), `what` naming it ("{}" the call's name); None: it does not fork."""
    if number == SYS_FORK:
        return "forks", what.format("fork")
    if number == SYS_VFORK:
        return "shared", what.format("vfork")
    if number == SYS_CLONE:
        flags = _constant_before(insns, k, flags_reg, fc)
        if flags is None:
            return "unknown", what.format("clone") + " with flags that are not a constant"
        if flags & CLONE_VM:
            return "shared", what.format("clone") + f" (flags {flags:#x}, CLONE_VM)"
        return "forks", what.format("clone") + f" (flags {flags:#x}, without CLONE_VM)"
    if number == SYS_CLONE3:
        return "unknown", what.format("clone3") + " (its flags are in memory)"
    return None


_CONTEXT: list[CodeContext] = []  # the last analysis context of a check, for its file


def remember_context(ctx: CodeContext) -> None:
    """Keep `ctx` (check's, with the symbols, CFI and functions it read) for the questions
    about the same file that follow (fork_evidence_of: the fork guard's decisions)."""
    _CONTEXT[:] = [ctx]


def forget_context() -> None:
    """Let go of the context `remember_context` kept: rewrite asks nothing more of it once
    the plan is made, and it holds each site's function, FDE and index entries (~0.5 KB a
    probe) that the build and the output check do not read (issue 38)."""
    _CONTEXT.clear()


def fork_evidence_of(image: ElfImage, raw: bool = True) -> ForkEvidence:
    """fork_evidence with the file's own call frame information and symbols (check's context
    for the file when it has one: `remember_context`)."""

    if _CONTEXT and _CONTEXT[0].image is image:
        return fork_evidence(_CONTEXT[0], raw)
    try:
        cfi = load_cfi(image)
    except CfiError:
        cfi = CfiIndex(image, (), (), "none")
    return fork_evidence(CodeContext(image, cfi, load_symbols(image)), raw)


def _syscall_kind(ctx: CodeContext, pc: int) -> tuple[str, str] | None:
    """("forks" | "shared" | "unknown", description) of the syscall at `pc`, or None when it
    is not a fork (a known other number) or the bytes are not a `syscall` instruction."""
    bounds = ctx.bounds(pc)
    if bounds is None:
        return "unknown", "a syscall in code of no known function"
    sw = ctx.sweep(bounds.start, bounds.end)
    insns = sw.insns
    k = bisect_left(insns, pc, key=lambda x: x.address)
    if k >= len(insns) or insns[k].address != pc or insns[k].base_mnemonic != "syscall":
        return None if not sw.bad else ("unknown", "a syscall in code that does not decode")
    if image_bytes_before(ctx.image, pc) in _SIGRETURN:
        return None  # the signal return trampoline: rt_sigreturn, which does not return
    number = _constant_before(insns, k, "rax", ctx.function(bounds))
    if number is None:
        return "unknown", "a syscall whose number is not a constant set before it"
    return _classify(ctx, insns, k, number, "rdi", ctx.function(bounds), "{}")


# `mov $15,%rax` / `mov $15,%eax` right before a syscall: the C library's signal return
# trampoline (glibc's __restore_rt, musl's), whose FDE starts a byte early (so that a lookup
# of its address - 1 finds it): its linear disassembly from there is misaligned
_SIGRETURN = (b"\x48\xc7\xc0\x0f\x00\x00\x00", b"\xb8\x0f\x00\x00\x00")


def image_bytes_before(image: ElfImage, pc: int) -> bytes:
    """The 7 or 5 bytes before `pc` that match a `_SIGRETURN` pattern, else b""."""
    for pat in _SIGRETURN:
        if image.read_vaddr(pc - len(pat), len(pat)) == pat:
            return pat
    return b""


def _constant_before(insns: tuple[CodeInsn, ...], k: int, reg: str,
                     fc: FunctionCode) -> int | None:
    """The one constant `reg` holds before instruction k on every path that reaches it
    within the function (`mov $N`, `xor r,r`, register copies followed), or None when a path
    brings another value, an argument or a call's result, or the paths disagree."""
    g = _Graph(insns, {a for a, t in fc.targets.items()
                       if t.kind in (ENTRY, SYMBOL, LANDING_PAD)})
    got = _values(g, k, reg, 0)
    return got.pop() if got is not None and len(got) == 1 else None


def _values(g: _Graph, k: int, reg: str, depth: int) -> set[int] | None:
    defs = _reaching_defs(g, k, reg)
    if not defs or depth > 4:
        return None
    out: set[int] = set()
    for kind, p in defs:
        if kind != "def":
            return None  # an argument, or a call's result
        ins = g.insns[p]
        ops = ins.operands
        base = ins.base_mnemonic
        if base.startswith("mov") and len(ops) == 2 and ops[0].startswith("$"):
            try:
                out.add(int(ops[0][1:], 0) & 0xFFFFFFFF)
            except ValueError:
                return None
        elif base.startswith("xor") and len(ops) == 2 and \
                _regs_alias(ops[0]) == _regs_alias(ops[1]) == reg:
            out.add(0)
        elif (cp := _copies(ins)) is not None and cp[1] == reg:
            sub = _values(g, p, cp[0], depth + 1)
            if sub is None:
                return None
            out |= sub
        else:
            return None
    return out
