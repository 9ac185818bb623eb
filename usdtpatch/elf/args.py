"""SDT argument specs: `[-]N[f]@OPERAND`, space separated, operands in AT&T syntax.

Reference: systemtap's sys/sdt.h argument format. N is the size in bytes (1, 2, 4, 8, or 16
for vector registers), a leading `-` means signed, an `f` after N marks a floating-point value
(newer systemtap). Operand forms seen in the wild on x86: `%reg`, `$imm`, `disp(%reg)`,
`sym(%rip)`, `sym+8(%rip)`, `(%base,%index,scale)`, `-16(%rbp)`, a bare absolute `sym` or
number, and in old notes a bare `%reg` with no `N@`.

An operand this parser does not understand is kept raw as an UnknownOperand with the reason:
it is never dropped. Only x86 operands are decoded; other architectures' specs are kept raw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

_REG64 = "rax rbx rcx rdx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15 rip".split()
_REG32 = "eax ebx ecx edx esi edi ebp esp r8d r9d r10d r11d r12d r13d r14d r15d eip".split()
_REG16 = "ax bx cx dx si di bp sp r8w r9w r10w r11w r12w r13w r14w r15w".split()
_REG8 = "al bl cl dl sil dil bpl spl ah bh ch dh r8b r9b r10b r11b r12b r13b r14b r15b".split()
_VEC = [f"{p}mm{i}" for p in "xyz" for i in range(32)] + [f"st{i}" for i in range(8)]
X86_REGISTERS = frozenset(_REG64 + _REG32 + _REG16 + _REG8 + _VEC)

_SIZED = re.compile(r"^(-?)(\d+)(f?)@(.*)$", re.DOTALL)
_NUM = r"[-+]?(?:0[xX][0-9a-fA-F]+|\d+)"
_SYM = r"[A-Za-z_.$][\w.$@]*"
# a displacement: `sym`, `sym+8`, `sym-8`, `8+sym` (as GCC writes some: `44+ckpt_stats`) or a number
_DISP = re.compile(rf"^(?:(?P<sym>{_SYM})(?P<off>[-+](?:0[xX][0-9a-fA-F]+|\d+))?"
                   rf"|(?P<lead>{_NUM})\+(?P<lsym>{_SYM})|(?P<num>{_NUM}))$")
_MEM = re.compile(r"^(?P<disp>[^()]*)\((?P<inner>[^()]*)\)$")


@dataclass(frozen=True, slots=True)
class RegOperand:
    reg: str  # without the %


@dataclass(frozen=True, slots=True)
class ImmOperand:
    value: int
    symbol: str | None = None


@dataclass(frozen=True, slots=True)
class MemOperand:
    disp: int
    symbol: str | None
    base: str | None  # register name without %, "rip" for rip-relative
    index: str | None
    scale: int


@dataclass(frozen=True, slots=True)
class UnknownOperand:
    text: str
    reason: str


Operand = RegOperand | ImmOperand | MemOperand | UnknownOperand


@dataclass(frozen=True, slots=True)
class SdtArg:
    raw: str
    size: int | None  # None for an old-style bare operand
    signed: bool
    is_float: bool
    operand: Operand

    @property
    def kind(self) -> str:
        op = self.operand
        if isinstance(op, RegOperand):
            return "register"
        if isinstance(op, ImmOperand):
            return "immediate"
        if isinstance(op, MemOperand):
            return "rip-relative" if op.base == "rip" else "memory"
        return "unknown"

    def uses_register(self, reg: str) -> bool:
        op = self.operand
        if isinstance(op, RegOperand):
            return op.reg == reg
        if isinstance(op, MemOperand):
            return reg in (op.base, op.index)
        return False


def split_args(text: str) -> list[str]:
    """Split an argument string on spaces that are outside brackets and parentheses."""
    if "(" not in text and "[" not in text:
        return text.split(" ") if text and "  " not in text and text.strip(" ") == text \
            else [t for t in text.split(" ") if t]
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]" and depth:
            depth -= 1
        if ch == " " and depth == 0:
            if cur:
                out.append("".join(cur))
                cur = []
            continue
        cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def parse_args(text: str, x86: bool = True) -> tuple[SdtArg, ...]:
    """Parse a note's argument string into SdtArgs (operands decoded only when `x86`)."""
    return tuple(parse_arg(tok, x86) for tok in split_args(text))


