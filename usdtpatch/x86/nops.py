"""NOP encodings and USDT site forms, as data, and the classifier of the bytes at a probe.

References:
- Intel SDM vol. 2, NOP (0x90, and 0F 1F /0 with a ModRM memory operand), and the ModRM/SIB
  displacement rules used to size a 0F 1F instruction.
- The kernel generations' rules (usdtpatch.kernelfacts, the table; docs/kernel.md): the nop5
  generation optimizes one instruction of length 5 that its decoder calls a NOP, i.e. opcode
  90 or 0F 1F with ModRM.reg == 0, in a 64-bit process (`0F 1F /1..7` "hint" NOPs are not NOPs
  to it); the nop10 generation only the 10-byte NOP `66 2e 0f 1f 84 <SIB> <disp32>`, which
  usdt.h emits behind a 1-byte nop (`combo10`). Instructions with a CS (2E) or DS (3E) segment
  prefix cannot be probed at all (perf_event_open fails with errno 524) but that nop10 on the
  generation that optimizes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from usdtpatch.kernelfacts import (
    LEA_RSP_DOWN,
    OPTIMIZING,
    PAGE,
    SEGMENT_PREFIXES_UNPROBEABLE,
    generation_of_nop,
)

NOP1 = bytes([0x90])  # nop
NOP5 = bytes([0x0F, 0x1F, 0x44, 0x00, 0x00])  # nopl 0x0(%rax,%rax,1)
# the 10-byte NOP the nop10 generation optimizes (any SIB/disp32 after its head), with a
# zero SIB/disp32 tail as usdt.h writes it: cs nopw 0x0(%rax,%rax,1)
_NOP10_GEN = generation_of_nop(10)
assert _NOP10_GEN is not None, "the generation table has no 10-byte NOP"
NOP10_PREFIX = _NOP10_GEN.nop_head
NOP10 = NOP10_PREFIX + bytes(10 - len(NOP10_PREFIX))
COMBO5 = NOP1 + NOP5  # nop; nopl 0x0(%rax,%rax,1)   (what libbpf 1.7 looks for)
COMBO10 = NOP1 + NOP10  # nop; cs nopw 0x0(%rax,%rax,1)   (usdt.h since May 2026)

# The red-zone guard around a nop5 site (docs/usdt-format.md, "The red-zone-safe nop5"): the note
# pc is on the nop5, so tracers attach to the NOP the kernel optimizes, and the call's return
# address and the trampoline's pushes land below the 128-byte red zone. `lea` leaves the flags.
GUARD_ENTER = LEA_RSP_DOWN  # lea -0x80(%rsp),%rsp
GUARD_LEAVE = bytes([0x48, 0x8D, 0xA4, 0x24, 0x80, 0x00, 0x00, 0x00])  # lea 0x80(%rsp),%rsp


def is_guarded_nop5(before: bytes, code: bytes) -> bool:
    """True when a nop5 at the site (`code` from pc) sits between the guard's two leas
    (`before` ends at pc)."""
    return before.endswith(GUARD_ENTER) and code.startswith(NOP5 + GUARD_LEAVE)


def crosses_page(address: int, length: int) -> bool:
    """True when [address, address + length) crosses a 4 KiB page: the kernel writes a site
    only within one page, so such a site is never optimized (measured: a nop5 is optimized
    when `vaddr % 4096 <= 4091`, i.e. when it ends exactly at the page end too)."""
    return address % PAGE > PAGE - length


_LEGACY_PREFIXES = frozenset({0x66, 0x67, 0xF0, 0xF2, 0xF3, 0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65})


class SiteForm(Enum):
    NOP1 = "nop1"  # a lone 1-byte nop: the classic systemtap site
    NOP5 = "nop5"  # the canonical 5-byte NOP 0f 1f 44 00 00
    NOP5_ALT = "nop5-alt"  # another 5-byte NOP the nop5 generation optimizes
    COMBO5 = "combo5"  # 90 + nop5, pc on the 90 (libbpf 1.7 attaches at pc + 1)
    COMBO10 = "combo10"  # 90 + 10-byte NOP, pc on the 90 (usdt.h's current default)
    NOP10 = "nop10"  # the 10-byte NOP 66 2e 0f 1f 84 ...
    PADDED = "padded"  # 1-byte nop followed by NOP padding: room for a nop5 in place
    OTHER = "other"  # anything else (disassembly shown)
    UNMAPPED = "unmapped"  # the pc is in no loadable segment of the file
    UNSUPPORTED_ARCH = "unsupported-arch"  # not x86: listed, not classified


@dataclass(frozen=True, slots=True)
class FormFacts:
    """What a site form is, held once (issue 35): every module reads these attributes, none
    names the forms again. A new form is a SiteForm member, its row in FORMS, and its bytes
    in classify_site."""

    length: int  # bytes of the probe instruction(s) at pc (0: unknown)
    insns: int  # the instructions those bytes are (what a listing disassembles)
    nop_at: int  # where the NOP a kernel optimizes starts, from pc (1: combo forms)
    nop_length: int  # that NOP's length (5, 10); 0 when no kernel optimizes the form
    kept_by: frozenset[str]  # a rewrite for these generations leaves the site as it is

    def nop_at_for(self, nop_length: int) -> int:
        """Where the NOP of `nop_length` bytes a generation optimizes starts from pc (0 for a
        form without one: the kernel's rule then looks at pc and says why it does not
        optimize it)."""
        return self.nop_at if self.nop_length == nop_length else 0

    @property
    def nop5_at(self) -> int:
        return self.nop_at_for(5)


def _kept(nop_length: int) -> frozenset[str]:
    """The generations a rewrite leaves a site with a NOP of `nop_length` for: those that
    optimize that NOP, and those with a longer one (a rewrite does not move code to lengthen
    a multi-byte NOP site)."""
    return frozenset(g.name for g in OPTIMIZING if g.nop_length >= nop_length)


_BOTH = _kept(5)
_NOP10_ONLY = _kept(10)
FORMS: dict[SiteForm, FormFacts] = {
    SiteForm.NOP1: FormFacts(length=1, insns=1, nop_at=0, nop_length=0, kept_by=frozenset()),
    SiteForm.NOP5: FormFacts(length=5, insns=1, nop_at=0, nop_length=5, kept_by=_BOTH),
    SiteForm.NOP5_ALT: FormFacts(length=5, insns=1, nop_at=0, nop_length=5, kept_by=_BOTH),
    # libbpf 1.7 attaches at pc + 1
    SiteForm.COMBO5: FormFacts(length=6, insns=2, nop_at=1, nop_length=5, kept_by=_BOTH),
    SiteForm.COMBO10: FormFacts(length=11, insns=2, nop_at=1, nop_length=10, kept_by=_NOP10_ONLY),
    SiteForm.NOP10: FormFacts(length=10, insns=1, nop_at=0, nop_length=10, kept_by=_NOP10_ONLY),
    SiteForm.PADDED: FormFacts(length=1, insns=1, nop_at=0, nop_length=0, kept_by=frozenset()),
    SiteForm.OTHER: FormFacts(length=0, insns=1, nop_at=0, nop_length=0, kept_by=frozenset()),
    SiteForm.UNMAPPED: FormFacts(length=0, insns=0, nop_at=0, nop_length=0, kept_by=frozenset()),
    SiteForm.UNSUPPORTED_ARCH: FormFacts(length=0, insns=0, nop_at=0, nop_length=0,
                                         kept_by=frozenset()),
}


def form_facts(form: SiteForm) -> FormFacts:
    return FORMS[form]


def nop5_offset(form: SiteForm) -> int:
    """How far past the note pc the 5-byte NOP the nop5 generation optimizes starts: 1 for combo5
    (`90` + nop5, where libbpf 1.7 attaches at pc + 1), 0 for every other form."""
    return FORMS[form].nop5_at


@dataclass(frozen=True, slots=True)
class NopInsn:
    """One decoded NOP instruction: its length and facts the kernel rules look at."""

    length: int
    prefixes: bytes
    hint: bool  # 0F 1F with ModRM.reg != 0: decodes as a NOP on the CPU, not for the kernel


def decode_nop(code: bytes) -> NopInsn | None:
    """Decode one instruction at code[0] if it is a NOP (90 or 0F 1F /r); None otherwise.

    Legacy prefixes and a REX byte are allowed before the opcode, as the CPU does.
    """
    i = 0
    while i < len(code) and code[i] in _LEGACY_PREFIXES and i < 14:
        i += 1
    prefixes = code[:i]
    if i < len(code) and 0x40 <= code[i] <= 0x4F:  # REX
        i += 1
    if i >= len(code):
        return None
    if code[i] == 0x90:
        if 0xF3 in prefixes:
            return None  # f3 90 is PAUSE
        return NopInsn(i + 1, prefixes, hint=False)
    if code[i] != 0x0F or i + 2 >= len(code) or code[i + 1] != 0x1F:
        return None
    modrm = code[i + 2]
    mod, reg, rm = modrm >> 6, (modrm >> 3) & 7, modrm & 7
    n = i + 3
    if mod != 3 and rm == 4:  # SIB
        if n >= len(code):
            return None
        sib_base = code[n] & 7
        n += 1
        if mod == 0 and sib_base == 5:
            n += 4
    if mod == 1:
        n += 1
    elif mod == 2 or (mod == 0 and rm == 5):
        n += 4
    if n > len(code):
        return None
    return NopInsn(n, prefixes, hint=reg != 0)


def kernel_optimizable_nop5(code: bytes) -> bool:
    """True when code[0:5] is one 5-byte instruction the nop5 generation would optimize."""
    insn = decode_nop(code[:15])
    return (
        insn is not None
        and insn.length == 5
        and not insn.hint
        and not (set(insn.prefixes) & SEGMENT_PREFIXES_UNPROBEABLE)
    )


def nop_run_length(code: bytes) -> int:
    """Bytes covered by consecutive non-hint NOP instructions from code[0]."""
    n = 0
    while n < len(code):
        insn = decode_nop(code[n:])
        if insn is None or insn.hint:
            break
        n += insn.length
    return n


@dataclass(frozen=True, slots=True)
class SiteClass:
    """What the bytes at a probe's pc are."""

    form: SiteForm
    length: int  # bytes of the probe instruction(s) at pc (0 when unknown)
    room: int  # bytes of plain NOPs from pc (what could be overwritten in place)


def classify_site(code: bytes) -> SiteClass:
    """Classify the bytes at a probe pc (give at least 16 bytes when the file has them)."""
    if not code:
        return SiteClass(SiteForm.UNMAPPED, 0, 0)
    room = nop_run_length(code)
    form = _form_of(code, room)
    return SiteClass(form, FORMS[form].length, room)


def _form_of(code: bytes, room: int) -> SiteForm:
    if code.startswith(NOP1 + NOP10_PREFIX) and len(code) >= 11:
        return SiteForm.COMBO10
    if code.startswith(COMBO5):
        return SiteForm.COMBO5
    if code.startswith(NOP10_PREFIX) and len(code) >= 10:
        return SiteForm.NOP10
    if code.startswith(NOP5):
        return SiteForm.NOP5
    if kernel_optimizable_nop5(code):
        return SiteForm.NOP5_ALT
    if code[0] == 0x90:
        return SiteForm.PADDED if room >= 5 else SiteForm.NOP1
    return SiteForm.OTHER
