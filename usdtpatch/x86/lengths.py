"""The length and text of an instruction capstone does not know (`serialize`, 0f 01 e8, and
other instructions newer than capstone's tables), as iced-x86 decodes it: the fallback of
usdtpatch.x86.decode's sweep.

iced-x86 is imported here and by usdtpatch.x86.relocate (its other role: re-encoding a window
at its detour address). The sweep's fallback cannot live in relocate: relocate reads its own
output back with the sweep, and the two modules would import each other.
"""

from __future__ import annotations

from functools import cache

import iced_x86


def decode_one(code: bytes, address: int, mode64: bool = True
               ) -> tuple[int, str, str] | None:
    """(size, AT&T mnemonic, operands) of the one instruction at the start of `code`, as
    iced-x86 decodes it, for an instruction capstone does not know (`serialize`, 0f 01 e8):
    only one that passes control on to the next instruction (iced's FlowControl.NEXT) and
    touches no memory through rip; None for anything else or bytes iced does not decode
    either (the caller then counts them as not decoded: the function is all-targets)."""
    dec = iced_x86.Decoder(64 if mode64 else 32, code, ip=address)
    ins = dec.decode()
    if ins.is_invalid or ins.len == 0 or ins.flow_control != iced_x86.FlowControl.NEXT:
        return None
    if ins.is_ip_rel_memory_operand:
        return None  # its target would have to be re-expressed: leave it to the caller
    fmt = _gas()
    return ins.len, fmt.format_mnemonic(ins), fmt.format_all_operands(ins)


@cache
def _gas() -> iced_x86.Formatter:
    return iced_x86.Formatter(iced_x86.FormatterSyntax.GAS)


_NEAR = frozenset({iced_x86.OpKind.NEAR_BRANCH16, iced_x86.OpKind.NEAR_BRANCH32,
                   iced_x86.OpKind.NEAR_BRANCH64})


def relative_target(code: bytes, address: int, mode64: bool = True) -> int | None:
    """The target of the instruction at the start of `code` when one of its operands is a
    near relative branch target as iced-x86 decodes it (its operand kind NEAR_BRANCH16/32/64:
    jmp, jcc, call, loop, jrcxz, and `xbegin`'s fallback address alike), else None. The sweep
    asks it of each instruction whose text capstone's flow does not make a branch but that
    shows a bare address (usdtpatch.x86.decode: the operand kinds decide, not a list of
    mnemonics: issue 46)."""
    ins = iced_x86.Decoder(64 if mode64 else 32, code, ip=address).decode()
    if ins.is_invalid:
        return None
    for i in range(ins.op_count):
        if ins.op_kind(i) in _NEAR:
            return int(ins.near_branch_target)
    return None
