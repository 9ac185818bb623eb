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

from usdtpatch.elf import model
from usdtpatch.elf.cfi import CfiError, CfiIndex
from usdtpatch.elf.dwarf import DwarfError, read_line_table
from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.model import FILE_WIDE, LINE_OPCODE, Unmodelled, fde_unmodelled, unmodelled
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
    out = list(unmodelled(image))
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
