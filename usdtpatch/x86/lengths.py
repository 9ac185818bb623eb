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
