"""Every branch target of a function: what a patch window must not have strictly inside it.

A target is an address control can arrive at other than by falling through: the function entry,
other symbols inside it, direct jmp/jcc/call targets, return sites (the instruction after each
call), exception landing pads (the LSDA's call-site table in `.gcc_except_table`), jump-table
entries, rseq abort handlers, and jumps back from a split-off `.cold` part. A function whose
indirect jump is not understood, or whose bytes do not all decode, is "all targets": every
instruction boundary counts.

Jump tables recognized (x86-64, what GCC and clang emit):
- PIC, relative int32 entries: `lea T(%rip),%rB; movslq (%rB,%rI,4),%rX; add %rB,%rX;
  jmp *%rX` (GCC and clang, also with `notrack`), each target = T + entry;
- absolute 8-byte entries: `jmp *T(,%rI,8)` or `mov T(,%rI,8),%rX; jmp *%rX` (non-PIE), and
  `lea T(%rip),%rB; mov (%rB,%rI,8),%rX; jmp *%rX` (computed goto tables, PIE with
  R_X86_64_RELATIVE relocations supplying the values).
The entry count comes from the `cmp $N,%r; ja default` (or `and $2^k-1,%r`) guard on the
table's index when one is found nearby (also a `cmp $N,M; ja` of the memory the index is then
loaded from), or from the index's value range (`movzbl`: 256, `movzwl`: 65536, `bsf`: 64);
else entries are read while they point at code and, inside the function, at instruction
boundaries (a spurious target only makes windows smaller), and the jump is a computed one
without bounds (PartScan.computed: usdtpatch.analysis.computed makes the functions its
entries land in all-targets). The table base may be set far from the jump: every definition
of the base register that reaches the jump (a search over the part's control flow) must be
the same `lea T(%rip)` (or a copy of it, or it plus a constant). The base an entry is added
to may be another label than the table (`lea fn(%rip)`): entries are read at the table and
added to the base.

Other indirect jumps are classified by where the register's value comes from, on every path
(`_origin`): a pointer loaded from memory without a table index (`jmp *0x10(%rax)`,
`mov 0x10(%rsi),%rax; jmp *%rax`, a C++ member-function pointer), a function-pointer argument,
a call's return value, or a `lea` of code outside the function are tail calls; a `lea` of a
label inside the function is a computed goto (the label becomes a target); anything else is
not understood and makes the function all-targets.

The ways in from the rest of the file (branches of other functions and sections, addresses
taken by `lea`, relocations and data words that hold an address inside the function) come
from one file-wide index (usdtpatch.analysis.waysin, `CodeContext.ways_in`), checked against the
disassembly of the code that holds them and merged into the function's targets.

Each function is disassembled once (usdtpatch.x86.decode.sweep), and each sweep is cached.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from usdtpatch.analysis.functions import FunctionBounds, function_bounds, symbols_inside
from usdtpatch.analysis.index import Recent
from usdtpatch.analysis.waysin import (
    ADDRESS_TAKEN,
    BRANCH_REL8,
    BRANCH_REL32,
    CODE_KINDS,
    PLACE_RELATIVE,
    REL_TABLE,
    WayIn,
    WaysIn,
)
from usdtpatch.analysis.waysin import (
    LANDING_PAD as WAYSIN_LANDING_PAD,
)
from usdtpatch.analysis.waysin import XBEGIN as XBEGIN_WAY
from usdtpatch.elf.cfi import CfiError, CfiIndex, parse_lsda
from usdtpatch.elf.ehframe import foreign_personality
from usdtpatch.elf.image import ET_DYN, PF_X, SHT_PROGBITS, ElfImage
from usdtpatch.elf.model import fixed_places, place_overlapping
from usdtpatch.elf.relocs import relative_relocations
from usdtpatch.elf.symbols import SymbolTable
from usdtpatch.x86.decode import CodeInsn, Flow, Sweep, sweep
from usdtpatch.x86.nops import decode_nop, nop_run_length
from usdtpatch.x86.regs import CALLER_SAVED, IMPLICIT_WRITES, alias, sized

if TYPE_CHECKING:  # observed.py reads the windows, which read this module
    from usdtpatch.analysis.observed import PcObservers

MAX_TABLE_ENTRIES = 4096  # entries read from a table without established bounds
MAX_BOUNDED_ENTRIES = 1 << 16  # the largest count a bounds check or value range establishes
MAX_COLD_PARTS = 8  # related parts followed per function
MAX_FUNCTION_BYTES = 1 << 20  # a function larger than this is not disassembled
LOOKBACK = 16  # instructions examined before an indirect jump

# Kinds of target, as shown by `show` and the JSON report.
ENTRY = "entry"
SYMBOL = "symbol"
JUMP = "jump"
CALL_TARGET = "call-target"
RETURN_SITE = "return-site"
LANDING_PAD = WAYSIN_LANDING_PAD  # one name for both: the function's own and other LSDAs'
JUMP_TABLE = "jump-table"
COLD_JUMP = "jump-from-other-part"
RSEQ_ABORT = "rseq-abort"


@dataclass(frozen=True, slots=True)
class JumpTable:
    jump: int  # address of the indirect jmp
    table: int  # address of the table
    entry_size: int  # 4 (relative) or 8 (absolute)
    entries: int
    bounded: bool  # True when the count came from a cmp/ja guard or the index's value range
    targets: tuple[int, ...]
    base: int = 0  # what a 4-byte entry is relative to (the table itself, or another label)


@dataclass(frozen=True, slots=True)
class Target:
    address: int
    kind: str
    source: int | None  # the instruction (or table, or LSDA) that makes it a target
    what: str = ""  # a SYMBOL: the symbol, named (SymbolTable.describe_label)


@dataclass(frozen=True, slots=True)
class FunctionCode:
    """One function's disassembly and branch targets (the analysis unit of `check`)."""

    bounds: FunctionBounds
    insns: tuple[CodeInsn, ...]
    starts: tuple[int, ...]  # insns' addresses, sorted
    targets: dict[int, Target] = field(repr=False)
    all_targets: str | None  # why every instruction boundary counts as a target, or None
    jump_tables: tuple[JumpTable, ...]
    bad: tuple[int, ...]
    padding_after: int = 0  # NOP/int3 bytes between the end and the next function (unused code)
    incoming: dict[int, tuple[Target, ...]] = field(default_factory=dict, repr=False)
    # every way each target is reached (targets keeps the first, for display)
    padding_before: int = 0  # NOP/int3 bytes between the previous function and the start
    memo: dict[str, frozenset[int] | tuple[int, ...]] = field(default_factory=dict, repr=False,
                                                               compare=False)
    # (start, end, what) of each loader relocation whose place lies in code, sorted (the
    # file's usdtpatch.elf.model.fixed_places: text relocations): no window may hold one
    fixed: Sequence[tuple[int, int, str]] = ()
    # [lo, hi) of the NOPs after the last jmp/ret of each function symbol up to 160 bytes
    # before the start, where no FDE covers them (crtstuff's frame_dummy and
    # __do_global_dtors_aux padded to the next one's alignment): only a short window's entry
    # stub goes there (analysis/windows.py)
    tails_before: tuple[tuple[int, int], ...] = ()

    def fixed_in(self, start: int, end: int) -> str | None:
        """The relocation whose place overlaps [start, end), described, or None."""
        return place_overlapping(self.fixed, start, end)

    def in_table(self, address: int) -> JumpTable | None:
        """The recognized jump table whose entries hold `address`, or None."""
        for t in self.jump_tables:
            if t.entry_size and t.table <= address < t.table + t.entries * t.entry_size:
                return t
        return None

    def reached(self) -> frozenset[int]:
        """The instruction addresses that decoding from the function's ways in reaches:
        its start, its other symbols, landing pads, jump-table entries and every other
        target (the file-wide ways in included), following fall-through and direct jumps,
        stopping at an unconditional jmp, ret, or a stopping instruction (ud2, hlt, int3).
        A call falls through (its return site is reached). Computed once per function."""
        got = self.memo.get("reached")
        if isinstance(got, frozenset):
            return got
        out = reach(self.insns, self.starts, self.targets)
        self.memo["reached"] = out
        return out

    def targets_between(self, lo: int, hi: int) -> list[int]:
        """Addresses of the explicit targets in the open interval (lo, hi), sorted, including
        targets that are not instruction boundaries (a jump into an instruction). The targets
        are sorted once per function (each site asked: probes x targets, issue 46 class 8)."""
        got = self.memo.get("sorted")
        if not isinstance(got, tuple):
            got = self.memo["sorted"] = tuple(sorted(self.targets))
        return list(got[bisect_right(got, lo):bisect_left(got, hi)])

    def index_of(self, address: int) -> int | None:
        i = bisect_left(self.starts, address)
        if i < len(self.starts) and self.starts[i] == address:
            return i
        return None

    def index_covering(self, address: int) -> int | None:
        """Index of the instruction whose bytes hold `address`."""
        i = bisect_left(self.starts, address + 1) - 1
        if i >= 0 and self.insns[i].address <= address < self.insns[i].end:
            return i
        return None

    def target(self, address: int) -> Target | None:
        """The target at `address` (every boundary when all-targets), or None."""
        t = self.targets.get(address)
        if t is not None:
            return t
        if self.all_targets is not None and self.index_of(address) is not None:
            return Target(address, "unknown-indirect", None)
        return None

    def is_target(self, address: int) -> bool:
        return self.target(address) is not None


