"""Writing call frame information: a moved copy of `.eh_frame`, FDEs for detours, a new
`.eh_frame_hdr`, and the CFA-rule interpreter they need.

References: the LSB "Exception Frames" chapter (.eh_frame CIE/FDE layout, the DW_EH_PE pointer
encodings, the .eh_frame_hdr binary-search table) and DWARF 4 section 6.4 (call frame
instructions). Reading FDEs for analysis lives in usdtpatch/elf/cfi.py and is reused here.

Why a copy: section-based readers (gdb, readelf, libdw) read one `.eh_frame` section; the
runtime unwinder (libgcc) reads PT_GNU_EH_FRAME's table. The rewritten file gets one complete
`.eh_frame` in the new segment (every original entry, its pc-relative pointers adjusted for
the move, then the detours' CIE and FDEs) and one table covering all of it; the original
sections stay in place, untouched, renamed `.eh_frame.orig` / `.eh_frame_hdr.orig` so that no
reader sees two tables.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from usdtpatch.elf.cfi import Fde
from usdtpatch.errors import UnsupportedError

DW_EH_PE_omit = 0xFF
DW_EH_PE_pcrel = 0x10
DW_EH_PE_datarel = 0x30
DW_EH_PE_sdata4 = 0x0B
DW_EH_PE_udata4 = 0x03
_FIXED_SIZES = {0x02: 2, 0x03: 4, 0x04: 8, 0x0A: 2, 0x0B: 4, 0x0C: 8}
_SIGNED = {0x0A: "h", 0x0B: "i", 0x0C: "q"}
_UNSIGNED = {0x02: "H", 0x03: "I", 0x04: "Q"}

RSP = 7  # DWARF register numbers on x86-64
RIP = 16


def _leb(data: bytes | bytearray, pos: int, signed: bool) -> tuple[int, int]:
    """(value, position after it) of the ULEB128/SLEB128 at data[pos]."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise UnsupportedError("LEB128 runs past the end of .eh_frame")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            if signed and b & 0x40:
                result -= 1 << shift
            return result, pos


