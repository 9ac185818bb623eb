"""The kernel's write sequences as data: the 6.18 nop5 protocol, int3-only sites, the
nop10 generation's protocol, and the reasons a site is not optimized."""

from __future__ import annotations

import pytest

from tests.helpers import NOP5_GEN, NOP10_GEN
from usdtpatch.sequences.sequences import (
    INT3,
    apply_write,
    call_target,
    int3_sequences,
    optimized_sequences,
    probeable_refusal,
    refusal,
    rel32_for,
)
from usdtpatch.x86.nops import NOP5, NOP10

SITE = 0x55555555507D
TRAMP = 0x555555553000


def test_nop5_states_are_the_measured_table() -> None:
    """docs/kernel.md: 0f 1f 44 00 00 -> cc 1f.. -> cc d0..d3 -> e8 d0..d3 and back."""
    s = optimized_sequences(NOP5_GEN, SITE, NOP5, TRAMP)
    assert s.optimize is not None and s.unoptimize is not None
    rel = (TRAMP - (SITE + 5)).to_bytes(4, "little", signed=True)
    assert s.optimize.states == (NOP5, b"\xcc" + NOP5[1:], b"\xcc" + rel, b"\xe8" + rel)
    assert s.unoptimize.states == (b"\xe8" + rel, b"\xcc" + rel, b"\xcc" + NOP5[1:], NOP5)
    assert [st.expect_byte0 for st in s.optimize.steps] == [0x0F, INT3, INT3]
    assert [st.expect_byte0 for st in s.unoptimize.steps] == [0xE8, INT3, INT3]
    assert all(st.serialize for st in s.optimize.steps + s.unoptimize.steps)
    assert call_target(SITE, 5, s.optimize.end[1:5]) == TRAMP
    assert s.attach.states == (NOP5, b"\xcc" + NOP5[1:])
    assert s.detach.end == NOP5


def test_int3_only_site() -> None:
    s = int3_sequences(0x1000, b"\x90")
    assert s.optimize is None and s.unoptimize is None
    assert s.attach.states == (b"\x90", b"\xcc") and s.detach.end == b"\x90"


@pytest.mark.parametrize(("address", "code", "tramp", "is64", "want"), [
    (SITE, NOP5, TRAMP, True, None),
    (0x1000 + 4091, NOP5, 0x0, True, None),  # ends exactly at the page end: optimized
    (0x1000 + 4092, NOP5, 0x0, True, "site-crosses-page"),
    (SITE, bytes.fromhex("0f1f4c0000"), TRAMP, True, "site-hint-nop"),
    (SITE, bytes.fromhex("90909090"), TRAMP, True, "site-not-nop5"),
    (SITE, NOP5, None, True, "no-trampoline-reach"),
    (SITE, NOP5, SITE + 5 + (1 << 31), True, "no-trampoline-reach"),
    (SITE, NOP5, TRAMP, False, "site-elf32"),
    (SITE, bytes.fromhex("3e0f1f4000"), TRAMP, False, "site-segment-prefix"),
], ids=["nop5", "page-end", "crosses-page", "hint-nop", "nop1s", "no-trampoline",
        "out-of-reach", "32-bit", "ds-prefix-32-bit"])
def test_nop5_refusal(address: int, code: bytes, tramp: int | None, is64: bool,
                      want: str | None) -> None:
    f = refusal(NOP5_GEN, address, code, tramp, is64, "p:n")
    assert (f.code if f else None) == want


@pytest.mark.parametrize(("code", "want"), [
    (bytes.fromhex("3e0f1f4000"), "site-segment-prefix"),
    (NOP10, "site-segment-prefix"),
    (NOP5, None),
], ids=["ds-prefix", "cs-nop10", "nop5"])
def test_probeable(code: bytes, want: str | None) -> None:
    f = probeable_refusal(code, "p:n")
    assert (f.code if f else None) == want


def test_rel32_range() -> None:
    assert rel32_for(0x1000, 5, 0x1005 + (1 << 31) - 1) == (1 << 31) - 1
    assert rel32_for(0x1000, 5, 0x1005 + (1 << 31)) is None
    assert rel32_for(1 << 40, 5, (1 << 40) + 5 - (1 << 31)) == -(1 << 31)


def test_apply_write_rejects_out_of_site() -> None:
    with pytest.raises(ValueError):
        apply_write(NOP5, 3, b"\x00\x00\x00")


def test_nop10_states() -> None:
    s = optimized_sequences(NOP10_GEN, SITE, NOP10, TRAMP)
    assert s.optimize is not None and s.unoptimize is not None
    rel = (TRAMP - (SITE + 10)).to_bytes(4, "little", signed=True)
    opt = bytes.fromhex("488d642480e8") + rel
    assert s.optimize.end == opt
    assert [st.offset for st in s.optimize.steps] == [0, 1, 0]
    assert len(s.optimize.steps[1].data) == 9
    # unoptimize leaves e8 rel32 in bytes 5..9, as SIB and disp32 of the same NOP
    assert s.unoptimize.end == NOP10[:5] + b"\xe8" + rel
    assert [st.expect_byte0 for st in s.unoptimize.steps] == [0x48, INT3, INT3]


@pytest.mark.parametrize(("address", "code", "want"), [
    (SITE, NOP10, None),
    (0x1000 + 4086, NOP10, None),
    (0x1000 + 4087, NOP10, "site-crosses-page"),
    (SITE, NOP5 + NOP5, "site-not-nop10"),
], ids=["nop10", "page-end", "crosses-page", "two-nop5"])
def test_nop10_refusal(address: int, code: bytes, want: str | None) -> None:
    f = refusal(NOP10_GEN, address, code, address - 0x3000, True, "p:n")
    assert (f.code if f else None) == want