def reach(insns: tuple[CodeInsn, ...], starts: tuple[int, ...],
          entries: Iterable[int]) -> frozenset[int]:
    """The addresses of `insns` (`starts`: theirs, sorted) that decoding from `entries`
    reaches, following fall-through and direct jumps (FunctionCode.reached)."""
    seen: set[int] = set()
    work = [k for a in entries if (k := _index(starts, a)) is not None]
    stops = (Flow.JMP, Flow.RET, Flow.STOP, Flow.JMP_INDIRECT)
    while work:
        k = work.pop()
        while k < len(insns) and insns[k].address not in seen:
            ins = insns[k]
            seen.add(ins.address)
            if ins.flow in (Flow.JMP, Flow.JCC) and ins.target is not None:
                j = _index(starts, ins.target)
                if j is not None:
                    work.append(j)
            if ins.flow in stops:
                break
            k += 1
    return frozenset(seen)


def _index(starts: tuple[int, ...], address: int) -> int | None:
    i = bisect_left(starts, address)
    return i if i < len(starts) and starts[i] == address else None


class CodeContext:
    """The shared, read-only inputs of the analysis and its memo of sweeps (one per run)."""

    def __init__(self, image: ElfImage, cfi: CfiIndex, symbols: SymbolTable,
                 rseq_aborts: Iterable[int] = ()) -> None:
        self.image = image
        self.cfi = cfi
        self.symbols = symbols
        self.mode64 = image.is64
        self.rseq_aborts = tuple(rseq_aborts)
        # memos of the latest functions only (index.Recent: the sites come in address order;
        # `show` works out again what was forgotten); the bounds of every site are kept
        self._sweeps: dict[tuple[int, int], Sweep] = Recent()
        self._functions: dict[int, FunctionCode] = Recent()
        self._parts: dict[tuple[int, int], PartScan] = Recent()
        self._bounds: dict[int, FunctionBounds | None] = {}
        self._fde_users: dict[int, int] = {}  # the sites in _bounds held by each kept FDE
        self._reached: dict[int, tuple[PartScan, frozenset[int]]] = Recent()
        self.tables: dict[tuple[int, int, int, int | None, int, int], tuple[int, ...] | str] = \
            Recent()
        self._relative: dict[int, int] | None = None
        # every way into the code around the probes from the whole file (check() builds it
        # once; usdtpatch.analysis.waysin); None: only the function's own analysis
        self.ways_in: WaysIn | None = None
        # who observes a moved instruction's pc (check() finds them once; analysis/observed.py)
        self.observers: PcObservers | None = None
        # address -> (source, what) of the rip-relative loads of the code around the probes
        # (waysin.code_loads: code read as data; check() finds them once)
        self.code_loads: dict[int, tuple[int, str]] = {}
        # every call of the C library's syscall() and what it does, found once per context
        # (analysis/hazards.fork_evidence: check asks, then the fork guard's questions)
        self.syscall_calls: list[tuple[int, tuple[str, str]]] | None = None

    def sweep(self, start: int, end: int) -> Sweep:
        key = (start, end)
        got = self._sweeps.get(key)
        if got is None:
            code = self.image.read_vaddr(start, end - start)
            got = sweep(code, start, self.mode64)
            if len(code) < end - start:
                got = Sweep(start, end, got.insns, (*got.bad, start + len(code)))
            self._sweeps[key] = got
        return got

    def bounds(self, address: int) -> FunctionBounds | None:
        if address in self._bounds:
            return self._bounds[address]
        try:
            got = function_bounds(address, self.cfi, self.symbols)
        except CfiError:
            got = None
        self._bounds[address] = got
        if got is not None and got.fde is not None:
            self.cfi.keep(got.fde)  # held here for the run: the site's later questions
            self._fde_users[got.fde.address] = self._fde_users.get(got.fde.address, 0) + 1
        return got

    def forget_site(self, address: int) -> None:
        """Let go of what is kept for the site at `address` (its function's bounds, and its
        FDE once no other kept site's bounds hold it): a walk that has passed the site asks
        no more of it (rewrite's plan: issue 38); asked again, it is worked out again."""
        got = self._bounds.pop(address, None)
        if got is None or got.fde is None:
            return
        users = self._fde_users.pop(got.fde.address, 1) - 1
        if users > 0:
            self._fde_users[got.fde.address] = users
        else:
            self.cfi.forget(got.fde)

    def function(self, bounds: FunctionBounds) -> FunctionCode:
        got = self._functions.get(bounds.start)
        if got is None or got.bounds != bounds:
            got = analyze_function(self, bounds)
            self._functions[bounds.start] = got
        return got

    def part(self, bounds: FunctionBounds) -> PartScan:
        key = (bounds.start, bounds.end)
        got = self._parts.get(key)
        if got is None:
            got = scan_part(self, bounds)
            self._parts[key] = got
        return got

    def decoded_as_code(self, address: int, size: int) -> bool:
        """True when every byte of [address, address + size) lies in an instruction that
        decoding the function holding it reaches from the ways in its own code and LSDA
        name (its entry, symbols, jumps, return sites, jump tables, landing pads: `reach`):
        bytes that are code, not data. False when no function holds them."""
        bounds = self.bounds(address)
        if bounds is None or bounds.size > MAX_FUNCTION_BYTES or \
                not bounds.contains(address + size - 1):
            return False
        part = self.part(bounds)
        got = self._reached.get(bounds.start)
        if got is None or got[0] is not part:
            ins = part.sweep.insns
            # from what its code names: a symbol that is no function's (a label, an object)
            # is a way in for a window, but no proof that code starts there (a table's name)
            got = (part, reach(ins, tuple(i.address for i in ins),
                               (t.address for t in part.targets if t.kind != SYMBOL
                                or _function_symbol_at(self.symbols, t.address))))
            self._reached[bounds.start] = got
        insns, seen = part.sweep.insns, got[1]
        at = address
        while at < address + size:
            i = bisect_left(insns, at + 1, key=lambda x: x.address) - 1
            if i < 0 or not insns[i].address <= at < insns[i].end or \
                    insns[i].address not in seen:
                return False
            at = insns[i].end
        return True

    def executable(self, address: int) -> bool:
        seg = self.image.load_segment_for(address)
        return seg is not None and bool(seg.flags & PF_X)

    def relative_relocs(self) -> dict[int, int]:
        """R_X86_64_RELATIVE relocations: place -> addend (what a PIE table entry will hold)."""
        if self._relative is None:
            self._relative = relative_relocations(self.image)
        return self._relative

    def read_pointer(self, address: int) -> int | None:
        raw = self.image.read_vaddr(address, 8)
        if len(raw) < 8:
            return None
        val: int = struct.unpack(self.image.byteorder + "Q", raw)[0]
        if val == 0:
            return self.relative_relocs().get(address)
        return val

    def read_int32(self, address: int) -> int | None:
        raw = self.image.read_vaddr(address, 4)
        if len(raw) < 4:
            return None
        val: int = struct.unpack(self.image.byteorder + "i", raw)[0]
        return val


@dataclass(frozen=True, slots=True)
class PartScan:
    """What one function part's own code says about control flow (not yet bounded)."""

    sweep: Sweep
    targets: tuple[Target, ...]  # every target its code names, anywhere
    outside: tuple[tuple[int, bool], ...]  # (target, conditional) of jumps leaving the part
    tables: tuple[JumpTable, ...]
    unresolved: tuple[str, ...]
    # (jump, base or None, why) of each jump to a computed address whose targets are not
    # established: usdtpatch.analysis.computed makes the base's function all-targets
    computed: tuple[tuple[int, int | None, str], ...] = ()


