"""Disassembly for analysis and display. The only module that imports capstone.

Deferred imports: capstone, and ctypes with importlib (the binding of capstone's C library,
`_lite`), when something is first decoded (`check` of a file of NOP sites decodes nothing);
x86/lengths.py (iced-x86) for the instructions capstone does not know.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Any, NamedTuple


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
        out.append(Insn(address=ins.address, size=ins.size, raw=bytes(ins.bytes),
                        mnemonic=ins.mnemonic, op_str=ins.op_str))
    return out


class LiteInsn(NamedTuple):
    """One row of `disassemble_lite`, named (`LiteInsn._make(row)`)."""

    address: int
    size: int
    mnemonic: str
    op_str: str


def disassemble_lite(code: bytes, address: int, mode64: bool = True
                     ) -> list[tuple[int, int, str, str]]:
    """(address, size, mnemonic, op_str) of each instruction that decodes from the start of
    `code`, in AT&T syntax: `disassemble` without the bytes, several times faster."""
    return _lite_rows(code, address, mode64)


# The capstone package loads the Python bindings of every architecture it supports when it is
# imported (about 35 ms of every `check`, a tenth of the command). The analysis needs one call
# of its C library, cs_disasm in AT&T syntax without details, so it binds that call itself:
# the library file the package would load first (LIBCAPSTONE_PATH, else the package's lib/),
# the same API version check as the package (5.0), the same handle options as `_capstone`.
# Anything unexpected falls back to the package.
_CS_ARCH_X86 = 3
_CS_MODE_32 = 1 << 2
_CS_MODE_64 = 1 << 3
_CS_OPT_SYNTAX = 1
_CS_OPT_SYNTAX_ATT = 2
_CS_API = (5, 0)


@cache
def _lite(mode64: bool) -> tuple[Any, Any, Any] | None:
    """(library, handle, cs_insn structure) of capstone's C library, or None."""
    import ctypes
    from importlib.util import find_spec

    try:
        where = os.environ.get("LIBCAPSTONE_PATH")
        if where is None:
            spec = find_spec("capstone")
            if spec is None or not spec.submodule_search_locations:
                return None
            where = os.path.join(next(iter(spec.submodule_search_locations)), "lib")
        path = os.path.join(where, "libcapstone.so")
        if not os.path.exists(path):
            return None
        lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_DEEPBIND", 0))

        class CsInsn(ctypes.Structure):
            _fields_ = (("id", ctypes.c_uint), ("address", ctypes.c_uint64),
                        ("size", ctypes.c_uint16), ("bytes", ctypes.c_ubyte * 24),
                        ("mnemonic", ctypes.c_char * 32), ("op_str", ctypes.c_char * 160),
                        ("detail", ctypes.c_void_p))

        lib.cs_version.restype = ctypes.c_int
        lib.cs_version.argtypes = (ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
        lib.cs_open.restype = ctypes.c_int
        lib.cs_open.argtypes = (ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_size_t))
        lib.cs_option.restype = ctypes.c_int
        lib.cs_option.argtypes = (ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        lib.cs_disasm.restype = ctypes.c_size_t
        lib.cs_disasm.argtypes = (ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                  ctypes.c_uint64, ctypes.c_size_t,
                                  ctypes.POINTER(ctypes.POINTER(CsInsn)))
        lib.cs_errno.restype = ctypes.c_int
        lib.cs_errno.argtypes = (ctypes.c_size_t,)
        lib.cs_free.restype = None
        lib.cs_free.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.cs_version(ctypes.byref(major), ctypes.byref(minor))
        if (major.value, minor.value) != _CS_API:
            return None
        handle = ctypes.c_size_t()
        if lib.cs_open(_CS_ARCH_X86, _CS_MODE_64 if mode64 else _CS_MODE_32,
                       ctypes.byref(handle)) != 0:
            return None
        if lib.cs_option(handle, _CS_OPT_SYNTAX, _CS_OPT_SYNTAX_ATT) != 0:
            return None
        return lib, handle, CsInsn
    except (OSError, AttributeError, ValueError, TypeError):
        return None


def _lite_rows(code: bytes, address: int, mode64: bool) -> list[tuple[int, int, str, str]]:
    """What capstone's `Cs.disasm_lite(code, address)` yields (same library, same options)."""
    lite = _lite(mode64)
    if lite is None:
        return list(_capstone(mode64).disasm_lite(code, address))
    import ctypes

    lib, handle, insn_type = lite
    first = ctypes.POINTER(insn_type)()
    count = lib.cs_disasm(handle, bytes(code), len(code), address, 0, ctypes.byref(first))
    if count <= 0:
        if lib.cs_errno(handle) == 0:  # CS_ERR_OK: the first bytes do not decode
            return []
        return list(_capstone(mode64).disasm_lite(code, address))  # its CsError
    try:
        # the array as bytes, unpacked by one struct (reading each field through ctypes costs
        # several times more); the strings end at their first NUL (what follows it is stale)
        raw = ctypes.string_at(first, count * ctypes.sizeof(insn_type))
        return [(a, n, m.partition(b"\0")[0].decode("ascii"),
                 o.partition(b"\0")[0].decode("ascii"))
                for a, n, m, o in _cs_rows(ctypes.sizeof(insn_type)).iter_unpack(raw)]
    finally:
        lib.cs_free(first, count)


@cache
def _cs_rows(size: int) -> struct.Struct:
    """cs_insn as it is laid out on x86-64 (id, address, size, bytes[24], mnemonic[32],
    op_str[160], detail): address, size, mnemonic and op_str."""
    if size != 248:
        raise ValueError(f"cs_insn of {size} bytes")
    return struct.Struct("<8xQH24x32s160s14x")


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


class CodeInsn(NamedTuple):
    """One instruction of a linear sweep, with the facts the site analysis reads.

    A named tuple rather than a frozen dataclass: a sweep of libjvm.so's probed functions makes
    37,000 of them, and a tuple is built several times faster."""

    address: int
    size: int
    mnemonic: str  # capstone AT&T mnemonic, prefixes included ("notrack jmpq", "repz retq")
    op_str: str
    flow: Flow
    target: int | None  # direct branch or call target
    mem: MemRef | None  # the memory operand, if any (x86 has at most one)
    rip_target: int | None  # absolute address of a rip-relative memory operand (or lea)
    base_mnemonic: str = ""  # the mnemonic without prefixes ("jmpq" of "notrack jmpq")

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.op_str}".strip()

    @property
    def operands(self) -> list[str]:
        """The AT&T operands, source first (split on ', ' outside parentheses)."""
        got = _OPERANDS.get(self.op_str)
        if got is None:
            got = split_operands(self.op_str)
            if len(_OPERANDS) < _MAX_FACTS:
                _OPERANDS[self.op_str] = got
        return list(got)


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
            return MemRef(disp=_int(m.group("disp")), base=None, index=None, scale=1,
                          segment=m.group("seg"))
        return None
    m = _MEM_RE.search(op_str)
    if m is None:
        return None
    disp = _int(m.group("disp")) if m.group("disp") else 0
    base = m.group("base")[1:] if m.group("base") else None
    index = m.group("index")[1:] if m.group("index") else None
    scale = int(m.group("scale")) if m.group("scale") else 1
    seg = m.group("seg")[1:] if m.group("seg") else None
    return MemRef(disp=disp, base=base, index=index, scale=scale, segment=seg)


