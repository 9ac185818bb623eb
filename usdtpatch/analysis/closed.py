"""The closed world: a site gets no window where the file uses a construct outside the model.

usdtpatch.elf.model holds the one table of every ELF construct usdtpatch understands. This
module makes its decision for a site, the one `check` (analysis/check.py) and the rewrite's
plan (rewriter/plan.py, which takes check's window) both follow:

- `file_refusal`: a construct whose meaning is file-wide (a relocation type in a loader
  table, a dynamic tag or flag bit, a section type or flag, a program header type, an
  allocated note or GNU property, a CIE augmentation or pointer encoding, a line-program
  opcode): no site of the file that needs a window gets one;
- `local_refusal`: a construct met only by the unwinder in one function (a call frame
  instruction of its FDE, an LSDA pointer encoding): no window in that function.

Each is a finding whose code names the kind of construct and whose message names it and
where it is. Both are computed once per file (the model caches what it reads in
`ElfImage.derived`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from functools import lru_cache

from usdtpatch.elf import model
from usdtpatch.elf.cfi import CfiError, CfiIndex, Fde, parse_cie
from usdtpatch.elf.dwarf import DwarfError, read_line_table
from usdtpatch.elf.image import SHT_NOBITS, ElfImage
from usdtpatch.elf.model import (
    CFI,
    CIE_AUGMENTATIONS,
    FILE_WIDE,
    FIXED_SIZES,
    LINE_OPCODE,
    LOCAL,
    LSDA_ENCODING,
    DW_EH_PE_omit,
    Unmodelled,
    cfa_program_unknown,
    encoding_known,
    unmodelled,
)
from usdtpatch.findings import (
    UNMODELLED_CFI,
    UNMODELLED_DYNAMIC_TAG,
    UNMODELLED_LINE_OPCODE,
    UNMODELLED_LSDA_ENCODING,
    UNMODELLED_NOTE,
    UNMODELLED_RELOCATION,
    UNMODELLED_SECTION_TYPE,
    UNMODELLED_SEGMENT_TYPE,
    Code,
    Finding,
)

# the finding code of each kind of construct outside the model
CODES: dict[str, Code] = {
    model.RELOCATION: UNMODELLED_RELOCATION, model.DYNAMIC: UNMODELLED_DYNAMIC_TAG,
    model.SECTION: UNMODELLED_SECTION_TYPE, model.SEGMENT: UNMODELLED_SEGMENT_TYPE,
    model.NOTE: UNMODELLED_NOTE, model.CFI: UNMODELLED_CFI,
    model.LSDA_ENCODING: UNMODELLED_LSDA_ENCODING, model.LINE_OPCODE: UNMODELLED_LINE_OPCODE,
}
REFUSALS = frozenset(c.code for c in CODES.values())


def file_unmodelled(image: ElfImage) -> tuple[Unmodelled, ...]:
    """Every construct of `image` outside the model (usdtpatch.elf.model.unmodelled) and
    every line-program opcode its `.debug_line` uses outside it; once per file."""
    got = image.derived.get("closed_unmodelled")
    if isinstance(got, tuple):
        return got
    out = [*unmodelled(image), *_cies(image)]
    if image.section(".debug_line") is not None:
        try:
            lines = read_line_table(image)
        except DwarfError:
            lines = None  # unreadable: the detours get no DWARF (detour-dwarf-left-out)
        for what in (lines.unknown if lines is not None else ())[:1]:
            where = what.rsplit(" at ", 1)
            out.append(Unmodelled(LINE_OPCODE, where[0], where[-1]))
    result = tuple(out)
    image.derived["closed_unmodelled"] = result
    return result


def file_refusal(image: ElfImage) -> Finding | None:
    """The finding that refuses every window of the file (its first file-wide construct
    outside the model, and how many more there are), or None."""
    wide = [u for u in file_unmodelled(image) if u.scope == FILE_WIDE]
    if not wide:
        return None
    u = wide[0]
    more = f" (and {len(wide) - 1} more construct(s) outside the model)" if len(wide) > 1 \
        else ""
    return CODES[u.kind].finding(
        f"{u.message}{more}: its meaning is file-wide, so no window is used anywhere in "
        f"the file")


def local_refusal(image: ElfImage, cfi: CfiIndex, address: int) -> Finding | None:
    """The finding that refuses the windows of the function holding `address`: what its FDE
    uses outside the model (a call frame instruction, an LSDA encoding), or None."""
    try:
        fde = cfi.lookup(address)
    except CfiError:
        return None  # check's cfi-malformed and the function's analysis say so
    if fde is None:
        return None
    u = fde_unmodelled(image, fde)
    if u is None:
        return None
    return CODES[u.kind].finding(f"{u.message}: the function's windows are not used")


def _cies(image: ElfImage) -> Iterator[Unmodelled]:
    """Every CIE of `.eh_frame`: its augmentation letters, its pointer encodings and its
    initial instructions (an FDE's own are asked per function: `fde_unmodelled`)."""
    sec = image.section(".eh_frame")
    if sec is None or sec.type == SHT_NOBITS or not image.is64 or \
            sec.offset + sec.size > len(image.data):
        return
    data, bo = image.data, image.byteorder
    pos, end = sec.offset, sec.offset + sec.size
    while pos + 8 <= end:
        length, cie_id = struct.unpack_from(bo + "II", data, pos)
        if length in (0, 0xFFFFFFFF):
            return  # the terminator; a 64-bit entry is cfi.py's to refuse
        if cie_id == 0:
            at = sec.addr + pos - sec.offset
            try:
                cie = parse_cie(image, at)
            except CfiError:
                pos += 4 + length
                continue  # malformed: check's cfi-malformed says so
            where = f".eh_frame+{pos - sec.offset:#x}"
            letters = cie.augmentation
            odd = sorted({c for c in letters.removeprefix("eh") if c not in CIE_AUGMENTATIONS})
            if odd or (letters and not letters.startswith(("z", "eh"))):
                yield Unmodelled(CFI, f"CIE augmentation {letters!r}", where)
            for what, enc, kind in (("FDE", cie.fde_encoding, CFI),
                                    ("personality", cie.personality_encoding, CFI),
                                    ("LSDA", cie.lsda_encoding, LSDA_ENCODING)):
                if not encoding_known(enc):
                    yield Unmodelled(kind, f"{what} pointer encoding {enc:#04x}", where)
            bad = cfa_program_unknown(cie.instructions)
            if bad is not None:
                yield Unmodelled(CFI, f"{bad} of the CIE's initial instructions", where)
        pos += 4 + length


# an FDE's program scanned once, however many sites its function holds (issue 46, class 8)
_program_unknown = lru_cache(maxsize=256)(cfa_program_unknown)


def fde_unmodelled(image: ElfImage, fde: Fde) -> Unmodelled | None:
    """What the FDE of one function uses outside the table: a call frame instruction, or an
    LSDA pointer encoding (LPStart, TType, call sites); LOCAL to the FDE's range."""
    bad = _program_unknown(fde.instructions)
    where = f"the FDE at {fde.address:#x} ([{fde.pc_begin:#x}, {fde.pc_end:#x}))"
    if bad is not None:
        return Unmodelled(kind=CFI, what=bad, where=where, scope=LOCAL, start=fde.pc_begin,
                          end=fde.pc_end)
    if fde.lsda is None:
        return None
    raw = image.read_vaddr(fde.lsda, 32)
    encs: list[tuple[str, int]] = []
    pos = 0
    for what in ("LPStart", "TType", "call-site"):
        if pos >= len(raw):
            break
        enc = raw[pos]
        pos += 1
        encs.append((what, enc))
        if enc == DW_EH_PE_omit or what == "call-site":
            continue
        if not encoding_known(enc):
            break
        if what == "TType" or enc & 0x0F in (0x01, 0x09):  # a uleb128 offset / LEB value
            while pos < len(raw) and raw[pos] & 0x80:
                pos += 1
            pos += 1
        else:
            pos += FIXED_SIZES[enc & 0x0F]
    for what, enc in encs:
        if not encoding_known(enc):
            return Unmodelled(kind=LSDA_ENCODING, what=f"{what} encoding {enc:#04x}",
                              where=f"the LSDA at {fde.lsda:#x} of {where}", scope=LOCAL,
                              start=fde.pc_begin, end=fde.pc_end)
    return None