def scan_part(ctx: CodeContext, bounds: FunctionBounds) -> PartScan:
    """Disassemble one part once and collect the targets its own code and LSDA name."""
    sw = ctx.sweep(bounds.start, bounds.end)
    insns = sw.insns
    targets: list[Target] = [Target(bounds.start, ENTRY, None)]
    targets.extend(Target(a, SYMBOL, None, ctx.symbols.describe_label(a))
                   for a in _entries_inside(ctx.symbols, bounds.start, bounds.end))
    outside: list[tuple[int, bool]] = []
    unresolved: list[str] = []
    tables: list[JumpTable] = []
    computed: list[tuple[int, int | None, str]] = []
    fde = bounds.fde  # landing pads first: the kind `show` names when a pad is also a return site
    foreign = foreign_personality(ctx.image, fde.cie) if fde is not None else None
    if fde is not None and fde.lsda is not None and foreign is not None:
        unresolved.append(f"its LSDA at {fde.lsda:#x} is read by {foreign}, not known to "
                          f"use GCC's format")
    elif fde is not None and fde.lsda is not None:
        try:
            for lp in parse_lsda(ctx.image, fde.lsda, fde.pc_begin).landing_pads:
                targets.append(Target(lp, LANDING_PAD, fde.lsda))
        except CfiError as exc:
            unresolved.append(f"its LSDA at {fde.lsda:#x} does not parse: {exc}")
    graph: _Graph | None = None
    falls_through = Flow.NONE
    for k, ins in enumerate(insns):
        fl = ins.flow
        if fl is falls_through:
            continue  # most instructions: nothing to collect
        if fl in (Flow.JMP, Flow.JCC) and ins.target is not None:
            targets.append(Target(ins.target, JUMP, ins.address))
            if not bounds.contains(ins.target):
                outside.append((ins.target, fl is Flow.JCC))
        elif fl is Flow.CALL:
            if ins.target is not None and bounds.contains(ins.target):
                targets.append(Target(ins.target, CALL_TARGET, ins.address))
            targets.append(Target(ins.end, RETURN_SITE, ins.address))
        elif fl is Flow.CALL_INDIRECT:
            targets.append(Target(ins.end, RETURN_SITE, ins.address))
        elif fl is Flow.JMP_INDIRECT:
            if graph is None:
                graph = _Graph(insns, {t.address for t in targets
                                       if t.kind in (ENTRY, SYMBOL, LANDING_PAD)})
            verdict, comp = _jump_verdict(ctx, bounds, insns, k, graph)
            if comp is not None:
                computed.append(comp)
            if isinstance(verdict, JumpTable):
                if not any(t.table == verdict.table and t.targets == verdict.targets
                           for t in tables):  # ceval: 229 jumps share one table
                    targets.extend(Target(t, JUMP_TABLE, verdict.table)
                                   for t in verdict.targets)
                tables.append(verdict)
            elif verdict:
                unresolved.append(verdict)
    if sw.bad:
        unresolved.insert(0, f"bytes at {sw.bad[0]:#x} do not decode")
    return PartScan(sweep=sw, targets=tuple(targets), outside=tuple(outside), tables=tuple(tables),
                    unresolved=tuple(unresolved), computed=tuple(computed))


def _function_symbol_at(symbols: SymbolTable, address: int) -> bool:
    got = symbols.lookup(address)
    return got is not None and got[1] == 0


def _entries_inside(symbols: SymbolTable, start: int, end: int) -> list[int]:
    """The addresses strictly inside (start, end) that a symbol names, of any type: a function
    symbol, an entry label of hand-written assembly (NOTYPE or OBJECT, local or exported: it
    may be called, jumped to or broken at: issue 46), a section's start."""
    return sorted({*symbols_inside(symbols, start, end),
                   *symbols.labels_inside(start, end)})


def _jump_verdict(ctx: CodeContext, bounds: FunctionBounds, insns: tuple[CodeInsn, ...],
                  k: int, graph: _Graph
                  ) -> tuple[JumpTable | str | None, tuple[int, int | None, str] | None]:
    """The indirect jump at `k`: its verdict (`_indirect`), and (jump, base or None, why)
    when it jumps to a computed address whose targets are not established (PartScan.computed)."""
    at = insns[k].address
    verdict = _indirect(ctx, bounds, insns, k, graph)
    if isinstance(verdict, str):
        # a path that only a call which never returns (musl's _exit) seemed to open may have
        # hidden the table's base: once more without those paths
        cut = _noreturn_calls(ctx, insns)
        if cut:
            again = _indirect(ctx, bounds, insns, k, _Graph(graph.insns, graph.entries, cut))
            verdict = again if isinstance(again, JumpTable) else verdict
    if isinstance(verdict, JumpTable) and verdict.entry_size == 4 and not verdict.bounded:
        return verdict, (at, verdict.base, f"the relative jump table at {verdict.table:#x} of "
                         f"the jump at {at:#x} has no bounds check")
    if isinstance(verdict, str):
        why = _computed(graph, k)
        if why is not None:
            return verdict, (at, why[0], f"{why[1]} (the jump at {at:#x})")
    return verdict, None


def scan_jumps(ctx: CodeContext, bounds: FunctionBounds
               ) -> tuple[list[JumpTable], list[tuple[int, int | None, str]]]:
    """What `scan_part` says of the part's indirect jumps (PartScan.tables and .computed),
    without collecting its other targets: the file-wide pass over computed jumps
    (usdtpatch.analysis.computed) reads every function holding one and needs only these.
    The same verdicts (`_jump_verdict`, on the same control-flow graph)."""
    insns = ctx.sweep(bounds.start, bounds.end).insns
    jumps = [k for k, ins in enumerate(insns) if ins.flow is Flow.JMP_INDIRECT]
    tables: list[JumpTable] = []
    computed: list[tuple[int, int | None, str]] = []
    if not jumps:
        return tables, computed
    entries = {bounds.start, *_entries_inside(ctx.symbols, bounds.start, bounds.end)}
    fde = bounds.fde
    if fde is not None and fde.lsda is not None and \
            foreign_personality(ctx.image, fde.cie) is None:
        with suppress(CfiError):  # scan_part says so (unresolved); then no pad is an entry
            entries.update(parse_lsda(ctx.image, fde.lsda, fde.pc_begin).landing_pads)
    graph = _Graph(insns, entries)
    for k in jumps:
        verdict, comp = _jump_verdict(ctx, bounds, insns, k, graph)
        if comp is not None:
            computed.append(comp)
        if isinstance(verdict, JumpTable):
            tables.append(verdict)
    return tables, computed


def _related_order(ctx: CodeContext, outside: tuple[tuple[int, bool], ...]) -> list[int]:
    """Outside jump targets, most likely split-off parts first: conditional jumps, then parts
    without a symbol or with a `.cold` one, then the rest (tail calls)."""
    ranked: list[tuple[int, int]] = []
    for t, cond in outside:
        sym = ctx.symbols.lookup(t)
        name = sym[0].name if sym is not None else ""
        rank = 0 if cond else (1 if not name or ".cold" in name or sym is None or sym[1]
                               else 2)
        ranked.append((rank, t))
    return [t for _r, t in sorted(ranked)]