def sweep(code: bytes, address: int, mode64: bool = True) -> Sweep:
    """Decode `code` (at link-time `address`) from start to end, once.

    Bytes that do not decode are recorded in `bad` and skipped one at a time, so the sweep
    always reaches the end; a caller treats a sweep with bad bytes as not understood.
    """
    insns: list[CodeInsn] = []
    bad: list[int] = []
    pos = 0
    end = len(code)
    while pos < end:
        bare: list[int] = []
        made = _made(_lite_rows(code[pos:], address + pos, mode64), bare)
        for k in bare:
            made[k] = _relative(made[k], code, address, mode64)
        if made:
            insns += made
            pos = made[-1].address - address + made[-1].size
        if pos < end:
            other = _by_length(code[pos:pos + 15], address + pos, mode64)
            if other is not None:
                insns.append(other)
                pos += other.size
                continue
            bad.append(address + pos)
            pos += 1
    return Sweep(address, address + end, tuple(insns), tuple(bad))


# an operand that is a bare address (no `$`, no parentheses): a relative branch target, or an
# absolute memory operand (movabs's moffs)
_BARE = re.compile(r"(?:^|, )-?(?:0x)?[0-9a-f]+(?:,|$)")


def _relative(ins: CodeInsn, code: bytes, address: int, mode64: bool) -> CodeInsn:
    """`ins` (an instruction capstone's mnemonic does not make a branch, showing a bare
    address) as a branch when iced-x86's operand kinds say that one of its operands is a
    near relative target (`xbegin`'s fallback, and any other such instruction): it may go
    on to the next instruction or to its target (Flow.JCC), as a conditional jump does."""
    from usdtpatch.x86.lengths import relative_target

    at = ins.address - address
    target = relative_target(code[at:at + ins.size], ins.address, mode64)
    if target is None:
        return ins
    return ins._replace(flow=Flow.JCC, target=target)


