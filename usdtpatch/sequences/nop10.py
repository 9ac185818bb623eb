"""EXPERIMENTAL: the nop10 write protocol of the kernel series queued upstream in July 2026.

This is unreleased code that no kernel we can test implements; it is kept apart from the 6.18
protocol (usdtpatch.sequences.sequences) so it can change without touching anything else.
Reference: docs/plan-verify.md, "nop10 — EXPERIMENTAL":

- the site is the 10-byte NOP `66 2e 0f 1f 84 <SIB> <disp32>` (any SIB/disp32);
- optimized it becomes `48 8d 64 24 80 e8 d0 d1 d2 d3`
  = `lea -0x80(%rsp),%rsp; call trampoline`, rel32 = trampoline - (site + 10), and the
  trampoline returns with `ret $0x80`, so nothing is written in [rsp-128, rsp);
- optimize: int3 at byte 0, then bytes 1..9, then byte 0 = 0x48;
- unoptimize: int3 at byte 0, restore bytes 1..4, restore byte 0; bytes 5..9 keep
  `e8 d0..d3`, which decode as the SIB and disp32 of the same 10-byte NOP.
"""

from __future__ import annotations

from usdtpatch.analysis.rules import NOP10_LENGTH, is_nop10, rule_nop10
from usdtpatch.findings import Finding
from usdtpatch.sequences.sequences import (
    INT3,
    PROTOCOL_NOP10,
    SiteSequences,
    build_sequence,
    refusal_finding,
    rel32_for,
)

EXPERIMENTAL = True
__all__ = ["NOP10_LENGTH", "is_nop10", "nop10_refusal", "nop10_sequences"]
NOP10_HEAD = bytes([0x66, 0x2E, 0x0F, 0x1F, 0x84])  # cs nopw disp32(%rax,<SIB>) head
LEA_RSP_MINUS_128 = bytes([0x48, 0x8D, 0x64, 0x24, 0x80])  # lea -0x80(%rsp),%rsp
REX_W = 0x48  # the byte 0 the optimize sequence writes last


def nop10_optimized(address: int, trampoline: int) -> bytes:
    """`lea -0x80(%rsp),%rsp; call trampoline` for a nop10 at `address`."""
    rel = rel32_for(address, NOP10_LENGTH, trampoline)
    if rel is None:
        raise ValueError(f"trampoline {trampoline:#x} is out of rel32 reach of {address:#x}")
    return LEA_RSP_MINUS_128 + bytes([0xE8]) + rel.to_bytes(4, "little", signed=True)


def nop10_sequences(address: int, original: bytes, trampoline: int) -> SiteSequences:
    """EXPERIMENTAL sequences of the queued series for a nop10 at `address`."""
    original = original[:NOP10_LENGTH]
    target = nop10_optimized(address, trampoline)
    attach = build_sequence("attach", address, original,
                            [(0, bytes([INT3]), original[0], "int3 at byte 0")])
    detach = build_sequence("detach", address, attach.end,
                            [(0, original[:1], INT3, "restore byte 0")])
    optimize = build_sequence("optimize", address, original, [
        (0, bytes([INT3]), original[0], "int3 at byte 0 (attach)"),
        (1, target[1:], INT3, "lea tail and call rel32 in bytes 1..9"),
        (0, target[:1], INT3, "REX.W 48 at byte 0"),
    ])
    unoptimize = build_sequence("unoptimize", address, optimize.end, [
        (0, bytes([INT3]), REX_W, "int3 over byte 0"),
        (1, original[1:5], INT3, "restore bytes 1..4 (e8 rel32 stays as SIB/disp32)"),
        (0, original[:1], INT3, "restore byte 0"),
    ])
    return SiteSequences(protocol=PROTOCOL_NOP10, address=address, original=original,
                         trampoline=trampoline, attach=attach, detach=detach, optimize=optimize,
                         unoptimize=unoptimize)


def nop10_refusal(address: int, original: bytes, trampoline: int | None, is64: bool,
                  where: str) -> Finding | None:
    """Why the queued series would not optimize this site; None when it would (the verdict of
    the rule engine's experimental nop10 rules)."""
    v = rule_nop10(original, address, is64=is64,
                   reach=lambda _end: trampoline is not None
                   and rel32_for(address, NOP10_LENGTH, trampoline) is not None)
    return refusal_finding(v, address, NOP10_LENGTH, original, trampoline, where)
