"""Site forms from the bytes at a probe, and the kernel's nop5 rule (docs/kernel.md)."""

from __future__ import annotations

import pytest

from usdtpatch.x86.nops import SiteForm, classify_site, decode_nop, kernel_optimizable_nop5

FORMS = [
    ("90 48 89 c7", SiteForm.NOP1, 1),  # nop; mov %rax,%rdi
    ("0f 1f 44 00 00 c3", SiteForm.NOP5, 5),  # nopl 0x0(%rax,%rax,1)
    ("0f 1f 44 00 01", SiteForm.NOP5_ALT, 5),  # nopl 0x1(%rax,%rax,1)
    ("66 66 66 66 90", SiteForm.NOP5_ALT, 5),  # data16 x4 nop
    ("66 0f 1f 40 00", SiteForm.NOP5_ALT, 5),  # nopw 0x0(%rax)
    ("40 0f 1f 40 00", SiteForm.NOP5_ALT, 5),  # rex nopl 0x0(%rax)
    ("90 0f 1f 44 00 00", SiteForm.COMBO5, 6),  # nop; nopl 0x0(%rax,%rax,1)
    ("90 66 2e 0f 1f 84 00 00 00 00 00", SiteForm.COMBO10, 11),  # nop; cs nopw 0x0(...)
    ("66 2e 0f 1f 84 00 00 00 00 00", SiteForm.NOP10, 10),  # cs nopw 0x0(%rax,%rax,1)
    ("66 2e 0f 1f 84 00 e8 11 22 33", SiteForm.NOP10, 10),  # after an unoptimize (nop10 series)
    ("90 0f 1f 40 00 c3", SiteForm.PADDED, 1),  # nop; nopl 0x0(%rax); ret
    ("90 90 90 90 90", SiteForm.PADDED, 1),  # DTrace -G: five nops
    ("0f 1f 48 00 00", SiteForm.OTHER, 0),  # hint nop 0f 1f /1: not a NOP to the kernel
    ("3e 0f 1f 40 00", SiteForm.OTHER, 0),  # ds nopl: unprobeable
    ("f3 f3 f3 f3 90", SiteForm.OTHER, 0),  # pause with prefixes
    ("c3", SiteForm.OTHER, 0),  # ret
    ("", SiteForm.UNMAPPED, 0),
]


@pytest.mark.parametrize("hexbytes,form,length", FORMS, ids=[f[0] or "empty" for f in FORMS])
def test_classify(hexbytes: str, form: SiteForm, length: int) -> None:
    site = classify_site(bytes.fromhex(hexbytes))
    assert (site.form, site.length) == (form, length)


@pytest.mark.parametrize(
    "hexbytes,ok",
    [("0f 1f 44 00 00", True), ("0f 1f 44 00 01", True), ("66 66 66 66 90", True),
     ("66 0f 1f 40 00", True), ("40 0f 1f 40 00", True),
     ("3e 0f 1f 40 00", False), ("2e 0f 1f 40 00", False), ("0f 1f 48 00 00", False),
     ("0f 1f 40 00", False), ("66 2e 0f 1f 84 00 00 00 00 00", False), ("90", False),
     ("0f 1f 80 00 00 00 00", False)],
    ids=str,
)
def test_kernel_nop5_rule(hexbytes: str, ok: bool) -> None:
    """Accepted: measured on 6.18.44. Refused: other lengths, hint NOPs, CS/DS prefixes."""
    assert kernel_optimizable_nop5(bytes.fromhex(hexbytes)) is ok


@pytest.mark.parametrize("hexbytes,length", [
    ("0f 1f 00", 3), ("0f 1f 40 00", 4), ("0f 1f 44 00 00", 5), ("66 0f 1f 44 00 00", 6),
    ("0f 1f 80 00 00 00 00", 7), ("0f 1f 84 00 00 00 00 00", 8),
    ("66 0f 1f 84 00 00 00 00 00", 9), ("0f 1f 05 00 00 00 00", 7)])
def test_nop_lengths_match_the_sdm(hexbytes: str, length: int) -> None:
    insn = decode_nop(bytes.fromhex(hexbytes))
    assert insn is not None and insn.length == length


@pytest.mark.parametrize("offset,crosses", [(0, False), (4091, False), (4092, True),
                                            (4095, True)])
def test_page_rule_measured_on_618(offset: int, crosses: bool) -> None:
    """docs/kernel.md: a nop5 is optimized iff vaddr % 4096 <= 4091."""
    from usdtpatch.x86.nops import crosses_page

    assert crosses_page(0x7000 + offset, 5) is crosses