def _by_length(code: bytes, address: int, mode64: bool) -> CodeInsn | None:
    """An instruction capstone does not decode, decoded by iced-x86 (usdtpatch.x86.lengths):
    its length and text, when it is one that falls through
    to the next instruction (`serialize` and other instructions newer than capstone's
    tables); None when iced does not know it either, or it passes control elsewhere."""
    from usdtpatch.x86.lengths import decode_one

    got = decode_one(code, address, mode64)
    if got is None:
        return None
    size, mnemonic, op_str = got
    return _make(address, size, mnemonic, op_str)


_OPERANDS: dict[str, list[str]] = {}  # op_str -> split_operands(op_str), copied out
_Facts = tuple[str, Flow, int | None, MemRef | None]
_FACTS: dict[tuple[str, str], _Facts] = {}  # (mnemonic, op_str) -> what _facts says
_MAX_FACTS = 1 << 16


def _facts(mnemonic: str, op_str: str) -> _Facts:
    """(base mnemonic, flow, direct target, memory operand) of an instruction's text."""
    base = mnemonic.rsplit(maxsplit=1)[-1] if mnemonic else mnemonic
    flow = _flow(base)
    target: int | None = None
    mem: MemRef | None = None
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
    return base, flow, target, mem


def _make(addr: int, size: int, mnemonic: str, op_str: str) -> CodeInsn:
    key = (mnemonic, op_str)
    facts = _FACTS.get(key)
    if facts is None:
        facts = _facts(mnemonic, op_str)
        if facts[2] is None and len(_FACTS) < _MAX_FACTS:  # not a direct branch's own target
            _FACTS[key] = facts
    base, flow, target, mem = facts
    rip_target = addr + size + mem.disp if mem is not None and mem.base == "rip" else None
    return _new_insn(CodeInsn, (addr, size, mnemonic, op_str, flow, target, mem, rip_target,
                                base))


_new_insn = tuple.__new__  # CodeInsn(...) without the generated __new__'s extra call

_PLAIN: dict[str, tuple[str, Flow]] = {}  # mnemonic -> (base, flow)


def _made(rows: list[tuple[int, int, str, str]], bare: list[int] | None = None
          ) -> list[CodeInsn]:
    """`_make` of each row, inline: an instruction that passes control on to the next one
    without a memory operand (its facts are its mnemonic's), a direct branch (its target its
    operand), the rest through `_make`'s memo of facts. `bare` is given the index of each
    instruction that is no branch by its mnemonic but shows a bare address (`_BARE`): the
    caller asks the decoder's operand kinds whether it is a relative target (`_relative`)."""
    out: list[CodeInsn] = []
    facts_get = _FACTS.get
    add = out.append
    plain = _PLAIN
    branch = (Flow.JMP, Flow.JCC, Flow.CALL)
    none = Flow.NONE
    for addr, size, mnemonic, op_str in rows:
        got = plain.get(mnemonic)
        if got is None:
            base = mnemonic.rsplit(maxsplit=1)[-1] if mnemonic else mnemonic
            got = plain[mnemonic] = (base, _flow(base))
        base, flow = got
        if flow is none:
            if "(" not in op_str and ":" not in op_str:
                if bare is not None and op_str and op_str[0] != "%" and "$" not in op_str \
                        and _BARE.search(op_str):
                    bare.append(len(out))
                add(_new_insn(CodeInsn, (addr, size, mnemonic, op_str, flow, None, None, None,
                                         base)))
                continue
        elif flow in branch and op_str[:2] == "0x":
            try:
                direct = int(op_str, 16)
            except ValueError:
                pass
            else:
                add(_new_insn(CodeInsn, (addr, size, mnemonic, op_str, flow, direct, None,
                                         None, base)))
                continue
        key = (mnemonic, op_str)
        facts = facts_get(key)
        if facts is None:
            facts = _facts(mnemonic, op_str)
            if facts[2] is None and len(_FACTS) < _MAX_FACTS:
                _FACTS[key] = facts
        base, flow, target, mem = facts
        add(_new_insn(CodeInsn, (addr, size, mnemonic, op_str, flow, target, mem,
                                 addr + size + mem.disp if mem is not None and mem.base == "rip"
                                 else None, base)))
    return out