def analyze_function(ctx: CodeContext, bounds: FunctionBounds) -> FunctionCode:
    """Disassemble `bounds` once and collect every branch target inside it.

    Targets come from the function's own code and LSDA, from the rseq abort handlers, and from
    the code and LSDA of related parts (other FDEs its jumps lead to, e.g. GCC's `.cold`
    partitions), since those jump back into it.
    """
    if bounds.size > MAX_FUNCTION_BYTES:
        return FunctionCode(bounds=bounds, insns=(), starts=(), targets={},
                            all_targets=f"function of {bounds.size} bytes is larger than "
                                        f"{MAX_FUNCTION_BYTES} and was not disassembled",
                            jump_tables=(), bad=())
    own = ctx.part(bounds)
    insns = own.sweep.insns
    starts = tuple(i.address for i in insns)
    targets: dict[int, Target] = {}
    incoming: dict[int, list[Target]] = {}

    def add(t: Target) -> None:
        if bounds.contains(t.address):
            if t.address not in targets:
                targets[t.address] = t
            incoming.setdefault(t.address, []).append(t)

    for t in own.targets:
        add(t)
    for a in ctx.rseq_aborts:
        add(Target(a, RSEQ_ABORT, None))
    unresolved = list(own.unresolved)
    known_tables = {t.table for t in own.tables if t.entry_size == 4}
    followed = 0
    seen: set[int] = {bounds.start}
    for t_addr in _related_order(ctx, own.outside):
        if followed >= MAX_COLD_PARTS:
            break
        other = ctx.bounds(t_addr)
        if other is None or other.start in seen or other.size > MAX_FUNCTION_BYTES:
            continue
        seen.add(other.start)
        followed += 1
        scan = ctx.part(other)
        known_tables.update(t.table for t in scan.tables if t.entry_size == 4)
        for t in scan.targets:
            if t.kind in (JUMP, JUMP_TABLE, LANDING_PAD):
                add(Target(t.address, COLD_JUMP if t.kind == JUMP else t.kind, t.source))
        unresolved.extend(f"in the related part at {other.start:#x}: {u}"
                          for u in scan.unresolved)
    if ctx.ways_in is not None:
        for addr, ways in ctx.ways_in.between(bounds.start, bounds.end):
            known = {k.source for k in incoming.get(addr, ())}
            for w in ways:
                way = _way_in(ctx, bounds, own, w, known_tables)
                if way is not None and way.source not in known:
                    known.add(way.source)
                    add(way)
        why = ctx.ways_in.poisoned.get(bounds.start) or ctx.ways_in.everywhere
        if why is not None:
            unresolved.append(why)
    all_targets = unresolved[0] if unresolved else None
    after, before = _padding_after(ctx, bounds), _padding_before(ctx, bounds)
    return FunctionCode(bounds=bounds, insns=insns, starts=starts, targets=targets,
                        all_targets=all_targets, jump_tables=own.tables, bad=own.sweep.bad,
                        padding_after=after, incoming={a: tuple(v) for a, v in incoming.items()},
                        padding_before=before, fixed=fixed_places(ctx.image),
                        tails_before=_tails_before(ctx, bounds))


def _way_in(ctx: CodeContext, bounds: FunctionBounds, own: PartScan, w: WayIn,
            known_tables: set[int]) -> Target | None:
    """The file-wide index's way in `w` as a target of the function, or None when it is not
    one: a branch of the function itself (its own disassembly has it), bytes that the linear
    disassembly of the code holding them shows to be part of another instruction, an
    entry of one of the function's recognized jump tables (a JUMP_TABLE target already:
    `known_tables` are the 4-byte tables of the function and its related parts, read there
    with their bounds), or the "entry" of a relative table in code whose bytes decoding
    the function holding them reaches as instructions (`decoded_as_code`)."""
    if w.kind == REL_TABLE and (w.base in known_tables or (
            ctx.executable(w.source) and ctx.decoded_as_code(w.source, 4))):
        return None  # the function's own table, or code bytes: no table entry
    if w.kind == PLACE_RELATIVE and w.base and not _is_boundary(own.sweep, w.target):
        return None  # a word that names it only with an addend: where an instruction starts
    if w.kind not in CODE_KINDS:
        for tb in own.tables:
            if tb.entry_size == 8 and tb.table <= w.source < tb.table + 8 * tb.entries:
                return None
            if w.kind == PLACE_RELATIVE and tb.entry_size == 4 and \
                    tb.table <= w.source < tb.table + 4 * tb.entries:
                return None  # its table's entry (at its base: also A + W): a JUMP_TABLE
        return Target(w.target, w.kind, w.source)
    if bounds.contains(w.source):
        if w.kind != ADDRESS_TAKEN:
            return None
        sw = own.sweep
    else:
        other = ctx.bounds(w.source)
        if other is None or other.size > MAX_FUNCTION_BYTES:
            return Target(w.target, w.kind, w.source)  # code of no known function: kept
        sw = ctx.sweep(other.start, other.end)
    i = bisect_left(sw.insns, w.source + 1, key=lambda x: x.address) - 1
    ins = sw.insns[i] if i >= 0 else None
    if ins is None or not ins.address <= w.source < ins.end:
        return Target(w.target, w.kind, w.source) if sw.bad else None
    if w.kind == ADDRESS_TAKEN:
        return Target(w.target, w.kind, ins.address) if ins.rip_target == w.target else None
    if ins.target != w.target or ins.flow not in (Flow.JMP, Flow.JCC, Flow.CALL):
        return None
    return Target(w.target, w.kind if w.kind in (BRANCH_REL8, XBEGIN_WAY) else BRANCH_REL32,
                  ins.address)


def _padding_after(ctx: CodeContext, bounds: FunctionBounds) -> int:
    """Bytes of alignment padding (NOPs, int3, zeros) after the function, before the next one.

    The next function starts at the next FDE start or function symbol, whichever comes first;
    no branch lands in the padding, so a window may end inside it after an unconditional
    jump or return.
    """
    nxt = [a for a in (ctx.cfi.next_start_after(bounds.end - 1),
                       _next_symbol_at_or_after(ctx.symbols, bounds.end)) if a is not None]
    if not nxt:
        return 0
    gap = min(nxt) - bounds.end
    if gap <= 0 or gap > 64:
        return 0
    named = first_named(ctx, bounds, bounds.end, bounds.end + gap)
    if named is not None:
        gap = named - bounds.end  # the bytes up to the first one something names
        if gap <= 0:
            return 0
    raw = ctx.image.read_vaddr(bounds.end, gap)
    if len(raw) < gap:
        return 0
    if all(b in (0xCC, 0x00) for b in raw) or nop_run_length(raw) == gap:
        return gap
    return 0


def _padding_before(ctx: CodeContext, bounds: FunctionBounds) -> int:
    """Bytes of alignment padding (NOPs, int3, zeros) between the end of the previous FDE's
    function and `bounds.start`, with no symbol in them (unused code, like `_padding_after`);
    0 when there is no previous FDE or the gap holds anything else."""
    starts = ctx.cfi.starts
    i = bisect_left(starts, bounds.start) - 1
    if i < 0:
        return 0
    try:
        prev = ctx.cfi.fde_at(i)
    except CfiError:
        return 0
    gap = bounds.start - prev.pc_end
    if gap <= 0 or gap > 64 or symbols_inside(ctx.symbols, prev.pc_end - 1, bounds.start) or \
            first_named(ctx, bounds, prev.pc_end, bounds.start) is not None:
        return 0
    raw = ctx.image.read_vaddr(prev.pc_end, gap)
    if len(raw) < gap:
        return 0
    if all(b in (0xCC, 0x00) for b in raw) or nop_run_length(raw) == gap:
        return gap
    return 0


def _tails_before(ctx: CodeContext, bounds: FunctionBounds) -> tuple[tuple[int, int], ...]:
    """[lo, hi) of the NOPs (or int3) that follow the last `jmp`/`ret` of the code decoded
    from each function symbol in the 160 bytes before `bounds.start` up to the next symbol,
    where no FDE covers them: alignment padding after a function the unwind tables do not
    describe, which no one runs (as `_padding_before` is after an FDE's end). A symbol whose
    code does not decode to exactly the next symbol gives none."""
    addrs = ctx.symbols.addresses
    lo_i = bisect_left(addrs, bounds.start - 160)
    hi_i = bisect_left(addrs, bounds.start)
    out: list[tuple[int, int]] = []
    for k in range(lo_i, hi_i):
        p, q = addrs[k], addrs[k + 1] if k + 1 < hi_i else bounds.start
        if q <= p or q - p > 160:
            continue
        sw = ctx.sweep(p, q)
        if sw.bad or not sw.insns or sw.insns[-1].end != q:
            continue
        raw = ctx.image.read_vaddr(p, q - p)
        n = len(sw.insns)
        while n > 0:
            ins = sw.insns[n - 1]
            piece = raw[ins.address - p: ins.end - p]
            if piece != b"\xcc" and decode_nop(piece) is None:
                break
            n -= 1
        if n in (0, len(sw.insns)) or sw.insns[n - 1].flow not in _NO_FALL:
            continue
        lo = sw.insns[n].address
        try:
            described = ctx.cfi.lookup(lo) is not None or ctx.cfi.lookup(q - 1) is not None
        except CfiError:  # an FDE there that does not parse: not a tail no one describes
            continue
        if not described and first_named(ctx, bounds, lo, q) is None:
            out.append((lo, q))
    return tuple(out)


