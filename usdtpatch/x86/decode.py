"""Disassembly for analysis and display. The only module that imports capstone."""

from __future__ import annotations

from dataclasses import dataclass
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
