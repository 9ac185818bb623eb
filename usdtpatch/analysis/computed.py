"""Computed control flow anywhere in the file: bounded, or it poisons (issue 30).

A jump whose target is computed (a relative table's base plus an entry, a label plus an
offset) can land anywhere its arithmetic allows, in any function of the file. Its targets
are accepted only from a table whose base, scale, bounds and entry count are established
(a bounds check on the index before the jump, or the index's value range: a zero extension
of a byte or a word, an `and` with a mask; usdtpatch.analysis.targets reads it): each entry
that lands in a probed function is a way in there (`REL_TABLE`, never aimed at a detour).
Any other computed target makes every instruction boundary of the function its base lies in
a possible way in (that function becomes all-targets: no window holds one of its boundaries
strictly inside), or, where the base is unknown, of every function. A relative table without
bounds whose base is data poisons the functions its entries read so far land in.

A code address that arithmetic is applied to after a rip-relative `lea` takes it (`lea
fn(%rip),%r; add $k,%r`, `lea k(%r),%r2`, before it is stored or passed on) is a way in at
every offset of its function: that function is all-targets too.

Not computed (the assumption; docs/rewrite.md, "What is assumed"): a value jumped to as it
was loaded from memory, popped, returned by a call, passed in a register or copied (a tail
call through a function pointer, a vtable slot, an absolute table's entry). Its value is an
address taken somewhere, which the file-wide ways-in index collects: a rip-relative `lea`, a
relocation, an absolute word of a fixed-address file.

Found cheaply: a byte pattern (`ff e0`-`ff e7`, `jmp *%reg`) over the executable sections
finds the candidate jumps, and only the functions holding one are disassembled (once: the
memo of usdtpatch.analysis.targets.CodeContext); the `lea`s into probed functions come from
the rel32 prefilter of usdtpatch.analysis.waysin, each decoded from its own address.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable

from usdtpatch.analysis.functions import FunctionBounds
from usdtpatch.analysis.targets import CodeContext, scan_jumps
from usdtpatch.analysis.waysin import (
    REL_TABLE,
    WayIn,
    WaysIn,
    _candidates,
    _merged,
    _rel32_targets,
    build_ways_in,
    code_ranges,
)
from usdtpatch.x86.decode import CodeInsn, Flow, sweep
from usdtpatch.x86.regs import alias

_JMP_REG = re.compile(rb"\xff[\xe0-\xe7]")  # jmp *%reg (a REX prefix before it: r8-r15)
_LEA_RIP = rb"\x8d[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]"
_FOLLOW = 12  # instructions followed after a lea of code
_ARITHMETIC = ("add", "sub", "adc", "sbb", "inc", "dec", "neg", "not", "or", "and", "xor",
               "shl", "shr", "sar", "sal", "rol", "ror", "imul", "lea", "bts", "btr", "btc")


class Computed:
    """What the computed control flow of the file adds: ways in, poisoned functions."""

    def __init__(self) -> None:
        self.ways: list[WayIn] = []
        self.poisoned: dict[int, str] = {}
        self.everywhere: str | None = None

    def poison(self, ctx: CodeContext, address: int, why: str) -> None:
        b = ctx.bounds(address)
        if b is not None:
            self.poisoned.setdefault(b.start, why)


def file_ways_in(ctx: CodeContext, sites: list[tuple[int, int, int]],
                 starts: list[int]) -> WaysIn:
    """The file-wide ways-in index (usdtpatch.analysis.waysin.build_ways_in) with what the
    file's computed control flow adds: one place for check, rewrite and the fork guard."""
    got = computed_flow(ctx, sites)
    base = build_ways_in(ctx.image, sites, starts, ctx.cfi)
    # the computed flow's first: a word that is both an entry of a table it reads and a
    # place-relative word (an entry at its table's base) is named as the table's entry
    return WaysIn(got.ways + [w for _a, ws in base.between(0, 1 << 64) for w in ws],
                  got.poisoned, got.everywhere, base.named)


def computed_flow(ctx: CodeContext, sites: list[tuple[int, int, int]]) -> Computed:
    """The ways in and poisoned functions from every computed jump and every arithmetic on
    a code address in the file, for the probes `sites` (pc, function start, end)."""
    out = Computed()
    spans = _merged((s, e) for _pc, s, e in sites if s < e)
    if not spans:
        return out
    los = [lo for lo, _hi in spans]

    def probed(a: int) -> bool:
        i = bisect_right(los, a) - 1
        return i >= 0 and a < spans[i][1]

    _jumps(ctx, probed, out)
    _arithmetic(ctx, spans, probed, out)
    return out


def _jumps(ctx: CodeContext, probed: Callable[[int], bool], out: Computed) -> None:
    image = ctx.image
    functions: dict[int, FunctionBounds | None] = {}
    for vaddr, off, size in code_ranges(image):
        for m in _JMP_REG.finditer(image.data, off, off + size):
            found = ctx.bounds(vaddr + m.start() - off)
            if found is not None and found.start not in functions:
                # the bounds of its start, asked now: its FDE was just read (CfiIndex keeps
                # the latest ones), not again after the other 2,400 functions
                functions[found.start] = ctx.bounds(found.start)
    for start in sorted(functions):
        b = functions[start]
        if b is None:
            continue
        tables, computed = scan_jumps(ctx, b)
        for t in tables:
            if t.entry_size != 4:
                continue
            for i, a in enumerate(t.targets):
                if not b.contains(a) and probed(a):
                    src = t.table + 4 * i
                    out.ways.append(WayIn(target=a, kind=REL_TABLE, source=src,
                                          what=f"4-byte entry at {src:#x} of the table at "
                                               f"{t.table:#x} of the jump at {t.jump:#x}",
                                          base=t.table))
        for jump, base, why in computed:
            if base is None:
                out.everywhere = out.everywhere or f"{why}, from a base that is not known"
            elif ctx.bounds(base) is not None:
                out.poison(ctx, base, why)
            else:  # an unbounded table in data: the functions its entries read land in
                landed = [a for t in tables if t.jump == jump for a in t.targets]
                if not landed:
                    out.everywhere = out.everywhere or f"{why}, and no entry of it is read"
                for a in landed:
                    out.poison(ctx, a, why)


