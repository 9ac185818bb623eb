"""One-line disassembly of a probe site for display, without loading capstone for the NOP
forms nearly every site is made of.

`describe` answers from `_KNOWN_TEXT` (what capstone prints for those encodings; a test checks
each against capstone) and asks capstone (usdtpatch/x86/decode.py) for anything else, so that
`list` imports neither capstone nor the analysis' decoder.

Deferred import: x86/decode.py, for a site that is not one of those NOPs.
"""

from __future__ import annotations

from usdtpatch.x86.nops import NOP1, NOP5, NOP10

# What capstone prints for the NOP encodings nearly every probe site is made of (mode64 ->
# encoding -> text; tests/test_x86_decode.py checks each against capstone). `describe` looks
# them up so that listing such sites does not load capstone at all.
_KNOWN_TEXT: dict[bool, dict[bytes, str]] = {
    True: {NOP1: "nop", NOP5: "nopl (%rax, %rax)", NOP10: "nopw %cs:(%rax, %rax)"},
    False: {NOP1: "nop", NOP5: "nopl (%eax, %eax)", NOP10: "nopw %cs:(%eax, %eax)"},
}


def _known(code: bytes, count: int, mode64: bool) -> str | None:
    """The text of the first `count` instructions when each is in _KNOWN_TEXT, else None."""
    table = _KNOWN_TEXT[mode64]
    texts: list[str] = []
    pos = 0
    for _ in range(count):
        for enc, text in table.items():
            if code.startswith(enc, pos):
                texts.append(text)
                pos += len(enc)
                break
        else:
            return None
    return "; ".join(texts)


def describe(code: bytes, address: int, count: int = 1, mode64: bool = True) -> str:
    """A one-line disassembly of the first `count` instructions, `(bad)` when none decodes."""
    if count > 0:
        known = _known(code, count, mode64)
        if known is not None:
            return known
    from usdtpatch.x86.decode import disassemble

    insns = disassemble(code, address, count, mode64)
    return "; ".join(i.text for i in insns) if insns else "(bad)"