def first_named(ctx: CodeContext, bounds: FunctionBounds, lo: int, hi: int) -> int | None:
    """The lowest address in [lo, hi) that something names (issue 46, class 5: such bytes
    are no unused padding, and no stub goes there): a symbol of any type, a section's start,
    a way in of the file-wide index (a branch, a relocation, a data or place-relative word:
    `__patchable_function_entries` names a patchable entry's NOP sled before a function),
    an address a place-relative word names, a relocation's place; None when nothing does.
    A branch or `lea` of the index counts where decoding the code holding it shows it
    (`_way_in`, asked as of the function `bounds` the padding is next to)."""
    got: list[int] = []
    labels = ctx.symbols.labels_inside(lo - 1, hi)
    funcs = symbols_inside(ctx.symbols, lo - 1, hi)
    got.extend(labels[:1] + funcs[:1])
    got.extend(s.addr for s in ctx.image.sections
               if s.allocated and s.size and lo <= s.addr < hi)
    if ctx.ways_in is not None:
        own = ctx.part(bounds)
        got.extend(a for a, ways in ctx.ways_in.between(lo, hi)
                   if any(_way_in(ctx, bounds, own, w, set()) is not None for w in ways))
        got.extend(a for a in ctx.ways_in.named if lo <= a < hi)
    places = fixed_places(ctx.image)
    k = bisect_left(places, (lo,))
    got.extend(p[0] for p in places[max(0, k - 1):k + 1] if p[0] < hi and p[1] > lo)
    return max(lo, min(got)) if got else None


def _next_symbol_at_or_after(symbols: SymbolTable, address: int) -> int | None:
    i = bisect_left(symbols.addresses, address)
    return symbols.addresses[i] if i < len(symbols.addresses) else None


def _regs_alias(reg: str) -> str:
    """The 64-bit name of a general register (eax, ax, al -> rax; r8d, r8w, r8b -> r8)."""
    return alias(reg)


_NO_FALL = (Flow.JMP, Flow.RET, Flow.STOP, Flow.JMP_INDIRECT)
_TAKEN_BOUNDS = ("jbe", "jb")  # taken to the table when the index is in range


def _lookback(insns: tuple[CodeInsn, ...], k: int, g: _Graph) -> tuple[CodeInsn, ...]:
    """The instructions before the jump at `k` that its table's analysis reads: the straight
    line before it, or, where the jump's block is reached only by the taken branch of one
    `jbe`/`jb` (`cmp $5,%ecx; jbe L` ... `L: lea T(%rip)...; jmp *%rax`: PostgreSQL's
    switches), the instructions up to that branch followed by the block."""
    lo = max(0, k - LOOKBACK)
    b = k
    while b > lo and insns[b - 1].flow not in _NO_FALL:
        b -= 1
    if b in (lo, 0):
        return insns[lo:k]
    while b < k and insns[b].base_mnemonic.startswith("nop") and \
            insns[b].address not in g.direct:
        b += 1  # alignment padding before the block
    preds = g.direct.get(insns[b].address, [])
    if len(preds) != 1 or insns[preds[0]].flow is not Flow.JCC or \
            insns[preds[0]].base_mnemonic not in _TAKEN_BOUNDS or \
            insns[b].address in g.entries:
        return insns[lo:k]
    p = preds[0]
    room = max(0, LOOKBACK - (k - b))
    return insns[max(0, p + 1 - room):p + 1] + insns[b:k]


def _dest(ins: CodeInsn) -> str | None:
    ops = ins.operands
    if len(ops) >= 2 and ops[-1].startswith("%"):
        return _regs_alias(ops[-1])
    return None


def _indirect(ctx: CodeContext, bounds: FunctionBounds, insns: tuple[CodeInsn, ...],
              k: int, g: _Graph) -> JumpTable | str | None:
    """A resolved table, None for a tail call, or the reason the jump is not understood."""
    jmp = insns[k]
    mem = jmp.mem
    lo = max(0, k - LOOKBACK)
    prev = insns[lo:k]
    checked = _lookback(insns, k, g)  # where the index's bounds check is looked for
    if mem is not None:
        if mem.index is None:
            return None  # jmp *X(%rip), jmp *0x10(%rax): a tail call through a pointer
        if mem.base is None and mem.scale == 8:  # jmp *T(,%rI,8): absolute table
            return _table(ctx, bounds, jmp, mem.disp, 8, mem.disp, checked, _regs_alias(mem.index))
        if mem.base is not None and mem.scale == 8:
            base = _find_lea(g, k, _regs_alias(mem.base))
            if base is not None:
                return _table(ctx, bounds, jmp, base, 8, base, checked, _regs_alias(mem.index))
            loaded = _loaded_code_pointers(ctx, bounds, insns, jmp)
            if loaded is not None:
                return loaded
        return f"indirect jump {jmp.text} at {jmp.address:#x} is not understood"
    reg = _regs_alias(jmp.op_str.lstrip("*"))
    # Walk back to the instruction that defines `reg`.
    for j in range(len(prev) - 1, -1, -1):
        ins = prev[j]
        if ins.flow is not Flow.NONE:
            break
        if not may_write(ins, reg):
            continue
        mn = ins.base_mnemonic
        added = _added_registers(ins, reg)
        for based, entry_reg in added:
            base = _find_lea(g, lo + j, based)
            found = _find_load(prev[:j], entry_reg, 4)
            if base is not None and found is not None:
                load, at = found
                assert load.mem is not None
                table = _find_lea(g, lo + at, _regs_alias(load.mem.base)) \
                    if load.mem.base else load.mem.disp if load.mem.disp else None
                if table is not None and load.mem.index is None:
                    table += load.mem.disp  # one entry, at a fixed place
                if table is not None:
                    idx = load.mem.index
                    return _table(ctx, bounds, jmp, table, 4, base, checked,
                                  _regs_alias(idx) if idx else None)
        if added:
            break
        if mn.startswith("mov") and ins.mem is not None:
            m = ins.mem
            if m.index is None:
                return None  # a function pointer loaded from memory: a tail call
            if m.scale == 8 and m.base is None:
                return _table(ctx, bounds, jmp, m.disp, 8, m.disp, checked, _regs_alias(m.index))
            if m.scale == 8 and m.base is not None:
                table = _find_lea(g, lo + j, _regs_alias(m.base))
                if table is not None:
                    return _table(ctx, bounds, jmp, table, 8, table, checked, _regs_alias(m.index))
                loaded = _loaded_code_pointers(ctx, bounds, insns, jmp)
                if loaded is not None:
                    return loaded
            if m.scale == 4 and m.base is not None:  # movslq (%rB,%rI,4),%rX; jmp *%rX ?
                break
        break
    origin = _origin(g, k, reg, bounds)
    if isinstance(origin, tuple):
        if not origin:
            return None  # a tail call through a function pointer
        return JumpTable(jump=jmp.address, table=0, entry_size=0,  # goto *&&label
                         entries=len(origin), bounded=True, targets=origin)
    return f"indirect jump {jmp.text} at {jmp.address:#x} is not understood ({origin})"


def _added_registers(ins: CodeInsn, reg: str) -> list[tuple[str, str]]:
    """(base, entry) register pairs, as 64-bit names, when `ins` sets `reg` to the sum of
    two registers: `add %rB,%reg` (the entry in `reg`), `lea (%rA,%rC,1),%reg` (either one
    the base); [] for anything else."""
    ops = ins.operands
    if ins.base_mnemonic.startswith("add") and len(ops) == 2 and ops[0].startswith("%"):
        return [(_regs_alias(ops[0]), reg)]
    m = ins.mem
    if ins.base_mnemonic.startswith("lea") and m is not None and m.disp == 0 and \
            m.scale == 1 and m.base is not None and m.index is not None:
        a, c = _regs_alias(m.base), _regs_alias(m.index)
        return [(a, c), (c, a)]
    return []


def _loaded_code_pointers(ctx: CodeContext, bounds: FunctionBounds,
                          insns: tuple[CodeInsn, ...], jmp: CodeInsn) -> JumpTable | None:
    """The targets of an indirect jump to a 64-bit value loaded from an indexed table whose
    base the analysis cannot follow (spilled to the stack, say), in a position-independent
    file: there every absolute code address held in data is put there by the loader, through
    an R_X86_64_RELATIVE relocation, or by code that computed it with a rip-relative `lea`.
    So the jump can land on any relocation addend or `lea` target inside the function, and
    nowhere else in it: they become targets (an unbounded table of unknown place, which no
    rewrite edits). None in an executable, whose data holds such addresses without
    relocations."""
    if ctx.image.type != ET_DYN:
        return None
    labels = {a for a in ctx.relative_relocs().values() if bounds.contains(a)}
    labels |= {i.rip_target for i in insns if i.rip_target is not None
               and i.base_mnemonic.startswith("lea") and bounds.contains(i.rip_target)}
    return JumpTable(jump=jmp.address, table=0, entry_size=0, entries=len(labels), bounded=False,
                     targets=tuple(sorted(labels)))


ARG_REGS = frozenset({"rdi", "rsi", "rdx", "rcx", "r8", "r9"})


