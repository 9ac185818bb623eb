"""The kernel's verdict on one probe site, per kernel generation: optimized, int3 only, or not
probeable, with the reason.

The rules themselves live in usdtpatch.analysis.rules, the one engine plan, verify and rewrite
ask too; this module picks the instruction a tracer attaches to on each generation (pc, or
pc + 1 for the `90` + NOP form whose consumers attach there: `nop; nop5` under libbpf 1.7,
`nop; nop10` under 7.3's libbpf) and the trampoline's reach in the file's own layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from usdtpatch.analysis.probes import Probe, is_x86
from usdtpatch.analysis.rules import Outcome, Verdict, rule
from usdtpatch.elf.image import ELFCLASS64, EM_X86_64, PT_LOAD, ElfImage
from usdtpatch.kernelfacts import OPTIMIZING, PAGE, Generation
from usdtpatch.x86.nops import FORMS, SiteForm

__all__ = ["KERNELS", "Candidacy", "Outcome", "Verdict", "site_candidacy",
           "trampoline_reachable"]

REACH = 1 << 31  # rel32 of the call to the trampoline
MIN_TRAMPOLINE_PAGE = 0x11000  # pages below about 0x11000 were never used (mmap_min_addr)

KERNELS: tuple[str, ...] = tuple(g.name for g in OPTIMIZING)  # the verdict matrix's columns


@dataclass(frozen=True, slots=True)
class Candidacy:
    """The verdict matrix of one site: one Verdict per optimizing kernel generation, in the
    order of kernelfacts.OPTIMIZING."""

    verdicts: tuple[Verdict, ...]

    def verdict(self, gen: Generation) -> Verdict:
        return self.verdicts[OPTIMIZING.index(gen)]

    def items(self) -> tuple[tuple[str, Verdict], ...]:
        return tuple(zip(KERNELS, self.verdicts, strict=True))


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
    """What a kernel of each optimizing generation does with `probe`."""
    if (not is_x86(image) or not image.little_endian
            or probe.site.form in (SiteForm.UNSUPPORTED_ARCH, SiteForm.UNMAPPED)):
        why = ("not x86 code" if not is_x86(image)
               else "big-endian x86 ELF: not analysed" if not image.little_endian
               else f"the probe address {probe.address:#x} maps to no file bytes")
        v = Verdict(Outcome.NOT_APPLICABLE, why)
        return Candidacy((v,) * len(OPTIMIZING))
    is64 = image.machine == EM_X86_64 and image.elfclass == ELFCLASS64

    def reach(end: int) -> bool:
        return trampoline_reachable(image, end)

    code, pc, form = probe.code, probe.address, probe.site.form
    facts = FORMS[form]
    verdicts: list[Verdict] = []
    for gen in OPTIMIZING:
        # the consumers of `gen` attach at pc + 1 when the site is `90` + its NOP
        at = facts.nop_at if facts.nop_length == gen.nop_length else 0
        verdicts.append(rule(gen, code[at:], pc + at, is64=is64, reach=reach,
                             at_next=bool(at)))
    return _interned(tuple(verdicts))


# Most sites of a file share their verdicts (every 1-byte site gets the same ones): their
# Candidacy is made once, as the two-field one was, so that a million sites hold one each.
_SHARED: dict[tuple[Verdict, ...], Candidacy] = {}
_SHARED_MAX = 256


def _interned(verdicts: tuple[Verdict, ...]) -> Candidacy:
    got = _SHARED.get(verdicts)
    if got is None:
        got = Candidacy(verdicts)
        if len(_SHARED) < _SHARED_MAX:
            _SHARED[verdicts] = got
    return got
