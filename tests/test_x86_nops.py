"""Site forms from the bytes at a probe, and the kernel's nop5 rule (docs/kernel.md)."""

from __future__ import annotations

import pytest

from tests.helpers import NOP5_GEN, NOP10_GEN
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


# --- a site form's facts, held once (issue 35) ---------------------------------------------

def test_every_form_has_its_facts_and_classify_agrees_with_them() -> None:
    from usdtpatch.x86.nops import COMBO5, COMBO10, FORMS, NOP5, NOP10

    assert set(FORMS) == set(SiteForm)
    for code, form in ((NOP5, SiteForm.NOP5), (COMBO5, SiteForm.COMBO5),
                       (NOP10, SiteForm.NOP10), (COMBO10, SiteForm.COMBO10)):
        got = classify_site(code + bytes(16))
        facts = FORMS[form]
        assert (got.form, got.length) == (form, facts.length)
        # the NOP a kernel optimizes is where the facts say, and as long
        assert decode_nop(code[facts.nop_at:]) is not None
        nop = decode_nop(code[facts.nop_at:])
        assert nop is not None and nop.length == facts.nop_length


def test_what_a_rewrite_keeps_is_read_from_the_facts_of_a_form_made_here() -> None:
    """A form the package does not have (an 8-byte NOP a kernel would optimize): the
    predicates answer from its facts alone, so a new form is a row, not edits in modules."""
    from usdtpatch.analysis.forms import Form, kept_as_is
    from usdtpatch.x86.nops import FormFacts

    made = FormFacts(length=9, insns=2, nop_at=1, nop_length=8,
                     kept_by=frozenset({NOP10_GEN.name}))
    assert kept_as_is(made, Form.COMBO10) and not kept_as_is(made, Form.NOP5)
    assert made.nop5_at == 0  # no nop5 in it: the 6.18 rule looks at pc
    wider = FormFacts(9, 2, 1, 5, frozenset({NOP5_GEN.name}))
    assert kept_as_is(wider, Form.NOP5) and wider.nop5_at == 1


def test_the_forms_are_named_in_x86_nops_only() -> None:
    """Every other module reads a form's facts (FORMS[form].nop_at, ...) rather than testing
    which form it is: adding a form touches x86/nops.py and what emits it."""
    import ast

    from tests.helpers import ROOT

    named = {"NOP1", "NOP5", "NOP5_ALT", "COMBO5", "COMBO10", "NOP10", "PADDED"}
    found = []
    for path in sorted((ROOT / "usdtpatch").rglob("*.py")):
        if path.relative_to(ROOT).as_posix() == "usdtpatch/x86/nops.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in named and \
                    isinstance(node.value, ast.Name) and node.value.id == "SiteForm":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