def _origin(g: _Graph, at: int, reg: str, bounds: FunctionBounds,
            depth: int = 0) -> tuple[int, ...] | str:
    """Where the value `reg` holds before instruction `at` comes from, over every path.

    A tuple of code addresses inside the function (`lea L(%rip),%reg`: a computed goto) --
    empty when every origin is a function pointer (a tail call): loaded from memory without a
    table index, an argument register, a call's return value, or a `lea` of code outside the
    function. A string says what is not understood.
    """
    defs = _reaching_defs(g, at, reg)
    if defs is None:
        return "too many paths"
    labels: set[int] = set()
    for kind, p in defs:
        if kind == "entry":
            if reg not in ARG_REGS:
                return f"%{reg} is not set on a path from the function entry"
            continue
        if kind == "call":
            if reg != "rax":
                return f"%{reg} is clobbered by the call at {g.insns[p].address:#x}"
            continue  # the called function returned the pointer
        ins = g.insns[p]
        mn = ins.base_mnemonic
        cp = _copies(ins)
        if cp is not None and cp[1] == reg and depth < 4:
            sub = _origin(g, p, cp[0], bounds, depth + 1)
            if isinstance(sub, str):
                return sub
            labels.update(sub)
        elif mn.startswith("lea") and ins.rip_target is not None:
            if bounds.contains(ins.rip_target):
                labels.add(ins.rip_target)
        elif mn.startswith("mov") and ins.mem is not None and (
                ins.mem.index is None or ins.mem.scale in (1, 2)):
            continue  # a pointer loaded from a structure or vtable slot
        else:
            return f"{ins.text} at {ins.address:#x} computes it"
    return tuple(sorted(labels))


def _reaching_defs(g: _Graph, at: int, reg: str) -> list[tuple[str, int]] | None:
    """Every definition of `reg` reaching instruction `at`: ("def", index), ("call", index) for
    a call clobbering a caller-saved register, ("entry", -1) for the value at entry."""
    out: list[tuple[str, int]] = []
    seen: set[int] = set()
    work = [at]
    steps = 0
    while work:
        m = work.pop()
        steps += 1
        if steps > MAX_REACHING_STEPS:
            return None
        preds, outside = g.preds(m)
        if outside and ("entry", -1) not in out:
            out.append(("entry", -1))
        for p in preds:
            if p in seen:
                continue
            seen.add(p)
            ins = g.insns[p]
            if may_write(ins, reg):
                out.append(("def", p))
            elif ins.flow in (Flow.CALL, Flow.CALL_INDIRECT) and reg in CALLER_SAVED:
                out.append(("call", p))
            else:
                work.append(p)
    return out


_WRITES: dict[tuple[str, str, str, str], bool] = {}  # what may_write_text said, by its input
_MAX_WRITES = 1 << 16


def may_write(ins: CodeInsn, reg: str) -> bool:
    """`may_write_text(ins, reg)`, kept by what it reads (the mnemonic, its base and the
    operands' text: the reaching-definition searches ask the same few hundred thousand
    questions of the same few thousand instruction texts)."""
    key = (ins.mnemonic, ins.base_mnemonic, ins.op_str, reg)
    got = _WRITES.get(key)
    if got is None:
        got = may_write_text(ins, reg)
        if len(_WRITES) < _MAX_WRITES:
            _WRITES[key] = got
    return got


def may_write_text(ins: CodeInsn, reg: str) -> bool:
    """Conservatively, whether `ins` may write the 64-bit register `reg` (from its text)."""
    base = ins.base_mnemonic
    ops = ins.operands
    if base in IMPLICIT_WRITES.get(reg, ()):
        return True
    if reg in ("rax", "rdx") and base in sized("imul") and len(ops) == 1:
        return True
    if reg == "rcx" and ins.mnemonic.startswith("rep"):
        return True
    if base.startswith(("cmp", "test", "bt", "push", "jmp", "call")) and base not in sized(
            "cmpxchg", "btc", "btr", "bts"):
        return False
    if base.startswith("xchg") and any(o.startswith("%") and _regs_alias(o) == reg
                                       for o in ops):
        return True
    return bool(ops) and ops[-1].startswith("%") and _regs_alias(ops[-1]) == reg


MAX_REACHING_STEPS = 20000


class _Graph:
    """Predecessors of each instruction of one part, for a reaching-definition search."""

    def __init__(self, insns: tuple[CodeInsn, ...], entries: set[int],
                 noreturn: frozenset[int] = frozenset()) -> None:
        self.insns = insns
        self.entries = entries  # addresses reached from outside: entry, symbols, landing pads
        self.noreturn = noreturn  # indices of calls that never return: no fall-through
        self.direct: dict[int, list[int]] = {}
        self.indirect: list[int] = []
        # labels whose address the part takes (`lea L(%rip)`): what a computed goto reaches
        self.taken: set[int] = set()
        direct, jmp, jcc, indirect = self.direct, Flow.JMP, Flow.JCC, Flow.JMP_INDIRECT
        for k, (_a, _n, _m, _o, flow, target, _mem, rip, base) in enumerate(insns):
            if (flow is jmp or flow is jcc) and target is not None:
                got = direct.get(target)
                if got is None:
                    direct[target] = [k]
                else:
                    got.append(k)
            elif flow is indirect:
                self.indirect.append(k)
            if rip is not None and base.startswith("lea"):
                self.taken.add(rip)

    def preds(self, m: int) -> tuple[list[int], bool]:
        """(predecessor indices, whether control also arrives from outside the part)."""
        ins = self.insns[m]
        out: list[int] = []
        if m > 0 and self.insns[m - 1].flow not in (Flow.JMP, Flow.RET, Flow.STOP,
                                                     Flow.JMP_INDIRECT) \
                and m - 1 not in self.noreturn:
            out.append(m - 1)
        out.extend(self.direct.get(ins.address, ()))
        if not out and m > 0 and (not ins.base_mnemonic.startswith("nop")
                                  or ins.address in self.taken):
            # a label reached only through a table or computed goto; not the alignment NOPs
            # after an unconditional jump, which no one reaches (libruby: the padding after
            # a `jmp *%rax` dispatch made the argument tail-called at the next instruction
            # look computed by that dispatch's arithmetic, and every function poisoned)
            out.extend(self.indirect)
        return out, m == 0 or ins.address in self.entries


def _noreturn_calls(ctx: CodeContext, insns: tuple[CodeInsn, ...]) -> frozenset[int]:
    """Indices of the direct calls in `insns` whose callee never returns to its caller: its
    code, decoded whole from its entry to its end, has no `ret`, no indirect jump, no jump
    out of itself and does not run past its end (musl's `_exit`: exit_group, then exit in a
    loop). The instruction after such a call is reached only by a jump to it."""
    out: set[int] = set()
    verdicts: dict[int, bool] = {}
    for k, ins in enumerate(insns):
        if ins.flow is not Flow.CALL or ins.target is None:
            continue
        if ins.target not in verdicts:
            verdicts[ins.target] = never_returns(ctx, ins.target)
        if verdicts[ins.target]:
            out.add(k)
    return frozenset(out)


def never_returns(ctx: CodeContext, entry: int, depth: int = 0) -> bool:
    """Whether the function at `entry` never returns (_noreturn_calls): its last instruction
    a `jmp` back into it, an instruction that stops, or a call of such a function (musl's
    `_exit` calls `_Exit`); three calls deep at most."""
    b = ctx.bounds(entry)
    if b is None or b.start != entry or b.size > 4096:
        return False
    sw = ctx.sweep(b.start, b.end)
    if sw.bad or not sw.insns:
        return False
    for ins in sw.insns:
        if ins.flow in (Flow.RET, Flow.JMP_INDIRECT):
            return False
        if ins.flow in (Flow.JMP, Flow.JCC) and (ins.target is None
                                                  or not b.contains(ins.target)):
            return False
    last = sw.insns[-1]
    if last.flow is Flow.CALL and last.target is not None and depth < 3:
        return never_returns(ctx, last.target, depth + 1)
    return last.flow in (Flow.JMP, Flow.STOP)