def _arithmetic(ctx: CodeContext, spans: list[tuple[int, int]], probed: Callable[[int], bool],
                out: Computed) -> None:
    """Every rip-relative `lea` of an address in a probed function whose register then has
    arithmetic applied (in the straight line after it, before it is overwritten)."""
    image = ctx.image
    for vaddr, off, size in code_ranges(image):
        data = bytes(image.data[off:off + size])
        at = [q for q in _candidates(data, vaddr, _LEA_RIP, 2, spans) if q <= size - 6]
        for q, t in zip(at, _rel32_targets(data, vaddr, at, 2), strict=True):
            if not probed(t):
                continue
            start = q - 1 if q > 0 and 0x48 <= data[q - 1] <= 0x4F else q
            why = _arithmetic_after(data[start:start + 15 * _FOLLOW], vaddr + start, t)
            if why is not None:
                out.poison(ctx, t, why)


def _arithmetic_after(code: bytes, at: int, target: int) -> str | None:
    """Why the address `target`, taken by the `lea` at the start of `code`, is changed by
    arithmetic into a value that may be used as an address (None: it is not). The registers
    holding the address and those holding a value computed from it are followed in the
    straight line after the `lea`: a computed value that is jumped to, called, stored,
    pushed, passed on (a call, the end of the line) or still held when the line ends counts;
    one that is only compared, tested, or shifted right by 32 or more (no longer an address)
    and then dropped does not, nor the address less a register (not one set to an immediate
    in the line: that is a constant offset), taken for a distance
    (`code-differences` in prove/assumptions.py: libruby's rel32 reach check `(fn - x +
    2^31) >> 32`)."""
    insns = sweep(code, at, True).insns
    if not insns or insns[0].rip_target != target or \
            not insns[0].base_mnemonic.startswith("lea"):
        return None
    lea = insns[0]
    holders = {alias(lea.operands[-1])}
    derived: dict[str, CodeInsn] = {}  # register -> the arithmetic that made its value
    consts: set[str] = set()  # registers set to an immediate in the line
    for ins in insns[1:_FOLLOW]:
        mn, ops = ins.base_mnemonic, ins.operands
        arith = mn.startswith(_ARITHMETIC) and not (mn.startswith("lea") and ins.rip_target)
        dest = alias(ops[-1]) if len(ops) >= 2 and ops[-1].startswith("%") else None
        if len(ops) == 1 and ops[0].startswith("%") and arith:
            dest = alias(ops[0])  # neg, not, inc, dec, a shift by one
        srcs = [alias(o) for o in (ops[:-1] if len(ops) >= 2 else ops) if "%" in o[:2]]
        if ins.mem is not None:
            srcs += [alias(r) for r in (ins.mem.base, ins.mem.index) if r]
        if dest is not None and arith and not mn.startswith("lea"):
            srcs.append(dest)  # a two-operand arithmetic reads its destination
        from_h = holders.intersection(srcs)
        from_d = [r for r in srcs if r in derived]
        if mn.startswith(("cmp", "test", "bt")):
            pass  # read, nothing written
        elif mn.startswith("sub") and len(ops) == 2 and ops[0].startswith("%") and \
                dest in holders and alias(ops[0]) not in holders | set(derived) | consts:
            holders.discard(dest)  # the address less a register: a distance (assumed)
        elif mn.startswith(("shr", "sar")) and dest in derived and _shift(ops) >= 32:
            derived.pop(dest)  # no longer an address
        elif arith and dest is not None and (from_h or from_d) and \
                not (mn.startswith("xor") and len(ops) == 2 and ops[0] == ops[1]):
            derived[dest] = derived[from_d[0]] if from_d else ins
            holders.discard(dest)
        elif mn.startswith(("mov", "cmov")) and dest is not None and len(ops) == 2 and \
                ops[0].startswith("%"):
            src = alias(ops[0])
            keep = mn.startswith("cmov")  # the destination may keep its value
            if src in derived:
                derived[dest] = derived[src]
            elif src in holders:
                holders.add(dest)
            elif not keep:
                holders.discard(dest)
                derived.pop(dest, None)
        elif from_d:  # stored, pushed, exchanged, jumped to or called with
            return _said(lea, derived[from_d[0]])
        elif dest is not None:
            holders.discard(dest)
            derived.pop(dest, None)
        if dest is not None:  # a register set to an immediate subtracts a constant
            if mn.startswith("mov") and len(ops) == 2 and ops[0].startswith("$"):
                consts.add(dest)
            else:
                consts.discard(dest)
        if ins.flow is not Flow.NONE:
            break
        if not holders and not derived:
            return None
    if derived:  # still held where the line ends, or passed on by a call or a jump
        return _said(lea, next(iter(derived.values())))
    return None


def _shift(ops: list[str] | tuple[str, ...]) -> int:
    """The count of a shift by an immediate (`$0x20`), else 0."""
    try:
        return int(ops[0][1:], 0) if ops and ops[0].startswith("$") else 0
    except ValueError:
        return 0


def _said(lea: CodeInsn, arith: CodeInsn) -> str:
    return (f"{lea.text} at {lea.address:#x}, then {arith.text} at {arith.address:#x}: "
            f"arithmetic on the address of code")
