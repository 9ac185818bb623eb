"""Debuggers' line rows inside a window (docs/rewrite.md, "Debugging information").

gdb's `break FILE:LINE` puts its int3 at the address of a `.debug_line` row. A row strictly
inside a rewritten window names a place that is no longer an instruction start (inside the
detour's `jmp`, its int3 fill, the new site, a re-laid instruction): the rewrite writes the
row's line program again with the row moved (rewriter/build.py, elf/dwarf.py
`edit_line_programs`). Where it cannot (`read_for_detours` says why, or a program that
cannot be re-encoded), a window with a row inside is refused: `window_line_row`, asked by
check (analysis/check.py) and by the plan (rewriter/plan.py, and both through
`relaid_window`), so that check predicts the rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass

from usdtpatch.elf.dwarf import (
    DwarfError,
    DwarfToExtend,
    LineTable,
    debug_section,
    read_for_detours,
    read_line_table,
)
from usdtpatch.elf.image import ElfImage


@dataclass(frozen=True, slots=True)
class _Lines:
    """The file's line rows as far as they can be read (None: not at all), and the DWARF
    the rewrite edits (None: it edits none, `why` says why)."""

    table: LineTable | None
    editable: DwarfToExtend | None
    why: str


def _lines(image: ElfImage) -> _Lines | None:
    """None where the file has no `.debug_line` (nothing to keep true)."""
    got = image.derived.get("debug_lines")
    if isinstance(got, tuple):
        out = got[0]
        assert out is None or isinstance(out, _Lines)
        return out
    result: _Lines | None = None
    sec = image.section(".debug_line")
    if sec is not None and sec.size:
        dwarf = read_for_detours(image)
        if isinstance(dwarf, DwarfToExtend):
            result = _Lines(dwarf.lines, dwarf, "")
        else:
            why = dwarf if dwarf is not None else "the file has .debug_line but no .debug_info"
            data = debug_section(image, ".debug_line")
            table = None
            if data is not None:
                try:
                    table = read_line_table(image, data=data)
                except DwarfError as exc:
                    why += f"; its .debug_line cannot be read: {exc}"
            result = _Lines(table, None, why)
    image.derived["debug_lines"] = (result,)
    return result


def window_line_row(image: ElfImage, start: int, end: int) -> str | None:
    """Why the window [start, end) is not used for a line row inside it that the rewrite
    cannot move (`window-line-row`), or None."""
    lines = _lines(image)
    if lines is None:
        return None
    if lines.table is None:
        return (f"the file's line table cannot be read ({lines.why}): a row may lie inside "
                f"[{start:#x}, {end:#x})")
    for row in lines.table.inside(start, end):
        why = lines.why if lines.editable is None else lines.editable.unmovable(row)
        if why:
            return (f"the line row of {row.file or '?'}:{row.line} at {row.address:#x} lies "
                    f"inside [{start:#x}, {end:#x}) and cannot be moved: {why}")
    return None