def _reaching_lea(g: _Graph, at: int, reg: str, depth: int = 0) -> int | None:
    """T when every definition of `reg` that reaches instruction `at` is `lea T(%rip),%reg`,
    or a copy of such a register, or such a register plus or minus a constant (`add $k`)."""
    defs = _reaching_defs(g, at, reg)
    if not defs:
        return None
    found: set[int | None] = set()
    for kind, p in defs:
        ins = g.insns[p] if kind == "def" else None
        if ins is None:
            return None
        cp = _copies(ins)
        ops = ins.operands
        if ins.base_mnemonic.startswith("lea") and ins.rip_target is not None:
            found.add(ins.rip_target)
        elif cp is not None and cp[1] == reg and depth < 4:
            found.add(_reaching_lea(g, p, cp[0], depth + 1))
        elif (ins.base_mnemonic.startswith(("add", "sub")) and len(ops) == 2
              and ops[0].startswith("$") and depth < 4):
            k = _immediate(ops[0])
            t = _reaching_lea(g, p, reg, depth + 1)
            if k is None or t is None:
                return None
            found.add(t + k if ins.base_mnemonic.startswith("add") else t - k)
        else:
            return None
    if len(found) == 1:
        (only,) = found
        return only
    return None


def _find_lea(g: _Graph, at: int, reg: str) -> int | None:
    """The table address `reg` holds just before instruction `at`: every definition reaching
    it (along the part's control flow) is the same `lea T(%rip),%reg`."""
    return _reaching_lea(g, at, reg)


def _find_load(prev: tuple[CodeInsn, ...], reg: str,
               scale: int) -> tuple[CodeInsn, int] | None:
    """The indexed load that last defines `reg` in `prev`, and its index there; with 4-byte
    entries also a sign-extending load without an index (`movslq d(%rB)`: one entry)."""
    for j in range(len(prev) - 1, -1, -1):
        ins = prev[j]
        if _dest(ins) == reg:
            m = ins.mem
            if m is not None and m.scale == scale and m.index is not None:
                return ins, j
            if m is not None and m.index is None and scale == 4 and m.base is not None \
                    and ins.base_mnemonic.startswith("movslq"):
                return ins, j
            return None
    return None


def _immediate(op: str) -> int | None:
    try:
        return int(op[1:], 0)
    except ValueError:
        return None


def _guard(prev: tuple[CodeInsn, ...], index: str | None) -> tuple[int, int] | None:
    """(entries, guard address) from the closest `cmp $N,%r` + `ja`/`jae` (or `and $2^k-1`)
    on the table's index before the jump (or a `cmp $N,M` + `ja` on the memory the index is
    then loaded from), else from the index's value range: set last by a zero extension of a
    byte or a word (`movzbl`, `movzwl`: 256 or 65536 entries)."""
    got = _bounds_check(prev, index)
    if got is not None or index is None:
        return got
    for j in range(len(prev) - 1, -1, -1):
        ins = prev[j]
        if _dest(ins) == index:
            if ins.base_mnemonic.startswith("movzb"):
                return 256, ins.address
            if ins.base_mnemonic.startswith("movzw"):
                return 65536, ins.address
            if ins.base_mnemonic.startswith(("bsf", "tzcnt", "lzcnt", "popcnt")):
                wide = 64 if _regs_alias(ins.operands[-1]) == ins.operands[-1].lstrip("%") \
                    else 32  # a bit index: 0..63 (bsf) or 0..64 (a count)
                return wide + (0 if ins.base_mnemonic.startswith("bsf") else 1), ins.address
            return None
    return None


def _loaded_after(between: tuple[CodeInsn, ...], place: str, index: str) -> bool:
    """True when `index` is loaded from the memory operand `place` in `between` (the
    instructions after a compare of `place`) by its last definition there, with no store
    or call before it."""
    for ins in between:
        if ins.mem is not None and ins.mem.index is not None \
                and _regs_alias(ins.mem.index) == index:
            return False  # the table load came first
        ops = ins.operands
        if _dest(ins) == index:
            return (ins.base_mnemonic.startswith("mov") and len(ops) == 2
                    and ops[0] == place)
        if ins.flow is not Flow.NONE or (ops and ins.mem is not None
                                         and not ops[-1].startswith("%")):
            return False  # a store or a call may change the compared memory
    return False


def _bounds_check(prev: tuple[CodeInsn, ...], index: str | None) -> tuple[int, int] | None:
    for j in range(len(prev) - 1, -1, -1):
        ins = prev[j]
        ops = ins.operands
        if (ins.base_mnemonic.startswith("and") and len(ops) == 2 and ops[0].startswith("$")
                and index is not None and _same_value(prev[:j], prev[j + 1:], ops[1], index)):
            try:
                mask = int(ops[0][1:], 0)
            except ValueError:
                return None
            if 0 <= mask < MAX_BOUNDED_ENTRIES and (mask + 1) & mask == 0:
                return mask + 1, ins.address  # `and $2^k-1,%idx`: 2^k entries
            return None
        if ins.flow is Flow.JCC and (ins.base_mnemonic in ("ja", "jae") or (
                ins.base_mnemonic in _TAKEN_BOUNDS and j + 1 < len(prev)
                and prev[j + 1].address != ins.end)):
            # falling through a `ja`/`jae`, or taken by a `jbe`/`jb` (_lookback puts the
            # branch right before its target's block): the index is in range; a `jbe`/`jb`
            # fallen through leaves it out of range, and bounds nothing
            c = j - 1
            while c >= 0 and _keeps_flags(prev[c]):
                c -= 1  # (a mov between the compare and the jump leaves the flags)
            if c < 0:
                return None
            cmp = prev[c]
            ops = cmp.operands
            if c < j - 1 and not all(_stores_elsewhere(i, cmp) for i in prev[c + 1:j]):
                return None
            if cmp.base_mnemonic.startswith("cmp") and len(ops) == 2 and ops[0].startswith("$"):
                try:
                    n = int(ops[0][1:], 0)
                except ValueError:
                    return None
                if n < 0 or n >= MAX_BOUNDED_ENTRIES:
                    return None
                if index is not None and not ops[1].startswith("%") and cmp.mem is not None:
                    if not _loaded_after(prev[j + 1:], ops[1], index):
                        return None
                elif index is not None and not _same_value(prev[:c], prev[c + 1:],
                                                           ops[1], index):
                    return None  # the compare is about another register: not this table's
                count = n + 1 if ins.base_mnemonic in ("ja", "jbe") else n
                return count, cmp.address
            return None
    return None


def _keeps_flags(ins: CodeInsn) -> bool:
    """No mov or lea sets the flags."""
    return ins.flow is Flow.NONE and ins.base_mnemonic.startswith(("mov", "lea"))


def _stores_elsewhere(ins: CodeInsn, cmp: CodeInsn) -> bool:
    """True when `ins` (between a compare and its jump) writes a register, or memory that
    cannot be what `cmp` compared (the same base register, 8 or more bytes away)."""
    ops = ins.operands
    if not ops or ops[-1].startswith("%") or ins.mem is None:
        return True
    m, c = ins.mem, cmp.mem
    if c is None:
        return True  # a register compare: memory does not matter
    frame = ("rsp", "rbp")
    if m.base in frame and c.base not in frame and c.base is not None:
        return True  # a store to the stack frame: not the compared object (assumed)
    return m.base == c.base and m.index is None and c.index is None and \
        abs(m.disp - c.disp) >= 8


def _is_boundary(sw: Sweep, address: int) -> bool:
    i = bisect_left(sw.insns, address, key=lambda x: x.address)
    return i < len(sw.insns) and sw.insns[i].address == address


def _copies(ins: CodeInsn) -> tuple[str, str] | None:
    """(source, destination) of a register-to-register mov, as 64-bit names."""
    ops = ins.operands
    if (ins.base_mnemonic.startswith("mov") and len(ops) == 2 and ops[0].startswith("%")
            and ops[1].startswith("%")):
        return _regs_alias(ops[0]), _regs_alias(ops[1])
    return None


def _same_value(before: tuple[CodeInsn, ...], between: tuple[CodeInsn, ...], compared: str,
                index: str) -> bool:
    """True when `index` holds the compared register's value at the table load: the same
    register, or a register-to-register copy of it made before the compare (and not
    overwritten) or after it."""
    if not compared.startswith("%"):
        return False
    reg = _regs_alias(compared)
    # registers equal to each other when the compare runs (straight-line copies before it)
    same: dict[str, set[str]] = {}
    for ins in before:
        cp = _copies(ins)
        for r in [r for r in same if may_write(ins, r)]:
            same.pop(r).discard(r)
        if cp is not None:
            g = same.setdefault(cp[0], {cp[0]})
            g.add(cp[1])
            same[cp[1]] = g
    holders = set(same.get(reg, {reg})) | {reg}
    for ins in between:
        if ins.mem is not None and ins.mem.index is not None \
                and _regs_alias(ins.mem.index) == index:
            break  # the table load: what the index holds here is what counts
        cp = _copies(ins)
        if cp is not None and cp[0] in holders:
            holders.add(cp[1])
            continue
        holders = {r for r in holders if not may_write(ins, r)}
    return index in holders