def _uleb(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    return _leb(data, pos, False)


def _sleb(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    return _leb(data, pos, True)


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


def _ptr_size(enc: int, word: int) -> int:
    fmt = enc & 0x0F
    if fmt == 0:
        return word
    if fmt in _FIXED_SIZES:
        return _FIXED_SIZES[fmt]
    raise UnsupportedError(f".eh_frame pointer encoding {enc:#04x} is variable-length")


@dataclass
class _CieInfo:
    aug: str
    fde_enc: int = 0
    lsda_enc: int = DW_EH_PE_omit


def _move_field(buf: bytearray, pos: int, enc: int, shift: int, word: int, dyn: bool,
                what: str) -> int:
    """Adjust a pointer field at buf[pos] for a move of `shift` bytes; return its size."""
    if enc == DW_EH_PE_omit:
        return 0
    size = _ptr_size(enc, word)
    app = enc & 0x70
    if app == DW_EH_PE_pcrel:
        fmt = enc & 0x0F
        code = _SIGNED.get(fmt) or _UNSIGNED.get(fmt) or ("q" if word == 8 else "i")
        (val,) = struct.unpack_from("<" + code, buf, pos)
        new = val - shift
        mask = (1 << (8 * size)) - 1
        if code.isupper():
            new &= mask
        elif not -(1 << (8 * size - 1)) <= new < (1 << (8 * size - 1)):
            raise UnsupportedError(f"{what}: pc-relative pointer out of range after the move")
        struct.pack_into("<" + code, buf, pos, new)
    elif app == 0 and dyn and enc & 0x0F == 0:
        raise UnsupportedError(f"{what}: absolute pointer in a position-independent file "
                               f"(it would need a dynamic relocation at its new place)")
    elif app not in (0, DW_EH_PE_pcrel):
        raise UnsupportedError(f"{what}: pointer encoding {enc:#04x} cannot be moved")
    return size


def copy_eh_frame(data: bytes, old_addr: int, new_addr: int, word: int, dyn: bool
                  ) -> tuple[bytes, list[tuple[int, int]]]:
    """Copy the entries of an `.eh_frame` section (bytes `data` at `old_addr`) for `new_addr`.

    Returns the copy without a terminator, and (pc_begin, new FDE address) for every FDE.
    """
    shift = new_addr - old_addr
    buf = bytearray(data)
    cies: dict[int, _CieInfo] = {}
    fdes: list[tuple[int, int]] = []
    pos = 0
    while pos + 4 <= len(buf):
        (length,) = struct.unpack_from("<I", buf, pos)
        if length == 0:
            break  # the terminator: what follows it is not read by anyone
        hl = 4
        if length == 0xFFFFFFFF:
            (length,) = struct.unpack_from("<Q", buf, pos + 4)
            hl = 12
        start, body, end = pos, pos + hl, pos + hl + length
        if end > len(buf):
            raise UnsupportedError(f".eh_frame+{pos:#x}: entry runs past the section")
        (cie_id,) = struct.unpack_from("<I", buf, body)
        if cie_id == 0:
            p = body + 5
            nul = buf.index(0, p)
            aug = buf[p:nul].decode("ascii", "replace")
            p = nul + 1
            if "eh" in aug:
                p += word
            _, p = _uleb(buf, p)
            _, p = _sleb(buf, p)
            if buf[body + 4] == 1:
                p += 1
            else:
                _, p = _uleb(buf, p)
            info = _CieInfo(aug)
            if aug.startswith("z"):
                _, p = _uleb(buf, p)
                for ch in aug[1:]:
                    if ch == "R":
                        info.fde_enc = buf[p]
                        p += 1
                    elif ch == "L":
                        info.lsda_enc = buf[p]
                        p += 1
                    elif ch == "P":
                        enc = buf[p]
                        p += 1 + _move_field(buf, p + 1, enc, shift, word, dyn,
                                             f".eh_frame+{start:#x} personality")
                    elif ch not in "SBG":
                        raise UnsupportedError(f".eh_frame+{start:#x}: augmentation {aug!r}")
            cies[start] = info
        else:
            cie_at = body - cie_id
            info_or_none = cies.get(cie_at)
            if info_or_none is None:
                raise UnsupportedError(f".eh_frame+{start:#x}: FDE before its CIE")
            info = info_or_none
            p = body + 4
            what = f".eh_frame+{start:#x}"
            fmt = info.fde_enc
            size = _ptr_size(fmt, word)
            code = _SIGNED.get(fmt & 0x0F) or _UNSIGNED.get(fmt & 0x0F) or "q"
            (raw_begin,) = struct.unpack_from("<" + code, data, p)
            pc_begin = raw_begin + (old_addr + p if fmt & 0x70 == DW_EH_PE_pcrel else 0)
            _move_field(buf, p, fmt, shift, word, dyn, what + " pc_begin")
            p += 2 * size
            if info.aug.startswith("z"):
                aug_len, q = _uleb(buf, p)
                if "L" in info.aug and aug_len:
                    _move_field(buf, q, info.lsda_enc, shift, word, dyn, what + " LSDA")
            fdes.append((pc_begin & ((1 << (8 * word)) - 1), new_addr + start))
        pos = end
    return bytes(buf[:pos]), fdes


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
    """The unwind rules in force at one address."""

    cfa: Cfa
    regs: tuple[tuple[int, Rule], ...] = ()

    def with_cfa_offset(self, delta: int) -> Row:
        if self.cfa.reg is None:
            raise UnsupportedError("the CFA is an expression here; the detour cannot adjust it")
        return Row(Cfa(self.cfa.reg, self.cfa.offset + delta), self.regs)


def rows_at(fde: Fde, addresses: list[int]) -> dict[int, Row]:
    """The row in force at each address (all inside `fde`), by running its CFA program."""
    cie = fde.cie
    want = sorted(set(addresses))
    out: dict[int, Row] = {}
    state: dict[str, object] = {"cfa": Cfa(RSP, 8)}
    regs: dict[int, Rule] = {}
    initial: dict[int, Rule] = {}
    stack: list[tuple[Cfa, dict[int, Rule]]] = []
    ca, da = cie.code_alignment, cie.data_alignment
    loc = fde.pc_begin

    def cfa() -> Cfa:
        value = state["cfa"]
        assert isinstance(value, Cfa)
        return value

    def flush(upto: int) -> None:
        while want and want[0] < upto:
            out[want.pop(0)] = Row(cfa(), tuple(sorted(regs.items())))

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
                stack.append((cfa(), dict(regs)))
            elif op == 0x0B:  # restore_state
                if not stack:
                    raise UnsupportedError("DW_CFA_restore_state with an empty stack")
                state["cfa"], regs = stack.pop()
            elif op in (0x0C, 0x12):  # def_cfa, def_cfa_sf
                reg, p = _uleb(prog, p)
                if op == 0x0C:
                    off, p = _uleb(prog, p)
                else:
                    off, p = _sleb(prog, p)
                    off *= da
                state["cfa"] = Cfa(reg, off)
            elif op == 0x0D:  # def_cfa_register
                reg, p = _uleb(prog, p)
                state["cfa"] = Cfa(reg, cfa().offset)
            elif op in (0x0E, 0x13):  # def_cfa_offset(_sf)
                if op == 0x0E:
                    off, p = _uleb(prog, p)
                else:
                    off, p = _sleb(prog, p)
                    off *= da
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
            elif op == 0x2E:  # GNU_args_size: no effect on the rules
                _, p = _uleb(prog, p)
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
    return out


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
    return bytes(out)


def build_fde(fde_addr: int, cie_addr: int, pc_begin: int, pc_end: int,
              rows: list[tuple[int, Row]]) -> bytes:
    """An FDE at `fde_addr` for [pc_begin, pc_end) whose rows change at the given addresses."""
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
    cie_ptr = fde_addr + 4 - cie_addr
    pc_field = fde_addr + 8
    body = (struct.pack("<I", cie_ptr) + struct.pack("<i", pc_begin - pc_field)
            + struct.pack("<I", pc_end - pc_begin) + uleb(0) + bytes(prog))
    body += b"\0" * ((-(len(body) + 4)) % 8)  # DW_CFA_nop padding
    return struct.pack("<I", len(body)) + body


def build_eh_frame_hdr(hdr_addr: int, eh_frame_addr: int,
                       table: list[tuple[int, int]]) -> bytes:
    """`.eh_frame_hdr` at `hdr_addr`: version 1, eh_frame_ptr pcrel|sdata4, count udata4,
    table datarel|sdata4 of (initial location, FDE address), sorted by location."""
    rows = sorted(table)
    out = bytearray([1, DW_EH_PE_pcrel | DW_EH_PE_sdata4, DW_EH_PE_udata4,
                     DW_EH_PE_datarel | DW_EH_PE_sdata4])
    out += struct.pack("<i", eh_frame_addr - (hdr_addr + 4))
    out += struct.pack("<I", len(rows))
    for loc, fde in rows:
        out += struct.pack("<ii", loc - hdr_addr, fde - hdr_addr)
    return bytes(out)
