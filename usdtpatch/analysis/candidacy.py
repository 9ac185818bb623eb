"""The kernel's verdict on one probe site, per kernel generation: optimized, int3 only, or not
probeable, with the reason.

The rules themselves live in usdtpatch.analysis.rules, the one engine plan, verify and rewrite
ask too; this module picks the instruction a tracer attaches to (pc, or pc + 1 for `nop; nop5`,
where libbpf 1.7 attaches) and the trampoline's reach in the file's own layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from usdtpatch.analysis.probes import Probe, is_x86
from usdtpatch.analysis.rules import Outcome, Verdict, rule_618, rule_nop10
from usdtpatch.elf.image import ELFCLASS64, EM_X86_64, PT_LOAD, ElfImage
from usdtpatch.kernelfacts import PAGE
from usdtpatch.x86.nops import FORMS, SiteForm

__all__ = ["KERNELS", "Candidacy", "Outcome", "Verdict", "site_candidacy",
           "trampoline_reachable"]

REACH = 1 << 31  # rel32 of the call to the trampoline
MIN_TRAMPOLINE_PAGE = 0x11000  # pages below about 0x11000 were never used (mmap_min_addr)

KERNEL_618 = "6.18"
KERNEL_NOP10 = "nop10-series"
KERNELS = (KERNEL_618, KERNEL_NOP10)


@dataclass(frozen=True, slots=True)
class Candidacy:
    """The verdict matrix of one site: one Verdict per kernel generation."""

    kernel_618: Verdict
    nop10_series: Verdict

    def items(self) -> tuple[tuple[str, Verdict], ...]:
        return ((KERNEL_618, self.kernel_618), (KERNEL_NOP10, self.nop10_series))


def trampoline_reachable(image: ElfImage, site_end: int) -> bool:
    """True when a free page within +/-2 GiB of `site_end` exists in the file's own layout.

    The kernel puts the trampoline on the page just below the lowest mapping of the object
    (or the next free one down), else the first free page above. A PIE or DSO is mapped at a
    random base with free pages around it; a fixed-address (ET_EXEC) file is checked against
    its PT_LOAD span.
    """
    loads = [s for s in image.segments if s.type == PT_LOAD]
    if not loads:
        return False
    low = min(s.vaddr for s in loads) & ~(PAGE - 1)
    high = (max(s.vaddr + s.memsz for s in loads) + PAGE - 1) & ~(PAGE - 1)
    below = low - PAGE
    if below >= MIN_TRAMPOLINE_PAGE and abs(site_end - below) < REACH:
        return True
    return abs(high - site_end) < REACH - PAGE


def site_candidacy(probe: Probe, image: ElfImage) -> Candidacy:
    """What a 6.18 kernel and a kernel with the (unreleased) nop10 series do with `probe`."""
    if (not is_x86(image) or not image.little_endian
            or probe.site.form in (SiteForm.UNSUPPORTED_ARCH, SiteForm.UNMAPPED)):
        why = ("not x86 code" if not is_x86(image)
               else "big-endian x86 ELF: not analysed" if not image.little_endian
               else f"the probe address {probe.address:#x} maps to no file bytes")
        v = Verdict(Outcome.NOT_APPLICABLE, why)
        return Candidacy(v, v)
    is64 = image.machine == EM_X86_64 and image.elfclass == ELFCLASS64

    def reach(end: int) -> bool:
        return trampoline_reachable(image, end)

    code, pc, form = probe.code, probe.address, probe.site.form
    # libbpf 1.7 attaches at pc + 1 when the site is `nop; nop5` (and `nop; nop10`)
    facts = FORMS[form]
    at = facts.nop5_at
    v618 = rule_618(code[at:], pc + at, is64=is64, reach=reach, at_next=bool(at))
    at10 = facts.nop_at if facts.nop_length == 10 else 0
    nop10 = rule_nop10(code[at10:], pc + at10, is64=is64, reach=reach, at_next=bool(at10),
                       v618=v618)
    return Candidacy(v618, nop10)