def _table(ctx: CodeContext, bounds: FunctionBounds, jmp: CodeInsn, table: int, size: int,
           base: int, prev: tuple[CodeInsn, ...], index: str | None) -> JumpTable | str:
    """The table of `size`-byte entries at `table` (relative to `base` when 4 bytes) that the
    jump `jmp` uses with the register `index` (None: one entry, at a fixed place)."""
    guard = _guard(prev, index) if index is not None else (1, jmp.address)
    limit = guard[0] if guard else MAX_TABLE_ENTRIES
    key = (table, size, base, guard[0] if guard else None, bounds.start, bounds.end)
    got = ctx.tables.get(key)
    if got is None:
        got = _read_table(ctx, bounds, table, size, base, limit, guard is not None)
        ctx.tables[key] = got
    if isinstance(got, str):
        return f"{got} (from {jmp.address:#x})"
    return JumpTable(jump=jmp.address, table=table, entry_size=size, entries=len(got),
                     bounded=guard is not None, targets=got, base=base)


def _read_table(ctx: CodeContext, bounds: FunctionBounds, table: int, size: int, base: int,
                limit: int, guarded: bool) -> tuple[int, ...] | str:
    """The entries of one table (read once per run: many jumps share a table)."""
    guard = guarded
    sec = ctx.image.section_for_vaddr(table)
    if sec is None or sec.type != SHT_PROGBITS:
        return f"jump table at {table:#x} is not in the file's data"
    sw = ctx.sweep(bounds.start, bounds.end)
    targets: list[int] = []
    for i in range(limit):
        addr = table + i * size
        if size == 4:
            v = ctx.read_int32(addr)
            t = None if v is None else (base + v) & 0xFFFFFFFFFFFFFFFF
        else:
            t = ctx.read_pointer(addr)
        if t is None:
            if guard:
                return f"jump table at {table:#x} entry {i} is unreadable"
            break
        if not guard and not (bounds.contains(t) or ctx.executable(t)):
            break  # past the table: the entry points at no code
        if not guard and bounds.contains(t) and not _is_boundary(sw, t):
            break  # past the table: no case label is inside an instruction
        targets.append(t)
    if not targets:
        return f"jump table at {table:#x} has no entry in the function"
    return tuple(targets)


# what may compute a jump's target from another value (a `lea` of a label is an address taken)
_ARITHMETIC = ("add", "sub", "adc", "sbb", "inc", "dec", "neg", "not", "or", "and", "xor",
               "shl", "shr", "sar", "sal", "rol", "ror", "imul", "lea", "bts", "btr", "btc")


def _computed(g: _Graph, k: int) -> tuple[int | None, str] | None:
    """(base or None, why) when the register the jump at `k` goes to may hold an address
    computed by arithmetic (a relative table's base plus its entry, a label plus an
    offset), on some path; None when every value it holds is loaded, returned, passed in or
    copied as it is (a taken address: the ways-in index collects those) or no register jump."""
    jmp = g.insns[k]
    if jmp.mem is not None or not jmp.op_str.lstrip("*").startswith("%"):
        return None
    return _computed_value(g, k, _regs_alias(jmp.op_str.lstrip("*")), 0, k)


def _self_relative(g: _Graph, p: int, reg: str, ops: list[str]) -> bool:
    """True when instruction `p` is `add %rB,%reg` and `reg` is then an int32 loaded by the
    only definition reaching `p`, from `(%rB,%rI,4)`: base plus entry of a relative table."""
    if not (g.insns[p].base_mnemonic.startswith("add") and len(ops) == 2
            and ops[0].startswith("%")):
        return False
    defs = _reaching_defs(g, p, reg)
    if not defs or len(defs) != 1 or defs[0][0] != "def":
        return False
    load = g.insns[defs[0][1]]
    m = load.mem
    return load.base_mnemonic.startswith("movslq") and m is not None and m.scale == 4 and \
        m.base is not None and _regs_alias(m.base) == _regs_alias(ops[0])


def _loaded(g: _Graph, at: int, reg: str) -> bool:
    """True when every definition of `reg` reaching `at` loads it from memory (not rip-
    relative: not a table of this file) or zeroes it."""
    defs = _reaching_defs(g, at, reg)
    if not defs:
        return False
    for kind, p in defs:
        ins = g.insns[p]
        ops = ins.operands
        if kind != "def" or len(ops) != 2:
            return False
        zero = ins.base_mnemonic.startswith("xor") and ops[0] == ops[1]
        load = ins.base_mnemonic.startswith("mov") and ins.mem is not None and \
            ins.rip_target is None and ops[1].startswith("%")
        if not (zero or load):
            return False
    return True


def _demangles(ins: CodeInsn, reg: str) -> bool:
    """`xor %fs:0x30,%reg` or `ror`/`rol $0x11,%reg`: a step of glibc's pointer (de)mangling
    (the pointer guard in the thread control block)."""
    ops = ins.operands
    if len(ops) != 2 or not ops[1].startswith("%") or _regs_alias(ops[1]) != reg:
        return False
    mn = ins.base_mnemonic
    return (mn.startswith("xor") and ops[0].startswith("%fs:")) or \
        (mn.startswith(("ror", "rol")) and ops[0] == "$0x11")


def _feeds_other_jump(g: _Graph, p: int, reg: str, k: int) -> bool:
    """True when the value instruction `p` gives `reg` is first jumped to by another
    indirect jump than `k` (a table dispatch whose target is reached from it: there `reg`
    holds that jump's target, which that jump's own analysis bounds or poisons)."""
    for q in range(p + 1, min(len(g.insns), p + LOOKBACK)):
        ins = g.insns[q]
        if ins.flow is Flow.JMP_INDIRECT:
            return q != k and ins.mem is None and \
                _regs_alias(ins.op_str.lstrip("*")) == reg
        if ins.flow is not Flow.NONE or may_write(ins, reg):
            return False
    return False


def _computed_value(g: _Graph, at: int, reg: str, depth: int,
                    k: int) -> tuple[int | None, str] | None:
    defs = _reaching_defs(g, at, reg)
    if defs is None:
        return None, f"the value of %{reg} comes along too many paths to follow"
    for kind, p in defs:
        if kind != "def":
            continue
        ins = g.insns[p]
        mn = ins.base_mnemonic
        ops = ins.operands
        cp = _copies(ins)
        if cp is None and mn.startswith("cmov") and len(ops) == 2 and ops[0].startswith("%"):
            cp = (_regs_alias(ops[0]), _regs_alias(ops[1]))
        if cp is not None and cp[1] == reg:
            if depth < 4:
                sub = _computed_value(g, p, cp[0], depth + 1, k)
                if sub is not None:
                    return sub
            continue
        if mn.startswith("xor") and len(ops) == 2 and ops[0] == ops[1]:
            continue  # zero
        if mn.startswith("lea") and ins.rip_target is not None:
            continue  # a label's address, taken as it is
        if _demangles(ins, reg) or (mn.startswith("add") and len(ops) == 2 and
                                    ins.mem is not None and not ops[0].startswith(("%", "$"))
                                    and ins.rip_target is None and _loaded(g, p, reg)):
            # a loaded value plus a loaded value: a load bias plus a symbol's value (the
            # dynamic linker's l_addr + st_value), a symbol: a taken address
            # glibc's PTR_DEMANGLE (ror $0x11; xor %fs:0x30): a pointer stored mangled
            # comes back as it was taken; what it was made from decides
            if depth < 4:
                sub = _computed_value(g, p, reg, depth + 1, k)
                if sub is not None:
                    return sub
            continue
        if not mn.startswith(_ARITHMETIC) or _feeds_other_jump(g, p, reg, k):
            continue  # loaded, popped, an immediate: a taken address
        sources = [reg] if not mn.startswith("lea") else []
        sources += [_regs_alias(o) for o in ops[:-1] if o.startswith("%")]
        if ins.mem is not None and mn.startswith("lea"):
            sources += [_regs_alias(r) for r in (ins.mem.base, ins.mem.index) if r]
        base = next((b for r in sources if (b := _reaching_lea(g, p, r)) is not None), None)
        if base is None and _self_relative(g, p, reg, ops):
            # a PIC switch whose table address is not followed (a loop around it, say):
            # its entries are relative to the table and land in the jump's function
            return g.insns[0].address, (f"{ins.text} at {ins.address:#x} adds a relative "
                                        f"table's entry to its address, which is not known")
        return base, f"{ins.text} at {ins.address:#x} computes the target"
    return None
