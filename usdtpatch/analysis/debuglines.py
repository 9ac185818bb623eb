"""Debuggers' breakpoint addresses inside a window (docs/rewrite.md, "Debugging information").

gdb's `break FILE:LINE` puts its int3 at the address of a `.debug_line` row; `break fn` of
an inlined function at its DW_TAG_inlined_subroutine's DW_AT_entry_pc (else DW_AT_low_pc);
`break label` at a DW_TAG_label's DW_AT_low_pc. Such an address strictly inside a rewritten
window names a place that is no longer an instruction start (inside the detour's `jmp`, its
int3 fill, the new site, a re-laid instruction), and the program dies there under gdb.

- A line row moves: the rewrite writes its line program again with the row moved
  (rewriter/build.py, elf/dwarf.py `edit_line_programs`). Where it cannot
  (`read_for_detours` says why, or a program that cannot be re-encoded), a window with a
  row inside is refused (`window-line-row`).
- The DIEs are not edited: a window with an inlined subroutine's entry or a label inside
  is refused (`window-debug-entry`), and so is every window of a file whose `.debug_info`
  cannot be read.

`window_debug_refusal` is asked by check (analysis/check.py) and by the plan
(rewriter/plan.py, and both through `relaid_window`), so that check predicts the rewrite.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from usdtpatch.elf.dwarf import (
    DwarfError,
    DwarfToExtend,
    LineTable,
    debug_section,
    read_debug_info,
    read_for_detours,
    read_line_table,
)
from usdtpatch.elf.image import ElfImage
from usdtpatch.findings import WINDOW_DEBUG_ENTRY, WINDOW_LINE_ROW
from usdtpatch.x86.decode import CodeInsn


@dataclass(frozen=True, slots=True)
class _Lines:
    """The file's line rows as far as they can be read (None: not at all), and the DWARF
    the rewrite edits (None: it edits none, `why` says why)."""

    table: LineTable | None
    editable: DwarfToExtend | None
    why: str
    # (address, what) of each DIE a debugger makes a breakpoint of (DebugInfo.breakpoints),
    # sorted; None where `.debug_info` cannot be read (`entries_why` says why)
    entries: tuple[tuple[int, str], ...] | None = ()
    entries_why: str = ""


def _lines(image: ElfImage) -> _Lines | None:
    """None where the file has no `.debug_line` (nothing to keep true)."""
    got = image.derived.get("debug_lines")
    if isinstance(got, tuple):
        out = got[0]
        assert out is None or isinstance(out, _Lines)
        return out
    result: _Lines | None = None
    sec, info = image.section(".debug_line"), image.section(".debug_info")
    if (sec is not None and sec.size) or (info is not None and info.size):
        dwarf = read_for_detours(image)
        if isinstance(dwarf, DwarfToExtend):
            result = _Lines(dwarf.lines, dwarf, "", tuple(sorted(dwarf.info.breakpoints)))
        else:
            why = dwarf if dwarf is not None else "the file has .debug_line but no .debug_info"
            data = debug_section(image, ".debug_line")
            table = None
            if data is not None:
                try:
                    table = read_line_table(image, data=data)
                except DwarfError as exc:
                    why += f"; its .debug_line cannot be read: {exc}"
            elif sec is None or not sec.size:
                table = LineTable()  # no line rows at all
            entries: tuple[tuple[int, str], ...] | None = ()
            entries_why = ""
            if info is not None and info.size:
                try:
                    entries = tuple(sorted(read_debug_info(image).breakpoints))
                except DwarfError as exc:
                    entries, entries_why = None, f"its .debug_info cannot be read: {exc}"
                if debug_section(image, ".debug_info") is None:
                    entries = None
                    entries_why = "its .debug_info cannot be read (compressed other than " \
                                  "with zlib, or damaged)"
            result = _Lines(table=table, editable=None, why=why, entries=entries,
                            entries_why=entries_why)
    image.derived["debug_lines"] = (result,)
    return result


def entry_pinned(image: ElfImage) -> Callable[[CodeInsn], tuple[str, str] | None] | None:
    """The test find_window applies to each instruction of a window (with analysis/
    observed.py's): an instruction at an inlined subroutine's entry or a label does not move,
    so that the window search tries the shapes that leave it out (a backward window ending
    before it) before the site is refused; None where the file names no such address."""
    lines = _lines(image)
    if lines is None or not lines.entries:
        return None
    got = image.derived.get("debug_entries")
    entries: dict[int, str] = {}
    if isinstance(got, dict):
        entries = got
    else:
        for at, what in lines.entries:
            entries.setdefault(at, what)
        image.derived["debug_entries"] = entries

    def test(ins: CodeInsn) -> tuple[str, str] | None:
        what = entries.get(ins.address)
        if what is None:
            return None
        return WINDOW_DEBUG_ENTRY.code, (f"{what} ({ins.address:#x}) is where gdb breaks: the "
                                         f"instruction there does not move")
    return test


def window_debug_refusal(image: ElfImage, start: int, end: int) -> tuple[str, str] | None:
    """(finding code, why) when the window [start, end) is not used for a debugger's
    breakpoint address inside it that the rewrite does not keep true, else None: a line row
    it cannot move (`window-line-row`), an inlined subroutine's entry or a label
    (`window-debug-entry`)."""
    lines = _lines(image)
    if lines is None:
        return None
    where = f"[{start:#x}, {end:#x})"
    if lines.table is None:
        return WINDOW_LINE_ROW.code, (f"the file's line table cannot be read ({lines.why}): "
                                      f"a row may lie inside {where}")
    for row in lines.table.inside(start, end):
        why = lines.why if lines.editable is None else lines.editable.unmovable(row)
        if why:
            return WINDOW_LINE_ROW.code, (f"the line row of {row.file or '?'}:{row.line} at "
                                          f"{row.address:#x} lies inside {where} and cannot "
                                          f"be moved: {why}")
    if lines.entries is None:
        return WINDOW_DEBUG_ENTRY.code, (f"{lines.entries_why}: an inlined subroutine's entry "
                                         f"or a label may lie inside {where}")
    k = bisect_right(lines.entries, (start, "\uffff"))
    if k < len(lines.entries) and lines.entries[k][0] < end:
        at, what = lines.entries[k]
        return WINDOW_DEBUG_ENTRY.code, f"{what} ({at:#x}) lies inside {where}"
    return None
