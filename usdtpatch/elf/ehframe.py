"""Writing call frame information: FDEs for detours, a new `.eh_frame_hdr`, and the CFA-rule
interpreter they need.

References: the LSB "Exception Frames" chapter (.eh_frame CIE/FDE layout, the DW_EH_PE pointer
encodings, the .eh_frame_hdr binary-search table) and DWARF 4 section 6.4 (call frame
instructions). Reading FDEs for analysis lives in usdtpatch/elf/cfi.py and is reused here.

What a rewrite adds (docs/rewrite.md, "What each consumer needs"): the runtime unwinders (libgcc,
libunwind) find an FDE through PT_GNU_EH_FRAME's table, whose entries are (pc, FDE address)
pairs that may point anywhere; gdb and readelf read the section named `.eh_frame` and gdb also
merges `.debug_frame`. So the original `.eh_frame` stays where it is under its name; the
detours get a small CIE + FDEs in the new segment (`.usdtpatch.eh_frame`), a new
`.eh_frame_hdr` indexes the original FDEs and the detours' together (the original header is
renamed `.eh_frame_hdr.orig`), and the same FDEs go to `.debug_frame` for gdb and elfutils
(allocated, in the new segment, so that strip keeps it, where the input has none).
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise, repeat
from operator import sub

from usdtpatch.elf.cfi import (
    CallSite,
    CfiError,
    Cie,
    Fde,
    Lsda,
    leb_bytes,
    pointer_code,
)
from usdtpatch.elf.image import ET_DYN, ElfImage
from usdtpatch.elf.model import (
    DW_EH_PE_datarel,
    DW_EH_PE_indirect,
    DW_EH_PE_omit,
    DW_EH_PE_pcrel,
    DW_EH_PE_sdata4,
    DW_EH_PE_udata4,
    DW_EH_PE_uleb128,
    loader_relocations,
)
from usdtpatch.elf.symbols import names_at, symbol_name_of
from usdtpatch.errors import UnsupportedError

RSP = 7  # DWARF register numbers on x86-64
RIP = 16


def _uleb(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    return leb_bytes(data, pos, False)


def _sleb(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    return leb_bytes(data, pos, True)


def uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def sleb(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        done = (value == 0 and not b & 0x40) or (value == -1 and b & 0x40)
        out.append(b | (0 if done else 0x80))
        if done:
            return bytes(out)


# ---------------------------------------------------------------------------------------
# CFA rows


@dataclass(frozen=True, slots=True)
class Cfa:
    """How to compute the CFA: register + offset, or a DWARF expression."""

    reg: int | None
    offset: int = 0
    expr: bytes | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """How to recover one register: offset(N), val_offset(N), register(R), expr, val_expr,
    undefined, same."""

    kind: str
    value: int = 0
    expr: bytes = b""


@dataclass(frozen=True, slots=True)
class Row:
    """The unwind rules in force at one address, and the `DW_CFA_GNU_args_size` in force
    there (the bytes of outgoing arguments pushed: an unwinder that lands at a landing pad of
    this frame pops them, libgcc's `uw_install_context_1`)."""

    cfa: Cfa
    regs: tuple[tuple[int, Rule], ...] = ()
    args_size: int = 0

    def with_cfa_offset(self, delta: int) -> Row:
        if self.cfa.reg is None:
            raise UnsupportedError("the CFA is an expression here; the detour cannot adjust it")
        return Row(Cfa(self.cfa.reg, self.cfa.offset + delta), self.regs, self.args_size)


def rows_at(fde: Fde, addresses: list[int]) -> dict[int, Row]:
    """The row in force at each address (all inside `fde`), by running its CFA program, with
    the `DW_CFA_GNU_args_size` in force there.

    The unwinders disagree on one point of that operand: libgcc keeps it outside the register
    state, so `DW_CFA_restore_state` does not bring back the value saved by
    `DW_CFA_remember_state`, while LLVM's libunwind keeps it in the state it saves. Where the
    two readings give different values at an address asked for, the program is refused
    (UnsupportedError): a detour could repeat only one of them.

    A program this interpreter cannot follow raises UnsupportedError (the site is skipped),
    and so does a CIE with an augmentation the reader does not know (`Cie.understood`): its
    letters may change what the rows mean, and without a 'z' length where its initial
    instructions start is not known."""
    table = fde_rows(fde)
    if isinstance(table, UnsupportedError):
        raise UnsupportedError(str(table))
    locs, rows = table
    out: dict[int, Row] = {}
    for at in sorted(set(addresses)):
        row, libunwind_args = rows[max(0, bisect_right(locs, at) - 1)]
        if row.args_size != libunwind_args:
            raise UnsupportedError(
                f"DW_CFA_GNU_args_size at {at:#x} is {row.args_size} for libgcc and "
                f"{libunwind_args} for libunwind (a DW_CFA_restore_state in between)")
        out[at] = row
    return out


# (the start of each row's range, ascending; (the row, args_size as LLVM's libunwind reads it)
# of each), or why the program cannot be followed
RowTable = tuple[list[int], list[tuple[Row, int]]]


@lru_cache(maxsize=256)
def fde_rows(fde: Fde) -> RowTable | UnsupportedError:
    """Every row of the FDE, its CFA program run once (issue 46, class 8: each site asked
    its rows by running the whole program again, probes x rows for a long function): the
    rows depend on the FDE and its CIE alone (their programs, alignments, start), so one
    table serves every question of every file holding the same entry."""
    cie = fde.cie
    if not cie.understood:
        return UnsupportedError(f"the CIE at {cie.address:#x} has augmentation "
                                f"{cie.augmentation!r}, which this reader does not know")
    try:
        return _row_table(fde)
    except CfiError as exc:
        return UnsupportedError(f"the FDE's call frame program is malformed: {exc}")
    except UnsupportedError as exc:
        return exc


def _row_table(fde: Fde) -> RowTable:
    cie = fde.cie
    locs: list[int] = []
    rows: list[tuple[Row, int]] = []
    state: dict[str, object] = {"cfa": Cfa(RSP, 8)}
    regs: dict[int, Rule] = {}
    initial: dict[int, Rule] = {}
    stack: list[tuple[Cfa, dict[int, Rule], int]] = []
    ca, da = cie.code_alignment, cie.data_alignment
    loc = fde.pc_begin
    # args_size as libgcc reads it, and as LLVM's libunwind does (restored by restore_state)
    args = [0, 0]

    def cfa() -> Cfa:
        value = state["cfa"]
        assert isinstance(value, Cfa)
        return value

    def flush(upto: int) -> None:
        # the state in force over [loc, upto): one row (a zero advance adds none)
        if upto > loc or not locs:
            row = (Row(cfa(), tuple(sorted(regs.items())), args[0]), args[1])
            if locs and locs[-1] == loc:
                rows[-1] = row
            else:
                locs.append(loc)
                rows.append(row)

    def restore(reg: int) -> None:
        if reg in initial:
            regs[reg] = initial[reg]
        else:
            regs.pop(reg, None)

    def run(prog: bytes, is_cie: bool) -> None:
        nonlocal loc, regs
        p = 0
        while p < len(prog):
            op = prog[p]
            p += 1
            hi, lo = op & 0xC0, op & 0x3F
            if hi == 0x40:  # advance_loc
                flush(loc + lo * ca)
                loc += lo * ca
            elif hi == 0x80:  # offset
                off, p = _uleb(prog, p)
                regs[lo] = Rule("offset", off * da)
            elif hi == 0xC0:  # restore
                restore(lo)
            elif op == 0x00:  # nop
                pass
            elif op in (0x02, 0x03, 0x04):  # advance_loc1/2/4
                n = {0x02: 1, 0x03: 2, 0x04: 4}[op]
                delta = int.from_bytes(prog[p : p + n], "little")
                p += n
                flush(loc + delta * ca)
                loc += delta * ca
            elif op == 0x01:
                raise UnsupportedError("DW_CFA_set_loc in an FDE")
            elif op in (0x05, 0x11, 0x14, 0x15):  # offset_extended(_sf), val_offset(_sf)
                reg, p = _uleb(prog, p)
                off, p = _uleb(prog, p) if op in (0x05, 0x14) else _sleb(prog, p)
                regs[reg] = Rule("offset" if op in (0x05, 0x11) else "val_offset", off * da)
            elif op == 0x06:  # restore_extended
                reg, p = _uleb(prog, p)
                restore(reg)
            elif op in (0x07, 0x08):  # undefined, same_value
                reg, p = _uleb(prog, p)
                regs[reg] = Rule("undefined" if op == 0x07 else "same")
            elif op == 0x09:  # register
                reg, p = _uleb(prog, p)
                reg2, p = _uleb(prog, p)
                regs[reg] = Rule("register", reg2)
            elif op == 0x0A:  # remember_state
                stack.append((cfa(), dict(regs), args[1]))
            elif op == 0x0B:  # restore_state
                if not stack:
                    raise UnsupportedError("DW_CFA_restore_state with an empty stack")
                state["cfa"], regs, args[1] = stack.pop()
            elif op in (0x0C, 0x12):  # def_cfa, def_cfa_sf
                reg, p = _uleb(prog, p)
                off, p = _uleb(prog, p) if op == 0x0C else _sleb(prog, p)
                state["cfa"] = Cfa(reg, off if op == 0x0C else off * da)
            elif op == 0x0D:  # def_cfa_register
                reg, p = _uleb(prog, p)
                state["cfa"] = Cfa(reg, cfa().offset)
            elif op in (0x0E, 0x13):  # def_cfa_offset(_sf)
                off, p = _uleb(prog, p) if op == 0x0E else _sleb(prog, p)
                off = off if op == 0x0E else off * da
                if cfa().reg is None:
                    raise UnsupportedError("DW_CFA_def_cfa_offset after a CFA expression")
                state["cfa"] = Cfa(cfa().reg, off)
            elif op == 0x0F:  # def_cfa_expression
                n, p = _uleb(prog, p)
                state["cfa"] = Cfa(None, 0, bytes(prog[p : p + n]))
                p += n
            elif op in (0x10, 0x16):  # expression, val_expression
                reg, p = _uleb(prog, p)
                n, p = _uleb(prog, p)
                regs[reg] = Rule("expr" if op == 0x10 else "val_expr", 0, bytes(prog[p : p + n]))
                p += n
            elif op == 0x2E:  # GNU_args_size
                args[0], p = _uleb(prog, p)
                args[1] = args[0]
            elif op == 0x2F:  # GNU_negative_offset_extended
                reg, p = _uleb(prog, p)
                off, p = _uleb(prog, p)
                regs[reg] = Rule("offset", -off * da)
            else:
                raise UnsupportedError(f"unknown call frame instruction {op:#04x}")
        if is_cie:
            initial.update(regs)

    run(cie.instructions, True)
    run(fde.instructions, False)
    flush(1 << 64)
    return locs, rows


# ---------------------------------------------------------------------------------------
# Emitting CIE, FDEs and the header table

DETOUR_CODE_ALIGN = 1
DETOUR_DATA_ALIGN = -8


def build_cie() -> bytes:
    """A CIE for detour FDEs: version 1, "zR", FDE pointers pcrel|sdata4, no initial rules."""
    body = (struct.pack("<I", 0) + b"\x01" + b"zR\0" + uleb(DETOUR_CODE_ALIGN)
            + sleb(DETOUR_DATA_ALIGN) + bytes([RIP]) + uleb(1)
            + bytes([DW_EH_PE_pcrel | DW_EH_PE_sdata4]))
    body += b"\0" * ((-(len(body) + 4)) % 8)
    return struct.pack("<I", len(body)) + body


def _rule_ops(reg: int, rule: Rule) -> bytes:
    kind = rule.kind
    if kind in ("offset", "val_offset"):
        off = rule.value
        if off % DETOUR_DATA_ALIGN:
            raise UnsupportedError(f"register {reg} saved at a CFA offset not a multiple of 8")
        op = 0x11 if kind == "offset" else 0x15
        return bytes([op]) + uleb(reg) + sleb(off // DETOUR_DATA_ALIGN)
    if kind == "undefined":
        return b"\x07" + uleb(reg)
    if kind == "same":
        return b"\x08" + uleb(reg)
    if kind == "register":
        return b"\x09" + uleb(reg) + uleb(rule.value)
    return bytes([0x10 if kind == "expr" else 0x16]) + uleb(reg) + uleb(len(rule.expr)) + rule.expr


def _row_ops(row: Row, prev: Row | None) -> bytes:
    out = bytearray()
    if prev is None or row.cfa != prev.cfa:
        c = row.cfa
        if c.reg is None:
            expr = c.expr or b""
            out += b"\x0f" + uleb(len(expr)) + expr
        elif c.offset >= 0:
            out += b"\x0c" + uleb(c.reg) + uleb(c.offset)
        else:
            out += b"\x12" + uleb(c.reg) + sleb(c.offset // DETOUR_DATA_ALIGN)
    old = dict(prev.regs) if prev is not None else {}
    new = dict(row.regs)
    for reg, rule in sorted(new.items()):
        if old.get(reg) != rule:
            out += _rule_ops(reg, rule)
    for reg in sorted(set(old) - set(new)):
        out += b"\x08" + uleb(reg)  # back to the default: same value
    if row.args_size != (prev.args_size if prev is not None else 0):
        out += b"\x2e" + uleb(row.args_size)  # DW_CFA_GNU_args_size
    return bytes(out)


def fde_program(pc_begin: int, rows: list[tuple[int, Row]]) -> bytes:
    """The call frame instructions of an FDE starting at `pc_begin` whose rows change at the
    given addresses (the same program serves `.eh_frame` and `.debug_frame`)."""
    prog = bytearray()
    prev: Row | None = None
    loc = pc_begin
    for addr, row in rows:
        if addr > loc and prev is not None and row != prev:
            delta = addr - loc
            prog += (bytes([0x40 | delta]) if delta < 0x40 else
                     b"\x02" + bytes([delta]) if delta < 0x100 else
                     b"\x03" + struct.pack("<H", delta))
            loc = addr
        if row != prev:
            prog += _row_ops(row, prev)
            prev = row
    return bytes(prog)


def build_fde(fde_addr: int, cie_addr: int, pc_begin: int, pc_end: int, program: bytes,
              lsda: int | None = None) -> bytes:
    """An FDE at `fde_addr` for [pc_begin, pc_end) with the call frame instructions
    `program` (fde_program's, for rows from `pc_begin`).

    With `lsda` (the address of the detour's LSDA), the FDE's augmentation data holds it,
    pcrel|sdata4: the CIE must be one of `build_personality_cie`."""
    cie_ptr = fde_addr + 4 - cie_addr
    pc_field = fde_addr + 8
    aug = uleb(0)
    if lsda is not None:
        aug = uleb(4) + _field("i", lsda - (fde_addr + 17), "FDE LSDA pointer")
    body = (_field("I", cie_ptr, "FDE CIE pointer") + _field("i", pc_begin - pc_field,
                                                                "FDE pc_begin")
            + _field("I", pc_end - pc_begin, "FDE pc_range") + aug + program)
    body += b"\0" * ((-(len(body) + 4)) % 8)  # DW_CFA_nop padding
    return struct.pack("<I", len(body)) + body


def build_debug_frame(existing: bytes, fdes: list[tuple[int, int, bytes]]) -> bytes:
    """A `.debug_frame` (DWARF 4 section 6.4, version 1 CIE) holding `existing` (an original
    `.debug_frame`, kept byte for byte: its CIE pointers are offsets from the section start)
    and then one CIE and an FDE per (pc_begin, pc_end, program: fde_program's).

    Why: gdb reads one section named `.eh_frame` (the original, left in place) and merges the
    FDEs of `.debug_frame` into it; the runtime unwinder reads PT_GNU_EH_FRAME's table instead.
    """
    out = bytearray(existing)
    out += b"\0" * ((-len(out)) % 8)
    cie_at = len(out)
    body = (b"\xff\xff\xff\xff" + b"\x01" + b"\0" + uleb(DETOUR_CODE_ALIGN)
            + sleb(DETOUR_DATA_ALIGN) + bytes([RIP]))
    body += b"\0" * ((-(len(body) + 4)) % 8)
    out += struct.pack("<I", len(body)) + body
    for pc_begin, pc_end, program in fdes:
        body = struct.pack("<IQQ", cie_at, pc_begin, pc_end - pc_begin) + program
        body += b"\0" * ((-(len(body) + 4)) % 8)
        out += struct.pack("<I", len(body)) + body
    return bytes(out)


def build_eh_frame_hdr(hdr_addr: int, eh_frame_addr: int, locations: Sequence[int],
                       fdes: Sequence[int]) -> bytes:
    """`.eh_frame_hdr` at `hdr_addr`: version 1, eh_frame_ptr pcrel|sdata4, count udata4,
    table datarel|sdata4 of (initial location `locations[i]`, FDE address `fdes[i]`), sorted
    by location (then FDE). The FDEs may lie in any section (the table holds each one's
    address), `eh_frame_addr` names the `.eh_frame` a linear reader starts from.

    The columns are packed through arrays, not a tuple a row: a rewrite of 100,000 sites
    writes 200,000 rows (issue 38: ~45 MB of pairs and lists before)."""
    if len(locations) != len(fdes):
        raise ValueError("build_eh_frame_hdr: a location and an FDE address each")
    if not all(p <= q for p, q in pairwise(zip(locations, fdes, strict=True))):
        rows = sorted(zip(locations, fdes, strict=True))
        locations, fdes = [r[0] for r in rows], [r[1] for r in rows]
    out = bytearray([1, DW_EH_PE_pcrel | DW_EH_PE_sdata4, DW_EH_PE_udata4,
                     DW_EH_PE_datarel | DW_EH_PE_sdata4])
    out += _field("i", eh_frame_addr - (hdr_addr + 4), ".eh_frame_hdr eh_frame_ptr")
    out += _field("I", len(locations), ".eh_frame_hdr fde_count")
    table = array("i", bytes(8 * len(locations)))
    try:
        table[0::2] = array("i", map(sub, locations, repeat(hdr_addr)))
        table[1::2] = array("i", map(sub, fdes, repeat(hdr_addr)))
    except OverflowError:
        bad = next(r for r in zip(locations, fdes, strict=True)
                   if not all(-(1 << 31) <= v - hdr_addr < 1 << 31 for v in r))
        _field("i", max(bad[0] - hdr_addr, bad[1] - hdr_addr, key=abs),
               f".eh_frame_hdr entry for {bad[0]:#x}")
        raise
    if sys.byteorder != "little":
        table.byteswap()
    out += table.tobytes()
    return bytes(out)


def _field(code: str, value: int, what: str) -> bytes:
    """A 4-byte little-endian field, or UnsupportedError when `value` does not fit."""
    lo, hi = (-(1 << 31), 1 << 31) if code == "i" else (0, 1 << 32)
    if not lo <= value < hi:
        raise UnsupportedError(f"{what}: {value:#x} does not fit a 4-byte field (an address "
                               f"more than 2 GiB from the new .eh_frame)")
    return struct.pack("<" + code, value)


# ---------------------------------------------------------------------------------------
# A detour's own LSDA (the Itanium C++ ABI exception tables, as GCC's personality reads them)
#
# A call moved into a detour returns into it, so an exception thrown by the callee is looked
# up in the detour's FDE. To reach the same handler, the detour gets a CIE naming the
# original personality and an LSDA of its own: one call-site entry per moved instruction the
# original table covers, with the original landing pad and action (an explicit LPStart makes
# the landing pads, which stay in the original function, reachable), then a copy of the
# original action table, type table and exception specifications, the type table's
# pc-relative pointers adjusted for the move. An instruction the original table leaves out
# gets no entry: the personality then calls std::terminate, as in the original.


@dataclass(frozen=True, slots=True)
class Personality:
    """The personality routine a CIE names: `target` is what its pointer field encodes (the
    address of a slot holding the routine's address when `indirect`)."""

    target: int
    indirect: bool


# The personality routines known to read an LSDA in GCC's format (the call-site table,
# LPStart, the action and type tables of .gcc_except_table): libstdc++'s and libgcc's (also
# their SJLJ forms), GNU Objective-C's, and Rust's (its personality parses GCC's tables). An
# LSDA is read only under one of these; a function whose CIE names another routine has no
# window (issue 46: analysis/check.py's window-foreign-personality).
GCC_LSDA_PERSONALITIES = frozenset({
    "__gxx_personality_v0", "__gcc_personality_v0", "__gxx_personality_sj0",
    "__gcc_personality_sj0", "__gnu_objc_personality_v0", "rust_eh_personality"})


def foreign_personality(image: ElfImage, cie: Cie) -> str | None:
    """None when `cie` names no personality routine, or one of GCC_LSDA_PERSONALITIES;
    else the routine, described (its symbol's name, or why it cannot be named). The pointer
    is followed as the unwinder does: through the slot of an indirect one (its relocation's
    symbol, or the address the slot or its relative relocation holds), to a symbol at that
    address. Computed once per CIE."""
    memo = image.derived.setdefault("foreign_personality", {})
    assert isinstance(memo, dict)
    if cie.address in memo:
        got: str | None = memo[cie.address]
        return got
    got = _foreign(image, cie)
    memo[cie.address] = got
    return got


def _foreign(image: ElfImage, cie: Cie) -> str | None:
    if cie.personality_at is None or cie.personality_encoding == DW_EH_PE_omit:
        return None
    try:
        p = personality_of(image, cie)
    except UnsupportedError as exc:
        return f"a personality routine that cannot be named ({exc})"
    names: list[str] = []
    address: int | None = p.target
    if p.indirect:
        address = None
        rel = loader_relocations(image)
        for i in (i for i, place in enumerate(rel.places) if place == p.target):
            if rel.symbols[i]:
                name = symbol_name_of(image, rel.tables[rel.table[i]].symtab, rel.symbols[i])
                if name:
                    names.append(name)
            else:
                address = rel.addends[i]
        if not names and address is None:
            raw = image.read_vaddr(p.target, 8)
            address = int.from_bytes(raw, "little") if len(raw) == 8 else None
    if address is not None and not names:
        names = names_at(image, address)
    if any(n.split("@")[0] in GCC_LSDA_PERSONALITIES for n in names):
        return None
    where = f" (the CIE at {cie.address:#x})"
    if names:
        return f"the personality routine {names[0]}{where}"
    return (f"an unnamed personality routine at {address:#x}{where}" if address is not None
            else f"a personality routine no symbol names{where}")


def personality_of(image: ElfImage, cie: Cie) -> Personality:
    """The personality of `cie`, as a position-independent reference, or UnsupportedError."""
    if cie.personality_at is None or cie.personality_encoding == DW_EH_PE_omit:
        raise UnsupportedError("the function's CIE names no personality routine")
    enc = cie.personality_encoding
    target = _encoded_target(image, cie.personality_at, enc, "the CIE's personality pointer")
    return Personality(target, bool(enc & DW_EH_PE_indirect))


def _encoded_target(image: ElfImage, at: int, enc: int, what: str) -> int:
    """The address a pointer field at `at` encodes, before any indirection."""
    code = pointer_code(enc, 8)
    if code is None:
        raise UnsupportedError(f"{what}: a LEB128 pointer")
    size = struct.calcsize(code)
    raw = image.read_vaddr(at, size)
    if len(raw) < size:
        raise UnsupportedError(f"{what} at {at:#x} is not in the file")
    val: int = struct.unpack("<" + code, raw)[0]
    app = enc & 0x70
    if app == DW_EH_PE_pcrel:
        return (at + val) & 0xFFFFFFFFFFFFFFFF if val else 0
    if app == 0 and image.type != ET_DYN:
        return val & 0xFFFFFFFFFFFFFFFF
    raise UnsupportedError(f"{what}: encoding {enc:#04x} cannot be moved")


def build_personality_cie(cie_addr: int, personality: Personality) -> bytes:
    """A CIE at `cie_addr` for detour FDEs that carry an LSDA: version 1, "zPLR", the
    personality pcrel|sdata4 (indirect when the original's is), LSDA and FDE pointers
    pcrel|sdata4, no initial rules."""
    pcrel4 = DW_EH_PE_pcrel | DW_EH_PE_sdata4
    penc = pcrel4 | (DW_EH_PE_indirect if personality.indirect else 0)
    head = (struct.pack("<I", 0) + b"\x01" + b"zPLR\0" + uleb(DETOUR_CODE_ALIGN)
            + sleb(DETOUR_DATA_ALIGN) + bytes([RIP]))
    aug_len = 1 + 4 + 1 + 1
    # the personality field: after the length (4), the head, the augmentation length, its enc
    field_at = cie_addr + 4 + len(head) + len(uleb(aug_len)) + 1
    body = (head + uleb(aug_len) + bytes([penc])
            + _field("i", personality.target - field_at, "CIE personality pointer")
            + bytes([pcrel4, pcrel4]))
    body += b"\0" * ((-(len(body) + 4)) % 8)
    return struct.pack("<I", len(body)) + body


@dataclass(frozen=True, slots=True)
class LsdaRow:
    """One call-site entry of a detour's LSDA, in absolute addresses."""

    start: int
    end: int
    landing_pad: int | None
    action: int


def detour_call_sites(lsda: Lsda, spans: list[tuple[int, int, int, int, bool]]
                      ) -> list[LsdaRow]:
    """The call-site rows of a detour: `spans` are (original start, original end, detour
    start, detour end, a moved call) of each relocated instruction. Each copy gets the row of
    the original entry covering the original instruction's address, where a signal frame's
    pc is looked up (a fault at it, -fnon-call-exceptions); a moved call's return address
    minus one, where the unwinder looks for a frame that called, gets the row covering the
    original's (the copy's bytes after its first). Adjacent equal rows are merged; what the
    original table leaves out gets no row (std::terminate there, as in the original)."""
    rows: list[LsdaRow] = []

    def add(start: int, end: int, cs: CallSite | None) -> None:
        if cs is None or not start < end:
            return
        if rows and rows[-1].end == start and rows[-1].landing_pad == cs.landing_pad \
                and rows[-1].action == cs.action:
            rows[-1] = LsdaRow(rows[-1].start, end, cs.landing_pad, cs.action)
        else:
            rows.append(LsdaRow(start, end, cs.landing_pad, cs.action))

    def entry(at: int) -> CallSite | None:
        return next((c for c in lsda.call_sites if c.start <= at < c.end), None)

    for o_start, o_end, n_start, n_end, call in spans:
        if not o_start < o_end:
            continue
        if call:
            add(n_start, n_start + 1, entry(o_start))
            add(n_start + 1, n_end, entry(o_end - 1))
        else:
            add(n_start, n_end, entry(o_start))
    return rows


def build_detour_lsda(image: ElfImage, lsda: Lsda, at: int, region_start: int,
                      rows: list[LsdaRow]) -> bytes:
    """The bytes of an LSDA placed at `at` for the FDE region starting at `region_start`,
    with `rows` as its call-site table and the original's actions and types.

    UnsupportedError when the original's tables cannot be carried over (an encoding that
    would need a relocation at its new place, a malformed action chain)."""
    pcrel4 = DW_EH_PE_pcrel | DW_EH_PE_sdata4
    pads = [r.landing_pad for r in rows if r.landing_pad is not None]
    lp_start = min([lsda.lp_start, *pads]) - 1 if pads else lsda.lp_start
    cs = bytearray()
    for r in sorted(rows, key=lambda r: r.start):
        if r.start < region_start:
            raise UnsupportedError("a call-site row starts before its region")
        cs += uleb(r.start - region_start) + uleb(r.end - r.start)
        cs += uleb(r.landing_pad - lp_start if r.landing_pad is not None else 0)
        cs += uleb(r.action)
    block, types = _lsda_tail(image, lsda, [r.action for r in rows if r.action])
    tt_enc = lsda.ttype_encoding if lsda.ttype_base is not None else DW_EH_PE_omit
    after_cs = bytes([DW_EH_PE_uleb128]) + uleb(len(cs)) + bytes(cs)
    head = bytearray([pcrel4])
    head += _field("i", lp_start - (at + 1), "LSDA LPStart")
    head.append(tt_enc)
    tt_field = b""
    if tt_enc != DW_EH_PE_omit:
        assert lsda.ttype_base is not None
        tt_field = uleb(len(after_cs) + (lsda.ttype_base - lsda.actions))
    out = bytearray(head + tt_field + after_cs)
    block_at = at + len(out)
    shift = block_at - lsda.actions
    buf = bytearray(block)
    if types:
        assert lsda.ttype_base is not None
        code = pointer_code(tt_enc, 8)
        if code is None:
            raise UnsupportedError("the LSDA's type table uses LEB128 pointers")
        size = struct.calcsize(code)
        app = tt_enc & 0x70
        for i in range(1, max(types) + 1):
            old_at = lsda.ttype_base - i * size
            pos = old_at - lsda.actions
            if pos < 0:
                raise UnsupportedError("the LSDA's type table overlaps its action table")
            (val,) = struct.unpack_from("<" + code, buf, pos)
            if val == 0:
                continue  # a catch-all: stays 0
            if app == DW_EH_PE_pcrel:
                new = val - shift
                if code.islower() and not -(1 << (8 * size - 1)) <= new < 1 << (8 * size - 1):
                    raise UnsupportedError("a type table pointer is out of reach after the move")
                struct.pack_into("<" + code, buf, pos, new & ((1 << (8 * size)) - 1)
                                 if code.isupper() else new)
            elif app == 0 and image.type != ET_DYN:
                continue  # an absolute address: the same wherever the table is
            else:
                raise UnsupportedError(f"type table encoding {tt_enc:#04x} cannot be moved")
    out += buf
    return bytes(out)


def _lsda_tail(image: ElfImage, lsda: Lsda, actions: list[int]) -> tuple[bytes, list[int]]:
    """The bytes from the action table to the end of what `actions` reach (action records,
    the type table, the exception specifications), and the type indices they use."""
    read = image.read_vaddr
    ends = [lsda.actions]
    types: list[int] = []
    specs: list[int] = []
    seen: set[int] = set()
    for a in actions:
        pos = lsda.actions + a - 1
        for _ in range(10000):
            if pos in seen:
                break
            seen.add(pos)
            raw = read(pos, 32)
            filt, n = leb_bytes(raw, 0, True)
            nxt, m = leb_bytes(raw, n, True)
            ends.append(pos + m)
            if filt > 0:
                types.append(filt)
            elif filt < 0:
                specs.append(-filt - 1)
            if nxt == 0:
                break
            pos = pos + n + nxt
        else:
            raise UnsupportedError("the LSDA's action chain does not end")
    if types or specs:
        if lsda.ttype_base is None:
            raise UnsupportedError("the LSDA's actions name types but it has no type table")
        ends.append(lsda.ttype_base)
    for off in specs:
        assert lsda.ttype_base is not None
        pos = lsda.ttype_base + off
        for _ in range(10000):
            raw = read(pos, 16)
            idx, n = leb_bytes(raw, 0, False)
            pos += n
            if idx == 0:
                break
            types.append(idx)
        else:
            raise UnsupportedError("an exception specification list does not end")
        ends.append(pos)
    end = max(ends)
    data = read(lsda.actions, end - lsda.actions)
    if len(data) < end - lsda.actions:
        raise UnsupportedError("the LSDA's tables run past the file")
    return bytes(data), types
