"""Disassembly for analysis and display. The only module that imports capstone."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Any


@dataclass(frozen=True, slots=True)
class Insn:
    address: int
    size: int
    raw: bytes
    mnemonic: str
    op_str: str

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.op_str}".strip()


@cache
def _capstone(mode64: bool) -> Any:
    import capstone

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64 if mode64 else capstone.CS_MODE_32)
    md.syntax = capstone.CS_OPT_SYNTAX_ATT
    return md


def disassemble(code: bytes, address: int, count: int = 0, mode64: bool = True) -> list[Insn]:
    """Decode up to `count` instructions (0: all that decode) in AT&T syntax."""
    out: list[Insn] = []
    for ins in _capstone(mode64).disasm(code, address, count):
        out.append(Insn(ins.address, ins.size, bytes(ins.bytes), ins.mnemonic, ins.op_str))
    return out


def describe(code: bytes, address: int, count: int = 1, mode64: bool = True) -> str:
    """A one-line disassembly of the first `count` instructions, `(bad)` when none decodes."""
    insns = disassemble(code, address, count, mode64)
    return "; ".join(i.text for i in insns) if insns else "(bad)"


# ---------------------------------------------------------------------------------------------
# The analysis view: one linear sweep per function, fast (capstone's disasm_lite, no detail
# objects), with the few operand facts the site analysis needs parsed from the AT&T text.
# ---------------------------------------------------------------------------------------------

_JCC = frozenset(
    "jo jno jb jae je jne jbe ja js jns jp jnp jl jge jle jg jrcxz jecxz jcxz loop loope "
    "loopne".split()
)
_STOP = frozenset({"ud2", "hlt", "int3", "ud1", "ud0"})
_MEM_RE = re.compile(
    r"(?:(?P<seg>%[a-z]s):)?(?P<disp>-?0x[0-9a-f]+|-?\d+)?"
    r"\((?P<base>%\w+)?(?:, (?P<index>%\w+)?(?:, (?P<scale>\d))?)?\)"
)
_SEG_ABS_RE = re.compile(r"%(?P<seg>[a-z]s):(?P<disp>-?0x[0-9a-f]+|-?\d+)(?![(\w])")


class Flow(Enum):
    """How an instruction passes control on."""

    NONE = "none"  # falls through
    JMP = "jmp"  # direct unconditional jump
    JCC = "jcc"  # direct conditional jump (jcc, jrcxz, loop*)
    CALL = "call"  # direct call
    RET = "ret"
    JMP_INDIRECT = "jmp-indirect"
    CALL_INDIRECT = "call-indirect"
    STOP = "stop"  # ud2, hlt, int3: no fall-through used by compilers
    SYSCALL = "syscall"  # syscall, int: falls through


@dataclass(frozen=True, slots=True)
class MemRef:
    """A memory operand: disp(base, index, scale), register names without %."""

    disp: int
    base: str | None
    index: str | None
    scale: int
    segment: str | None = None


@dataclass(frozen=True, slots=True)
class CodeInsn:
    """One instruction of a linear sweep, with the facts the site analysis reads."""

    address: int
    size: int
    mnemonic: str  # capstone AT&T mnemonic, prefixes included ("notrack jmpq", "repz retq")
    op_str: str
    flow: Flow
    target: int | None  # direct branch or call target
    mem: MemRef | None  # the memory operand, if any (x86 has at most one)
    rip_target: int | None  # absolute address of a rip-relative memory operand (or lea)

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.op_str}".strip()

    @property
    def base_mnemonic(self) -> str:
        """The mnemonic without prefixes and without the AT&T size suffix of common ones."""
        return self.mnemonic.split()[-1]

    @property
    def operands(self) -> list[str]:
        """The AT&T operands, source first (split on ', ' outside parentheses)."""
        return split_operands(self.op_str)


@dataclass(frozen=True, slots=True)
class Sweep:
    """A linear sweep of [start, end): the instructions and where decoding failed."""

    start: int
    end: int
    insns: tuple[CodeInsn, ...]
    bad: tuple[int, ...]  # addresses of bytes that did not decode (skipped one at a time)


def split_operands(op_str: str) -> list[str]:
    out: list[str] = []
    depth = 0
    cur = ""
    i = 0
    while i < len(op_str):
        ch = op_str[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            i += 1
            continue
        cur += ch
        i += 1
    if cur.strip():
        out.append(cur.strip())
    return out


def _flow(base: str) -> Flow:
    if base in ("jmp", "jmpq"):
        return Flow.JMP
    if base in _JCC:
        return Flow.JCC
    if base in ("call", "callq"):
        return Flow.CALL
    if base in ("ret", "retq", "retf", "retfq", "iret", "iretq", "sysret", "sysretq"):
        return Flow.RET
    if base in _STOP:
        return Flow.STOP
    if base in ("syscall", "int", "sysenter"):
        return Flow.SYSCALL
    return Flow.NONE


def _int(text: str) -> int:
    return int(text, 0)


def _parse_mem(op_str: str) -> MemRef | None:
    if "(" not in op_str:
        m = _SEG_ABS_RE.search(op_str)
        if m:
            return MemRef(_int(m.group("disp")), None, None, 1, m.group("seg"))
        return None
    m = _MEM_RE.search(op_str)
    if m is None:
        return None
    disp = _int(m.group("disp")) if m.group("disp") else 0
    base = m.group("base")[1:] if m.group("base") else None
    index = m.group("index")[1:] if m.group("index") else None
    scale = int(m.group("scale")) if m.group("scale") else 1
    seg = m.group("seg")[1:] if m.group("seg") else None
    return MemRef(disp, base, index, scale, seg)


def sweep(code: bytes, address: int, mode64: bool = True) -> Sweep:
    """Decode `code` (at link-time `address`) from start to end, once.

    Bytes that do not decode are recorded in `bad` and skipped one at a time, so the sweep
    always reaches the end; a caller treats a sweep with bad bytes as not understood.
    """
    md = _capstone(mode64)
    insns: list[CodeInsn] = []
    bad: list[int] = []
    pos = 0
    end = len(code)
    while pos < end:
        last = pos
        for addr, size, mnemonic, op_str in md.disasm_lite(code[pos:], address + pos):
            insns.append(_make(addr, size, mnemonic, op_str))
            last = addr - address + size
        pos = last
        if pos < end:
            bad.append(address + pos)
            pos += 1
    return Sweep(address, address + end, tuple(insns), tuple(bad))


def _make(addr: int, size: int, mnemonic: str, op_str: str) -> CodeInsn:
    base = mnemonic.rsplit(maxsplit=1)[-1] if mnemonic else mnemonic
    flow = _flow(base)
    target: int | None = None
    mem: MemRef | None = None
    rip_target: int | None = None
    if flow in (Flow.JMP, Flow.JCC, Flow.CALL):
        if op_str.startswith("*"):
            flow = Flow.JMP_INDIRECT if flow is Flow.JMP else Flow.CALL_INDIRECT
            mem = _parse_mem(op_str)
        else:
            try:
                target = int(op_str, 16)
            except ValueError:
                flow = Flow.JMP_INDIRECT if flow is Flow.JMP else Flow.CALL_INDIRECT
    elif "(" in op_str or ":" in op_str:
        mem = _parse_mem(op_str)
    if mem is not None and mem.base == "rip":
        rip_target = addr + size + mem.disp
    return CodeInsn(addr, size, mnemonic, op_str, flow, target, mem, rip_target)
