"""The kernel's verdict on one probe site, per kernel generation: optimized, int3 only, or not
probeable, with the reason.

References (shared/design/kernel-facts.md):
- Measured on 6.18: a uprobe on ONE 5-byte instruction the kernel's decoder calls a NOP
  (90 or 0F 1F /0, prefixes allowed, no CS/DS prefix) is optimized after its first hit, in a
  64-bit process only, when the nop5 does not cross a 4 KiB page (`vaddr % 4096 <= 4091`) and
  a trampoline page is free within +/-2 GiB of site + 5. CS (2e) / DS (3e) prefixed
  instructions cannot be probed at all (errno 524). Hint NOPs (0F 1F /1..7) and NOPs of any
  other length stay on the int3 path.
- libbpf 1.7 attaches at pc + 1 when the bytes at pc are `90 0f 1f 44 00 00` (combo5).
- UNRELEASED (a kernel series queued in July 2026, not in any release we can test): the 10-byte
  NOP `66 2e 0f 1f 84 <SIB> <disp32>` is optimized, a nop5 no longer is. The page rule for it
  is assumed to be the same (the 10 bytes within one page) -- labelled as an assumption.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from usdtpatch.elf.image import ELFCLASS64, EM_X86_64, PT_LOAD, ElfImage
from usdtpatch.sites.probes import Probe, is_x86
from usdtpatch.x86.nops import (
    NOP10_PREFIX,
    SEGMENT_PREFIXES_UNPROBEABLE,
    SiteForm,
    crosses_page,
    decode_nop,
)

PAGE = 4096
REACH = 1 << 31  # rel32 of the call to the trampoline
MIN_TRAMPOLINE_PAGE = 0x11000  # pages below about 0x11000 were never used (mmap_min_addr)

KERNEL_618 = "6.18"
KERNEL_NOP10 = "nop10-series"
KERNELS = (KERNEL_618, KERNEL_NOP10)


class Outcome(Enum):
    OPTIMIZED = "optimized"  # a uprobe at the note's pc is optimized
    OPTIMIZED_AT_NEXT = "optimized-at-pc+1"  # only when attached at pc + 1 (libbpf 1.7)
    INT3 = "int3"  # probeable, stays on the int3 path
    UNPROBEABLE = "unprobeable"  # the kernel refuses to place a uprobe at pc
    NOT_APPLICABLE = "n/a"  # not x86-64 code, or the pc maps to no file bytes

    @property
    def optimized(self) -> bool:
        return self in (Outcome.OPTIMIZED, Outcome.OPTIMIZED_AT_NEXT)


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    reason: str
    code: str | None = None  # the finding code when something stands in the way


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


def _page_ok(address: int, length: int) -> bool:
    return not crosses_page(address, length)


def site_candidacy(probe: Probe, image: ElfImage) -> Candidacy:
    """What a 6.18 kernel and a kernel with the (unreleased) nop10 series do with `probe`."""
    if (not is_x86(image) or not image.little_endian
            or probe.site.form in (SiteForm.UNSUPPORTED_ARCH, SiteForm.UNMAPPED)):
        why = ("not x86 code" if not is_x86(image)
               else "big-endian x86 ELF: not analysed" if not image.little_endian
               else f"the probe address {probe.address:#x} maps to no file bytes")
        v = Verdict(Outcome.NOT_APPLICABLE, why)
        return Candidacy(v, v)
    if image.machine != EM_X86_64 or image.elfclass != ELFCLASS64:
        v = Verdict(Outcome.INT3, "32-bit (compat) processes are never optimized",
                    "site-elf32")
        return Candidacy(v, v)
    return Candidacy(_verdict_618(probe, image), _verdict_nop10(probe, image))


def _first_insn(code: bytes) -> tuple[int, bool, bytes] | None:
    """(length, hint, prefixes) of the NOP at code[0], or None if it is not a NOP."""
    n = decode_nop(code[:15])
    if n is None:
        return None
    return n.length, n.hint, n.prefixes


def _verdict_618(probe: Probe, image: ElfImage) -> Verdict:
    code = probe.code
    pc = probe.address
    form = probe.site.form
    at_next = form is SiteForm.COMBO5
    addr = pc + 1 if at_next else pc
    body = code[1:] if at_next else code
    nop = _first_insn(body)
    if nop is None:
        return Verdict(Outcome.INT3, f"the instruction at {pc:#x} is not a NOP", "site-not-nop")
    length, hint, prefixes = nop
    if set(prefixes) & SEGMENT_PREFIXES_UNPROBEABLE:
        return Verdict(Outcome.UNPROBEABLE,
                       f"{length}-byte NOP with a {'CS' if 0x2E in prefixes else 'DS'} prefix: "
                       "the kernel refuses to probe it (errno 524)", "site-segment-prefix")
    if hint:
        return Verdict(Outcome.INT3, "0f 1f /r hint NOP with ModRM.reg != 0: single-stepped, "
                                     "not optimized", "site-hint-nop")
    if length != 5:
        return Verdict(Outcome.INT3, f"{length}-byte NOP: only 5-byte NOPs are optimized",
                       "site-nop1" if length == 1 else "site-nop-length")
    if not _page_ok(addr, 5):
        return Verdict(Outcome.INT3, f"the nop5 at {addr:#x} crosses a 4 KiB page "
                                     f"(page offset {addr % PAGE:#x} > 0xffb)",
                       "site-crosses-page")
    if not trampoline_reachable(image, addr + 5):
        return Verdict(Outcome.INT3, "no page for the trampoline within +/-2 GiB",
                       "no-trampoline-reach")
    if at_next:
        return Verdict(Outcome.OPTIMIZED_AT_NEXT,
                       "nop; nop5: optimized when attached at pc + 1 (libbpf 1.7 does; bcc, "
                       "bpftrace 0.17, perf and gdb attach at pc, the 1-byte nop)",
                       "site-combo5-pc1")
    return Verdict(Outcome.OPTIMIZED, "5-byte NOP within one page")


def _verdict_nop10(probe: Probe, image: ElfImage) -> Verdict:
    """UNRELEASED kernel series (July 2026): nop10 optimized, nop5 no longer (assumption-
    labelled page rule)."""
    code = probe.code
    pc = probe.address
    form = probe.site.form
    at_next = form is SiteForm.COMBO10
    addr = pc + 1 if at_next else pc
    body = code[1:] if at_next else code
    if body.startswith(NOP10_PREFIX) and len(body) >= 10:
        if not _page_ok(addr, 10):
            return Verdict(Outcome.INT3, f"the nop10 at {addr:#x} crosses a 4 KiB page "
                                         "(assumed rule of the unreleased series)",
                           "site-crosses-page")
        if not trampoline_reachable(image, addr + 10):
            return Verdict(Outcome.INT3, "no page for the trampoline within +/-2 GiB",
                           "no-trampoline-reach")
        if at_next:
            return Verdict(Outcome.OPTIMIZED_AT_NEXT,
                           "nop; nop10: optimized when attached at pc + 1 (unreleased series)")
        return Verdict(Outcome.OPTIMIZED, "10-byte NOP 66 2e 0f 1f 84 (unreleased series)")
    v618 = _verdict_618(probe, image)
    if v618.outcome is Outcome.UNPROBEABLE:
        return v618
    if v618.outcome.optimized:
        return Verdict(Outcome.INT3, "nop5 sites are no longer optimized by the nop10 series",
                       "site-nop5-on-nop10")
    return Verdict(Outcome.INT3, v618.reason + "; the series optimizes only 66 2e 0f 1f 84 "
                   "nop10 sites", v618.code)
