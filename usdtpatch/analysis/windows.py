"""Patch windows: where a probe site that the kernel will not optimize can be given a nop5.

Reference: docs/usdt-format.md ("The code around a 1-byte probe"). A window is
a run of whole instructions [start, end) of one function that holds the probe instruction and
is at least 5 bytes long, with no branch target strictly inside it (one at `start` is fine)
unless every way to reach it can be aimed at the detour's copy. Three shapes, tried in this
order:

1. IN_PLACE: the probe and the bytes after it are NOPs (NOP padding, `nop; nop5`, DTrace -G's
   five 1-byte nops, a hint or DS-prefixed NOP): write the canonical nop5 over
   [probe, probe + 5) and single-byte nops up to `end`. Nothing moves; no run-time cost.
2. FORWARD: start at the probe and take the instructions after it until 5 bytes are covered.
3. BACKWARD: start at an instruction before the probe, and extend past the probe only as far as
   needed; the window with the fewest relocated bytes wins.

For FORWARD and BACKWARD the rewriter writes `jmp rel32` to a detour at `start`, fills
[start + 5, end) with int3, and puts the relocated instructions in the detour (the probe
instruction replaced by the new probe form) followed by `jmp end`: two extra jumps per pass.

Each shape is tried in rounds, the later ones only when the earlier ones find no window:
1. no `call` in the window, no target strictly inside it reached from outside;
2. a `call` may be inside (`calls`): the rewriter moves it (it returns into the detour, whose
   FDE and LSDA describe it) or emulates it (docs/rewrite.md, "Windows that hold a call");
3. targets strictly inside may be reached from outside (`retargets`), when every way to reach
   them can be aimed at the detour's copy: a direct `jmp`/`jcc`/`call` with a 32-bit
   displacement (patched), a `jmp`/`jcc` with an 8-bit one (patched to a `jmp rel32` stub written
   into the alignment padding after the function, or before it, when it is in reach), or an
   entry of a recognized jump table (rewritten);
4. as 3, and the `jmp rel32` stub of an 8-bit jump may also lie inside the function (`same_row`
   given): in the window's own int3 filler [start + 5, end) (the window grows until one fits)
   or in a run of unused NOPs/int3 inside the function that no way in reaches, where the
   `.eh_frame` row is the row at the target (the stub runs in the state the jump leaves,
   which is the target's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from usdtpatch.analysis.rules import optimized_where_it_is
from usdtpatch.analysis.targets import (
    CALL_TARGET,
    COLD_JUMP,
    JUMP,
    JUMP_TABLE,
    RETURN_SITE,
    FunctionCode,
    Target,
)
from usdtpatch.analysis.waysin import (
    ADDRESS_TAKEN,
    BRANCH_REL8,
    BRANCH_REL32,
    CODE_WORD,
    DATA_WORD,
    LANDING_PAD,
    PLACE_RELATIVE,
    REL_TABLE,
    RELOCATION,
    XBEGIN,
)
from usdtpatch.analysis.waysin import AFTER as WAYS_AFTER
from usdtpatch.analysis.waysin import BEFORE as WAYS_BEFORE
from usdtpatch.findings import (
    PROBE_NOT_CODE,
    PROBE_NOT_DECODED,
    SITE_CROSSES_PAGE,
    WINDOW_ALL_TARGETS,
    WINDOW_BRANCH_TARGET,
    WINDOW_CALL,
    WINDOW_FUNCTION_END,
    WINDOW_NO_PADDING,
    WINDOW_TEXT_RELOCATION,
)
from usdtpatch.x86.decode import CodeInsn, Flow
from usdtpatch.x86.nops import NOP1, NOP5, decode_nop

JMP_REL32_SIZE = 5  # e9 rel32: jmp to the detour
JMP_REL8_SIZE = 2  # eb rel8: a short window's jump to its entry stub
MAX_BACKWARD_INSNS = 8  # instructions before the probe a backward window may start at
MAX_WINDOW = 64  # bytes: a window never grows beyond this


# How a branch into the window is aimed at the detour's copy of its target (Retarget.how).
REL32 = "rel32"  # a direct jmp/jcc/call with a 32-bit displacement: the displacement is patched
REL8_STUB = "rel8-stub"  # a jmp/jcc rel8: aimed at a `jmp rel32` stub in the padding
TABLE4 = "table4"  # a relative 4-byte jump-table entry (target = base + entry)
TABLE8 = "table8"  # an absolute 8-byte jump-table entry (or its R_X86_64_RELATIVE addend)
STUB_SIZE = 5


@dataclass(frozen=True, slots=True)
class Retarget:
    """One way into the window from outside, to aim at the detour's copy of `target`.

    `source` is the branch instruction's address (REL32, REL8_STUB; the rewriter reads its
    bytes and checks the encoding again), or the table entry's address (TABLE4, TABLE8).
    `base` is what a TABLE4 entry is added to; `stub` the address of the REL8_STUB's
    `jmp rel32` (in the unused padding after the function); `kind` the target kind.
    """

    target: int
    source: int
    how: str
    kind: str
    base: int = 0
    stub: int | None = None


class WindowShape(Enum):
    IN_PLACE = "in-place"
    FORWARD = "forward"
    BACKWARD = "backward"
    RELAID = "re-laid"  # the window's instructions re-encoded where they are (analysis/relay.py)


@dataclass(frozen=True, slots=True)
class PatchWindow:
    """Where and how one probe site can be rewritten so that the kernel optimizes it.

    Fields, for a rewriter:
    - `start`, `end`: link-time addresses of the window [start, end); whole instructions of one
      function; `end - start >= 5` (FORWARD/BACKWARD) or the NOP run rewritten (IN_PLACE).
      Exception: when the function ends with `ret`/`jmp` before 5 bytes, `end` may lie inside
      the unused alignment padding after it (`padding_bytes` > 0, `end_reason` says so):
      `insns` and `code` then stop at the function's end, `padding_bytes` before `end`; the
      padding is overwritten (jmp + int3) but never relocated (no one executes it).
    - `insns`: the instructions in [start, end), in order, as decoded (address, size, mnemonic,
      op_str, flow, rip_target). `code` holds their original bytes (`code[i.address - start:
      i.end - start]` is instruction i; `len(code) == end - start - padding_bytes`). For a
      detour, relocate exactly these; replace the one at `probe_address` (`probe_length`
      bytes) with the new probe form.
    - `probe_address`, `probe_offset` (= probe_address - start), `probe_length`: the probe
      instruction inside the window; after a detour the note's pc must point at its copy.
      It is a NOP for every site sys/sdt.h or usdt.h emits; if a hand-written note points at
      another instruction, keep that instruction and put the new probe form before it.
    - `shape`: IN_PLACE (write `replacement` at `start`; no detour), FORWARD or BACKWARD (write
      `jmp rel32` at `start`, int3 over [start + 5, end), detour = relocated `insns` + `jmp end`).
    - `replacement`: for IN_PLACE, the bytes to write over [start, end) (nop5, then 1-byte
      nops); None otherwise.
    - `relocated_bytes`: bytes moved to a detour (0 in place); the optimization criterion.
    - `extra_jumps`: run-time cost per pass when not traced (0 in place, 2 with a detour).
    - `start_reason`, `end_reason`: why the window starts and ends where it does (shown by
      `show`); `targets_at_start`: branch targets at `start` (allowed there: the jmp lands them
      on the detour).
    - `internal_targets`: branch targets strictly inside the window that are reached only by
      direct jumps that are themselves inside it. Relocating the window as one block (iced's
      BlockEncoder does) makes those jumps land on the relocated copies: the rewriter must
      relocate `insns` together and keep intra-window branches pointing inside the detour.
    - `function_start`, `function_end`: bounds of the containing function (or part).
    """

    shape: WindowShape
    start: int
    end: int
    probe_address: int
    probe_length: int
    insns: tuple[CodeInsn, ...]
    code: bytes
    replacement: bytes | None
    relocated_bytes: int
    extra_jumps: int
    start_reason: str
    end_reason: str
    targets_at_start: tuple[Target, ...]
    internal_targets: tuple[int, ...]
    function_start: int
    function_end: int
    padding_bytes: int = 0  # bytes of unused padding after the function at the window's end
    calls: tuple[int, ...] = ()  # addresses of the `call`s inside the window (moved along)
    retargets: tuple[Retarget, ...] = ()  # ways in from outside to aim at the detour's copy
    # a window of 2 to 4 bytes: `jmp rel8` at `start` to a `jmp rel32` stub here, to the detour
    entry_stub: int | None = None

    @property
    def probe_offset(self) -> int:
        return self.probe_address - self.start

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class WindowResult:
    """The best window, or why there is none (`code` is a finding code)."""

    window: PatchWindow | None
    code: str | None  # e.g. "window-branch-target" when blocked
    reason: str  # the blocking detail, or a one-line description of the window
    tried: tuple[str, ...]  # what each shape said, for `show` and the JSON report
    # the window a detour would use, when `window` is a re-laid one (analysis/relay.py): the
    # rewrite falls back to it when the re-laid bytes fail verification
    fallback: PatchWindow | None = None

    @property
    def base(self) -> PatchWindow | None:
        """The window find_window chose (the detour's), whether or not it was re-laid."""
        return self.fallback if self.fallback is not None else self.window


class _Blocked(Exception):
    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _describe_target(t: Target) -> str:
    src = f" from {t.source:#x}" if t.source is not None else ""
    return f"{t.kind}{src}"


# (finding code, why) of an instruction that must not move (analysis/observed.py), or None
Pinned = Callable[[CodeInsn], "tuple[str, str] | None"]
# whether the `.eh_frame` row in force at the first address is the one at the second (both in
# one FDE; False when either has no row or the rows cannot be read): analysis/check.py
SameRow = Callable[[int, int], bool]


def find_window(fc: FunctionCode, probe_address: int, code: bytes,
                pinned: Pinned | None = None, same_row: SameRow | None = None
                ) -> WindowResult:
    """The best patch window for the probe instruction at `probe_address` in function `fc`.

    `code` is the function's bytes (fc.bounds.start .. fc.bounds.end), used for the window's
    `code` and for recognizing NOP padding. `pinned` says why an instruction must not move
    (a system call, a fault a signal handler recognises by its pc: analysis/observed.py):
    no window that moves holds one. `same_row`, when given, allows a last round whose 8-bit
    jumps' stubs may lie inside the function where the unwind row matches.
    """
    i = fc.index_of(probe_address)
    if i is None:
        covering = fc.index_covering(probe_address)
        why = ("it is inside the instruction at "
               f"{fc.insns[covering].address:#x}") if covering is not None else "no instruction"
        return WindowResult(None, PROBE_NOT_DECODED.code,
                            f"the probe at {probe_address:#x} is not an instruction boundary of "
                            f"the function's linear disassembly ({why})", ())
    not_code = _not_code(fc, probe_address)
    if not_code is not None:
        return WindowResult(None, PROBE_NOT_CODE.code, not_code, ())
    tried: list[str] = []
    try:
        w = _in_place(fc, i, code)
        return WindowResult(w, None, f"in place: nop5 over [{w.start:#x}, {w.end:#x})",
                            ("in-place: ok",))
    except _Blocked as b:
        b.with_traceback(None)  # no cycle through the frames that raised it
        tried.append(f"in-place: {b.reason}")
    first: tuple[_Blocked | None, _Blocked | None] | None = None
    modes = [_Mode(False, False, pinned), _Mode(True, False, pinned), _Mode(True, True, pinned)]
    if same_row is not None:
        modes.append(_Mode(True, True, pinned, same_row))
    for mode in modes:
        forward_block: _Blocked | None = None
        try:
            w = _forward(fc, i, code, mode)
            return WindowResult(w, None, f"forward: {w.relocated_bytes} bytes relocated"
                                + mode.describe(w), (*tried, "forward: ok"))
        except _Blocked as b:
            forward_block = b.with_traceback(None)  # kept: no cycle through this frame
            if first is None:
                tried.append(f"forward: {b.reason}")
        try:
            w = _backward(fc, i, code, mode)
            return WindowResult(w, None, f"backward: {w.relocated_bytes} bytes relocated"
                                + mode.describe(w), (*tried, "backward: ok"))
        except _Blocked as b:
            b.with_traceback(None)
            if first is None:
                tried.append(f"backward: {b.reason}")
                first = (forward_block, b.with_traceback(None))
            else:
                fwd = forward_block.reason if forward_block is not None else "-"
                tried.append(f"{mode.name}: forward: {fwd}; backward: {b.reason}")
    if same_row is not None:
        try:
            w = _short(fc, i, code, _Mode(True, True, pinned, same_row))
            return WindowResult(w, None, f"short: {w.end_reason}", (*tried, "short: ok"))
        except _Blocked as b:
            b.with_traceback(None)
            tried.append(f"short: {b.reason}")
    assert first is not None
    primary = first[0] if first[0] is not None else first[1]
    assert primary is not None
    if fc.all_targets is not None:
        return WindowResult(None, WINDOW_ALL_TARGETS.code,
                            f"every instruction counts as a branch target: {fc.all_targets}",
                            tuple(tried))
    return WindowResult(None, primary.code, "; ".join(tried[1:]), tuple(tried))


def _not_code(fc: FunctionCode, pc: int) -> str | None:
    """Why the probe at `pc` (an instruction boundary of the linear disassembly) is not code
    (None: it is): inside a recognized jump table, or reached by no path from the function's
    ways in (FunctionCode.reached; in an all-targets function every boundary counts)."""
    table = fc.in_table(pc)
    if table is not None:
        return (f"the probe at {pc:#x} lies inside the jump table at {table.table:#x} "
                f"({table.entries} entries of {table.entry_size} bytes, used by the jump at "
                f"{table.jump:#x}): it is data")
    if fc.all_targets is None and pc not in fc.reached():
        # (in a function whose indirect jumps are not all understood, every boundary counts
        # as reached, as it counts as a target)
        return (f"the probe at {pc:#x} is reached by no path from the function's start, "
                f"symbols, landing pads, jump tables or any way in: data or padding in the "
                f"code")
    return None


@dataclass(frozen=True, slots=True)
class _Mode:
    """What a round of window search allows: calls inside, ways in from outside."""

    calls: bool
    retarget: bool
    pinned: Pinned | None = None
    same_row: SameRow | None = None  # stubs inside the function where the row matches

    @property
    def name(self) -> str:
        if self.same_row is not None:
            return "with stubs inside the function"
        return "with retargets" if self.retarget else "with calls"

    def describe(self, w: PatchWindow) -> str:
        out = ""
        if w.calls:
            out += f"; {len(w.calls)} call(s) moved along"
        if w.retargets:
            out += f"; {len(w.retargets)} way(s) in retargeted"
        return out


def _window(fc: FunctionCode, shape: WindowShape, s: int, e: int, probe: CodeInsn,
            code: bytes, replacement: bytes | None, start_reason: str,
            end_reason: str, internal: tuple[int, ...] = (),
            retargets: tuple[Retarget, ...] = ()) -> PatchWindow:
    insns = tuple(fc.insns[fc.index_of(s) or 0: (fc.index_of(e) if fc.index_of(e) is not None
                                                  else len(fc.insns))])
    base = fc.bounds.start
    at_start = fc.target(s)
    padding = max(0, e - fc.bounds.end) if shape is not WindowShape.IN_PLACE else 0
    return PatchWindow(
        shape=shape, start=s, end=e, probe_address=probe.address, probe_length=probe.size,
        insns=insns, code=code[s - base: e - padding - base], replacement=replacement,
        relocated_bytes=0 if shape is WindowShape.IN_PLACE else e - s,
        extra_jumps=0 if shape is WindowShape.IN_PLACE else 2,
        start_reason=start_reason, end_reason=end_reason,
        targets_at_start=(at_start,) if at_start is not None else (),
        internal_targets=internal,
        function_start=fc.bounds.start, function_end=fc.bounds.end, padding_bytes=padding,
        calls=tuple(i.address for i in insns if _is_call(i)), retargets=retargets)


def _in_place(fc: FunctionCode, i: int, code: bytes) -> PatchWindow:
    probe = fc.insns[i]
    s = probe.address
    if not optimized_where_it_is(NOP5, s):  # the rule engine: would it be optimized here?
        raise _Blocked(SITE_CROSSES_PAGE.code, f"a nop5 at {s:#x} would cross a page")
    base = fc.bounds.start
    j = i
    e = s
    while e - s < JMP_REL32_SIZE:
        if j >= len(fc.insns):
            raise _Blocked(WINDOW_FUNCTION_END.code, "the NOP run reaches the function's end")
        ins = fc.insns[j]
        if decode_nop(code[ins.address - base: ins.end - base]) is None:
            raise _Blocked(WINDOW_NO_PADDING.code,
                           f"{ins.text} at {ins.address:#x} is not a NOP"
                           if j > i else "the probe instruction is not a NOP")
        e = ins.end
        j += 1
    inside = fc.targets_between(s, s + JMP_REL32_SIZE)
    if fc.all_targets is not None:
        inside += [a for a in fc.starts if s < a < s + JMP_REL32_SIZE]
    if inside:
        t = fc.target(inside[0])
        raise _Blocked(WINDOW_BRANCH_TARGET.code,
                       f"{inside[0]:#x} inside the new nop5 is a branch target "
                       f"({_describe_target(t) if t else 'inside an instruction'})")
    fixed = fc.fixed_in(s, e)
    if fixed is not None:
        raise _Blocked(WINDOW_TEXT_RELOCATION.code, f"the place of {fixed} lies in the NOP run")
    repl = NOP5 + NOP1 * (e - s - JMP_REL32_SIZE)  # nopl 0x0(%rax,%rax,1); nop...
    return _window(fc, WindowShape.IN_PLACE, s, e, probe, code, repl,
                   "the probe instruction", f"end of the NOP run covering 5 bytes ({e - s})")


def _is_call(ins: CodeInsn) -> bool:
    return ins.flow in (Flow.CALL, Flow.CALL_INDIRECT)


def _pinned(ins: CodeInsn, mode: _Mode) -> _Blocked | None:
    """Why `ins` may not move (analysis/observed.py), as a block of the window."""
    why = mode.pinned(ins) if mode.pinned is not None else None
    return _Blocked(*why) if why is not None else None


def _call_blocks(fc: FunctionCode, ins: CodeInsn, mode: _Mode, s: int) -> _Blocked | None:
    """Why `call` instruction `ins` may not be in a window starting at `s` (None: it may)."""
    if not mode.calls:
        return _Blocked(WINDOW_CALL.code, f"{ins.address:#x} is a call ({ins.text})")
    if ins.target is not None and s <= ins.target < ins.address + MAX_WINDOW:
        return _Blocked(WINDOW_CALL.code, f"{ins.address:#x} calls into the window "
                                          f"({ins.text}): it reads its own address")
    return None


def _rel_size(fc: FunctionCode, src: int, code: bytes) -> int | None:
    """The displacement size (1 or 4) of the direct branch at `src` in this function, read
    from its bytes; None when it is not a plain direct jmp/jcc/call."""
    k = fc.index_of(src)
    if k is None:
        return None
    ins = fc.insns[k]
    raw = code[ins.address - fc.bounds.start: ins.end - fc.bounds.start]
    while raw[:1] in (b"\x3e", b"\x2e", b"\xf2"):  # notrack / branch hints / bnd
        raw = raw[1:]
    if raw[:1] in (b"\xe8", b"\xe9") and len(raw) == 5:
        return 4
    if raw[:1] == b"\x0f" and len(raw) == 6 and 0x80 <= raw[1] <= 0x8F:
        return 4
    if len(raw) == 2 and (raw[0] == 0xEB or 0x70 <= raw[0] <= 0x7F):
        return 1
    return None


class _Longer(str):
    """Why a way in cannot be aimed at the detour, where a longer window may change that (its
    int3 filler may then hold the 8-bit jump's stub)."""


def _ways_in(fc: FunctionCode, addr: int, sources: tuple[Target, ...], s: int, e: int,
             code: bytes, stubs: dict[int, int], mode: _Mode) -> list[Retarget] | str:
    """How to aim every way into `addr` (strictly inside [s, e)) from outside at the detour's
    copy, or why one cannot be. `stubs` maps a target to the stub already chosen."""
    out: list[Retarget] = []
    for src in sources:
        where = src.source
        if where is None:
            return f"it is a {src.kind}{f': {src.what}' if src.what else ''}"
        if src.kind in (JUMP, CALL_TARGET) and fc.bounds.contains(where):
            size = _rel_size(fc, where, code)
            if size == 4:
                if (why := _fixed_branch(fc, where)) is not None:
                    return why
                out.append(Retarget(addr, where, REL32, src.kind))
                continue
            if size == 1 and src.kind == JUMP:
                if (moved := fc.fixed_in(where, where + 2)) is not None:
                    return f"the branch at {where:#x} holds the place of {moved}"
                stub = stubs.get(addr)
                if stub is None:
                    stub = _stub_slot(fc, where, s, e, set(stubs.values()))
                if stub is None and mode.same_row is not None:
                    stub = _inner_slot(fc, where, addr, s, e, set(stubs.values()), code,
                                       mode.same_row)
                if stub is None and mode.same_row is not None:
                    why = (f"the jump from {where:#x} has an 8-bit displacement and no unused "
                           f"padding, filler or NOP run in its reach where the unwind row is "
                           f"the target's can hold a jmp rel32")
                    # a longer window's filler may hold it
                    return _Longer(why) if where + 2 + 127 >= s + JMP_REL32_SIZE else why
                if stub is None:
                    return (f"the jump from {where:#x} has an 8-bit displacement and no unused "
                            f"padding in its reach can hold a jmp rel32")
                if (moved := fc.fixed_in(stub, stub + STUB_SIZE)) is not None:
                    return f"the padding stub at {stub:#x} holds the place of {moved}"
                if not -128 <= stub - (where + 2) <= 127:
                    return (f"the jump from {where:#x} has an 8-bit displacement and cannot "
                            f"reach the padding stub at {stub:#x}")
                stubs[addr] = stub
                out.append(Retarget(addr, where, REL8_STUB, src.kind, stub=stub))
                continue
            return f"the branch at {where:#x} is not a plain direct jmp/jcc/call"
        if src.kind == BRANCH_REL32:
            # from another function or section: the rewriter reads its encoding again
            if (why := _fixed_branch(fc, where)) is not None:
                return why
            out.append(Retarget(addr, where, REL32, src.kind))
            continue
        if src.kind in _FIXED:
            return _FIXED[src.kind].format(where)
        if src.kind == COLD_JUMP:
            # in another part: the rewriter reads its encoding (rel32 expected there)
            if (why := _fixed_branch(fc, where)) is not None:
                return why
            out.append(Retarget(addr, where, REL32, src.kind))
            continue
        if src.kind == JUMP_TABLE:
            tables = [t for t in fc.jump_tables if t.table == where and t.entry_size in (4, 8)]
            if not tables:
                return f"the jump table at {where:#x} is not one of this function's"
            t = tables[0]
            for n, tgt in enumerate(t.targets):
                if tgt == addr:
                    out.append(Retarget(addr, t.table + n * t.entry_size,
                                        TABLE4 if t.entry_size == 4 else TABLE8, src.kind,
                                        base=t.table))
            continue
        return f"it is a {src.kind}{f' from {where:#x}' if where is not None else ''}"
    return out


def _fixed_branch(fc: FunctionCode, where: int) -> str | None:
    """Why the rel32 branch at `where` cannot be patched: the loader writes its bytes (a text
    relocation's place among its first 6, those a jmp/jcc/call rel32 has), or None."""
    fixed = fc.fixed_in(where, where + 6)
    if fixed is None:
        return None
    return f"the branch at {where:#x} holds the place of {fixed}: the loader writes it"


# ways in that no rewrite can aim at the detour: the window is not used
_FIXED = {
    BRANCH_REL8: "the short jump from {:#x}, outside the function, has an 8-bit displacement",
    XBEGIN: "the xbegin at {:#x}, outside the function, names it as its fallback address (a "
            "transaction's abort; no emulator models one: it is not aimed at the detour)",
    ADDRESS_TAKEN: "its address is taken by the rip-relative lea at {:#x} (a computed goto or "
                   "a code pointer kept in data)",
    RELOCATION: "the relocation of the word at {:#x} holds its address (a code pointer the "
                "loader stores: a computed-goto table, an .init_array-like table)",
    DATA_WORD: "the data word at {:#x} holds its address (a code pointer in the file's data)",
    PLACE_RELATIVE: "the place-relative word at {:#x} holds its address less its own (`.long "
                    "target - .`: a static key's jump entry, a fault-fixup table)",
    CODE_WORD: "the code at {:#x} holds its address as an absolute value (a mov or push "
               "immediate of a fixed-address file)",
    REL_TABLE: "the 4-byte relative jump-table entry at {:#x} (of another function) lands "
               "on it",
    LANDING_PAD: "it is a landing pad the LSDA at {:#x} names",
}


def _stub_slot(fc: FunctionCode, src: int, s: int, e: int, taken: set[int]) -> int | None:
    """A 5-byte slot of the unused padding after the function (or, failing that, before it)
    for a `jmp rel32` stub that the 8-bit jump at `src` reaches, outside [s, e) and not
    already taken."""
    for lo, hi in ((fc.bounds.end, fc.bounds.end + fc.padding_after),
                   (fc.bounds.start - fc.padding_before, fc.bounds.start)):
        at = lo
        while at + STUB_SIZE <= hi:
            clash = (at < e and s < at + STUB_SIZE) or any(
                at < t + STUB_SIZE and t < at + STUB_SIZE for t in taken)
            if not clash and -128 <= at - (src + 2) <= 127:
                return at
            at += 1
    return None


def _inner_slot(fc: FunctionCode, src: int, addr: int, s: int, e: int, taken: set[int],
                code: bytes, same_row: SameRow) -> int | None:
    """A 5-byte slot inside the function for the `jmp rel32` stub of target `addr` that the
    8-bit jump at `src` reaches: in the window's own int3 filler [s + 5, e) first, then in a
    run of unused NOPs/int3 (`unused_runs`) where the file-wide index of ways in looks (within
    128 bytes before and 72 after the probe), where the `.eh_frame` row at the slot is the row
    at `addr`: the stub runs in the state the jump leaves, the target's, so an unwinder
    stopping at it (a signal, a profiler) reads that state right. No slot holds a place the
    loader writes, or overlaps a stub already chosen."""
    def fits(at: int) -> bool:
        return (-128 <= at - (src + 2) <= 127
                and not any(at < t + STUB_SIZE and t < at + STUB_SIZE for t in taken)
                and fc.fixed_in(at, at + STUB_SIZE) is None and same_row(at, addr))

    for at in range(s + JMP_REL32_SIZE, e - STUB_SIZE + 1):
        if fits(at):
            return at
    # only where the file-wide index of ways in looks (around the probe, which is in [s, e))
    near_lo, near_hi = e - WAYS_BEFORE, s + WAYS_AFTER
    for lo, hi in unused_runs(fc, code):
        for at in range(max(lo, near_lo), min(hi, near_hi) - STUB_SIZE + 1):
            if not (at < e and s < at + STUB_SIZE) and fits(at):
                return at
    return None


def unused_runs(fc: FunctionCode, code: bytes) -> list[tuple[int, int]]:
    """[lo, hi) of each run of NOP or int3 instructions inside the function that decoding from
    the function's ways in never reaches and no way in names (alignment padding after a `jmp`
    or `ret`, before a loop head): no one runs these bytes. None in a function whose ways in
    are not all known."""
    got = fc.memo.get("unused")
    if got is None:
        reached = fc.reached() if fc.all_targets is None else frozenset(fc.starts)
        out: set[int] = set()
        for ins in fc.insns:
            if ins.address in reached or fc.target(ins.address) is not None or \
                    not fc.bounds.start < ins.address or ins.end > fc.bounds.end:
                continue
            raw = code[ins.address - fc.bounds.start: ins.end - fc.bounds.start]
            if raw == b"\xcc" or decode_nop(raw) is not None:
                out.add(ins.address)
        got = frozenset(out)
        fc.memo["unused"] = got
    runs: list[tuple[int, int]] = []
    for ins in fc.insns:
        if ins.address in got:
            if runs and runs[-1][1] == ins.address:
                runs[-1] = (runs[-1][0], ins.end)
            else:
                runs.append((ins.address, ins.end))
    return runs


def _interior(fc: FunctionCode, s: int, e: int, first: int, last: int, mode: _Mode,
              code: bytes) -> tuple[bool, bool, str, tuple[int, ...], tuple[Retarget, ...]]:
    """Check the targets strictly inside [s, e) (instructions first+1 .. last).

    Returns (ok, fixable, reason, internal targets, retargets). A target is allowed inside when
    every way to reach it is a direct jump (or, with calls allowed, the return of a call)
    that is itself inside the window: the relocated copy of that jump then lands on the
    relocated copy of the target. With `mode.retarget`, ways in from outside are allowed too
    when each can be aimed at the copy (`_ways_in`). `fixable` is True when a later `e` could
    still make the window valid (every offending source lies after `e`).
    """
    internal: list[int] = []
    retargets: list[Retarget] = []
    stubs: dict[int, int] = {}
    if fc.all_targets is not None and last > first:
        ins = fc.insns[first + 1]
        return False, False, (f"{ins.address:#x} ({ins.text}) counts as a branch target "
                              f"({fc.all_targets})"), (), ()
    for addr in fc.targets_between(s, e):
        t = fc.targets[addr]
        k = fc.index_of(addr)
        text = fc.insns[k].text if k is not None else "inside an instruction"
        why = f"{addr:#x} ({text}) is a branch target ({_describe_target(t)})"
        sources = fc.incoming.get(addr, ())
        if k is None or not sources:
            return False, False, why, (), ()
        later = False
        outside: list[Target] = []
        for src in sources:
            inside = src.source is not None and s <= src.source < e
            if src.kind == JUMP and inside:
                continue
            if src.kind == RETURN_SITE and inside and mode.calls:
                continue  # the moved call returns into the detour's copy
            if src.kind == JUMP and src.source is not None and \
                    e <= src.source < fc.bounds.end and not mode.retarget:
                later = True
                continue
            outside.append(src)
        if outside and not mode.retarget:
            return False, False, why, (), ()
        if later:
            return False, True, why, (), ()
        if outside:
            ways = _ways_in(fc, addr, tuple(outside), s, e, code, stubs, mode)
            if isinstance(ways, str):
                return False, isinstance(ways, _Longer), f"{why}: {ways}", (), ()
            retargets.extend(ways)
        internal.append(addr)
    return True, False, "", tuple(internal), tuple(retargets)


def _span(fc: FunctionCode, first: int, i: int, mode: _Mode, code: bytes,
          size: int = JMP_REL32_SIZE) -> tuple[int, str, tuple[int, ...], tuple[Retarget, ...]]:
    """The smallest valid end for a window of at least `size` bytes starting at instruction
    `first` and holding instruction i: (end, why it ends there, targets inside reached only
    from inside, ways in from outside to retarget)."""
    insns = fc.insns
    s = insns[first].address
    for k in range(first, i + 1):
        stays = _pinned(insns[k], mode)
        if stays is not None:
            raise stays
        if _is_call(insns[k]):
            blocked = _call_blocks(fc, insns[k], mode, s)
            if blocked is not None:
                raise blocked
    last_block: _Blocked | None = None
    j = i
    while True:
        e = insns[j].end
        if e - s >= size:
            ok, fixable, why, internal, retargets = _interior(fc, s, e, first, j, mode, code)
            fixed = fc.fixed_in(s, e)
            if fixed is not None:  # the loader writes there: no extension helps
                raise _Blocked(WINDOW_TEXT_RELOCATION.code,
                               f"the place of {fixed} lies in [{s:#x}, {e:#x})")
            if ok:
                nxt = fc.target(e)
                reason = f"{size} bytes covered ({e - s})"
                if internal:
                    reason += (f"; {len(internal)} target(s) inside are reached only from "
                               "inside the window" if not retargets else
                               f"; {len(internal)} target(s) inside, {len(retargets)} way(s) "
                               "in from outside aimed at the detour")
                if nxt is not None:
                    reason += f"; {e:#x} is a branch target ({nxt.kind})"
                return e, reason, internal, retargets
            last_block = _Blocked(WINDOW_BRANCH_TARGET.code, why)
            if not fixable:
                raise last_block
        j += 1
        if j >= len(insns) or insns[j].address >= fc.bounds.end:
            last = insns[j - 1]
            need = s + size - e
            if (0 < need <= fc.padding_after and e == fc.bounds.end
                    and last.flow in (Flow.RET, Flow.JMP, Flow.JMP_INDIRECT, Flow.STOP)):
                ok, _fixable, why, internal, retargets = _interior(fc, s, e, first, j - 1,
                                                                   mode, code)
                if ok and fc.fixed_in(s, s + size) is None and \
                        not any(r.how == REL8_STUB for r in retargets):
                    return s + size, (
                        f"the function ends at {e:#x} after {last.text}; {need} byte(s) of "
                        f"the alignment padding after it complete {size} bytes"), internal, \
                        retargets
            raise last_block or _Blocked(
                WINDOW_FUNCTION_END.code, f"the function ends at {fc.bounds.end:#x} before "
                                       f"{size} bytes")
        stays = _pinned(insns[j], mode)
        if stays is not None:
            raise last_block or stays
        if _is_call(insns[j]):
            blocked = _call_blocks(fc, insns[j], mode, s)
            if blocked is not None:
                raise last_block or blocked
        if insns[j].end - s > MAX_WINDOW:
            raise last_block or _Blocked(WINDOW_BRANCH_TARGET.code, "no end within "
                                                                 f"{MAX_WINDOW} bytes")


def _forward(fc: FunctionCode, i: int, code: bytes, mode: _Mode) -> PatchWindow:
    probe = fc.insns[i]
    e, why, internal, retargets = _span(fc, i, i, mode, code)
    if probe.size >= JMP_REL32_SIZE:
        why = "the probe instruction alone is 5 bytes or more"
    return _window(fc, WindowShape.FORWARD, probe.address, e, probe, code, None,
                   "the probe instruction", why, internal, retargets)


def _short(fc: FunctionCode, i: int, code: bytes, mode: _Mode) -> PatchWindow:
    """A window of 2 to 4 bytes from the probe, where no window of 5 exists (a probe-only
    function `nop; ret` last before `.fini`, one packed before the next): `jmp rel8` at its
    start to a `jmp rel32` stub in the unused padding around the function, or in an unused
    NOP run inside it where the unwind row is the row at the start, which jumps to the detour
    (three jumps per pass). The window ends at its first valid end from 2 bytes on, as a
    forward one does from 5."""
    probe = fc.insns[i]
    s = probe.address
    e, why, internal, retargets = _span(fc, i, i, mode, code, JMP_REL8_SIZE)
    if e - s >= JMP_REL32_SIZE:
        raise _Blocked(WINDOW_BRANCH_TARGET.code, f"the first end from {JMP_REL8_SIZE} bytes "
                                                  f"on, {e:#x}, holds 5 bytes")
    taken = {r.stub for r in retargets if r.stub is not None}
    stub = _stub_slot(fc, s, s, e, taken)
    for lo, hi in fc.tails_before if stub is None else ():
        for at in range(lo, hi - STUB_SIZE + 1):
            if -128 <= at - (s + JMP_REL8_SIZE) <= 127 and not any(
                    at < t + STUB_SIZE and t < at + STUB_SIZE for t in taken):
                stub = at
                break
        if stub is not None:
            break
    if stub is None and mode.same_row is not None:
        stub = _inner_slot(fc, s, s, s, e, taken, code, mode.same_row)
    if stub is None:
        raise _Blocked(WINDOW_FUNCTION_END.code,
                       f"[{s:#x}, {e:#x}) holds a jmp rel8 but no unused padding or NOP run in "
                       f"its reach (where the unwind row is the start's) holds the jmp rel32 "
                       f"stub")
    if (moved := fc.fixed_in(stub, stub + STUB_SIZE)) is not None:
        raise _Blocked(WINDOW_TEXT_RELOCATION.code,
                       f"the entry stub at {stub:#x} holds the place of {moved}")
    w = _window(fc, WindowShape.FORWARD, s, e, probe, code, None, "the probe instruction",
                f"{why}: entered by a jmp rel8 through the jmp rel32 stub at {stub:#x}",
                internal, retargets)
    return replace(w, entry_stub=stub, extra_jumps=3)


def _backward(fc: FunctionCode, i: int, code: bytes, mode: _Mode) -> PatchWindow:
    probe = fc.insns[i]
    # (size, ways in, -start, end, why, internal, retargets)
    best: tuple[int, int, int, int, str, tuple[int, ...], tuple[Retarget, ...]] | None = None
    first_block: _Blocked | None = None
    for k in range(i - 1, max(-1, i - 1 - MAX_BACKWARD_INSNS), -1):
        ins = fc.insns[k]
        # An unconditional jmp/ret may be inside: what follows it is reached only through
        # targets, which the analysis knows (or it says all-targets), or it is dead padding.
        if _is_call(ins):
            blocked = _call_blocks(fc, ins, mode, ins.address)
            if blocked is not None:
                first_block = first_block or blocked
                break
        try:
            e, why, internal, retargets = _span(fc, k, i, mode, code)
        except _Blocked as b:
            b.with_traceback(None)  # no cycle through the frames that raised it
            first_block = first_block or b
            continue
        cand = (e - ins.address, len(retargets), -ins.address, e, why, internal, retargets)
        if best is None or cand[:3] < best[:3]:
            best = cand
    if best is None:
        raise first_block or _Blocked(WINDOW_BRANCH_TARGET.code, "no start before the probe")
    s, e, why, internal, retargets = -best[2], best[3], best[4], best[5], best[6]
    t = fc.target(s)
    start_reason = (f"fewest relocated bytes; {s:#x} is a branch target ({t.kind})"
                    if t is not None else "fewest relocated bytes")
    return _window(fc, WindowShape.BACKWARD, s, e, probe, code, None, start_reason, why,
                   internal, retargets)