@lru_cache(maxsize=8192)  # argument specs repeat a lot across a binary's probes
def parse_arg(tok: str, x86: bool = True) -> SdtArg:
    m = _SIZED.match(tok)
    if m:
        if len(m.group(2)) > MAX_NUMBER_TEXT:
            return SdtArg(
                raw=tok, size=None, signed=m.group(1) == "-", is_float=bool(m.group(3)),
                operand=UnknownOperand(m.group(4), f"size of {len(m.group(2))} digits is not "
                                                   f"1, 2, 4, 8 or 16"))
        signed, size, flt, operand_text = m.group(1) == "-", int(m.group(2)), m.group(3), m.group(4)
        if not x86:
            return SdtArg(
                raw=tok, size=size, signed=signed, is_float=bool(flt),
                operand=UnknownOperand(operand_text, "operands of this architecture are kept "
                                                     "as text"))
        op = parse_operand(operand_text)
        if size not in (1, 2, 4, 8, 16) and not isinstance(op, UnknownOperand):
            op = UnknownOperand(operand_text, f"size {size} is not 1, 2, 4, 8 or 16")
        return SdtArg(raw=tok, size=size, signed=signed, is_float=bool(flt), operand=op)
    if not x86:
        return SdtArg(raw=tok, size=None, signed=False, is_float=False,
                      operand=UnknownOperand(tok, "operands of this architecture are kept as text"))
    op = parse_operand(tok)
    if not isinstance(op, RegOperand) and not isinstance(op, UnknownOperand):
        op = UnknownOperand(tok, "no N@ size prefix")
    return SdtArg(raw=tok, size=None, signed=False, is_float=False, operand=op)


def _disp_of(d: re.Match[str]) -> tuple[int, str | None]:
    """(number, symbol or None) of a _DISP match."""
    if d.group("num") is not None:
        return _parse_int(d.group("num")), None
    if d.group("lsym") is not None:
        return _parse_int(d.group("lead")), d.group("lsym")
    return (_parse_int(d.group("off")) if d.group("off") else 0), d.group("sym")


# The longest number an argument may hold: 2**64 is 20 decimal digits, 16 hex digits after
# 0x. A longer one is an operand not understood (int() refuses decimals of more than 4,300
# digits with a ValueError, issue 20 item 8; a shorter but huge one could not fit anyway).
MAX_NUMBER_TEXT = 24


class _TooLong(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_TEXT:
        raise _TooLong(text)
    return int(text, 0) if not re.fullmatch(r"[-+]?0\d+", text) else int(text, 10)


def _reg(text: str) -> str | None:
    text = text.strip()
    if text.startswith("%") and text[1:] in X86_REGISTERS:
        return text[1:]
    return None


def parse_operand(text: str) -> Operand:
    """One AT&T operand."""
    try:
        return _parse_operand(text)
    except _TooLong as exc:
        return UnknownOperand(text, f"number of {len(str(exc))} characters (at most "
                                    f"{MAX_NUMBER_TEXT})")


def _parse_operand(text: str) -> Operand:
    if not text:
        return UnknownOperand(text, "empty operand")
    if text.startswith("%"):
        if ":" in text:
            return UnknownOperand(text, "segment-relative operands are not supported")
        reg = _reg(text)
        return RegOperand(reg) if reg else UnknownOperand(text, f"unknown register {text}")
    if text.startswith("$"):
        body = text[1:]
        if re.fullmatch(_NUM, body):
            return ImmOperand(_parse_int(body))
        d = _DISP.match(body)
        if d and d.group("num") is None:
            value, sym = _disp_of(d)
            return ImmOperand(value, sym)
        return UnknownOperand(text, "immediate is not a number or symbol")
    m = _MEM.match(text)
    if m:
        disp_text, inner = m.group("disp"), m.group("inner")
        disp, sym = 0, None
        if disp_text:
            d = _DISP.match(disp_text)
            if not d:
                return UnknownOperand(text, f"displacement {disp_text!r} is not understood")
            disp, sym = _disp_of(d)
        parts = [p.strip() for p in inner.split(",")]
        if len(parts) > 3:
            return UnknownOperand(text, "more than base, index and scale")
        base = index = None
        scale = 1
        if parts[0]:
            base = _reg(parts[0])
            if base is None:
                return UnknownOperand(text, f"base {parts[0]!r} is not a register")
        if len(parts) >= 2:
            index = _reg(parts[1])
            if index is None:
                return UnknownOperand(text, f"index {parts[1]!r} is not a register")
        if len(parts) == 3:
            if parts[2] not in ("1", "2", "4", "8"):
                return UnknownOperand(text, f"scale {parts[2]!r} is not 1, 2, 4 or 8")
            scale = int(parts[2])
        if base is None and index is None:
            return UnknownOperand(text, "memory operand without base or index")
        return MemOperand(disp=disp, symbol=sym, base=base, index=index, scale=scale)
    d = _DISP.match(text)
    if d:  # a bare absolute address: `sym`, `sym+8`, `8+sym` or a number
        disp, sym = _disp_of(d)
        return MemOperand(disp=disp, symbol=sym, base=None, index=None, scale=1)
    return UnknownOperand(text, "not a register, immediate or memory operand")
