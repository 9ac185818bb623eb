"""Rewrite, step 2: build the output file from a `RewritePlan` (bytes in, bytes out).

The builder follows the plan and decides nothing about sites. In order: the new segment's
code (the plan's detours), the fork guard's code after it (`_fork_guard`), an FDE per detour
and a new `.eh_frame_hdr` indexing them with the original `.eh_frame`'s, the notes with their
moved pcs and guarded arguments, a local symbol per detour, the restore marker; then
usdtpatch.elf.writer lays out the file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from usdtpatch.analysis.probes import NOTE_SECTION
from usdtpatch.elf.cfi import load_cfi
from usdtpatch.elf.dwarf import (
    DetourLines,
    DwarfError,
    build_detour_dwarf,
    has_dwarf,
    read_debug_info,
    read_line_table,
)
from usdtpatch.elf.ehframe import (
    Personality,
    build_cie,
    build_debug_frame,
    build_eh_frame_hdr,
    build_fde,
    build_personality_cie,
)
from usdtpatch.elf.image import (
    PT_GNU_EH_FRAME,
    SHF_ALLOC,
    SHF_COMPRESSED,
    SHF_EXECINSTR,
    SHT_NOTE,
    SHT_PROGBITS,
    SHT_STRTAB,
    SHT_SYMTAB,
    ElfImage,
)
from usdtpatch.elf.notes import NoteSection, SdtNote, build_id, serialize_notes
from usdtpatch.elf.symbols import DETOUR_PREFIX, symtab_in_place, symtab_with_functions
from usdtpatch.elf.writer import (
    AllocSection,
    Rewrite,
    TailSection,
    cut_copy_at,
    in_place_regions,
    write,
)
from usdtpatch.errors import UnsupportedError
from usdtpatch.findings import PROCESS_CAN_FORK, Finding
from usdtpatch.rewriter.forms import ForkGuard
from usdtpatch.rewriter.marker import MARKER_SECTION, marker_note
from usdtpatch.rewriter.plan import Action, RewritePlan, output_nop5_sites
from usdtpatch.version import __version__

TEXT_SECTION = ".usdtpatch.text"
EH_FRAME_SECTION = ".usdtpatch.eh_frame"  # the detours' CIE and FDEs


@dataclass(frozen=True, slots=True)
class Built:
    """The output file of a plan, and what the builder has to say about it."""

    data: bytes
    findings: tuple[Finding, ...] = ()
    fork_guarded: bool = False  # the output carries the fork guard


def output_findings(plan: RewritePlan, built: Built) -> tuple[Finding, ...]:
    """What a rewrite says about its output: the plan's findings (the input's check and the
    decisions) and the builder's; where the output carries the fork guard, the input's
    `process-can-fork` hazard is covered there and left out (`fork-guarded` says so). Every
    caller that builds a plan reports these, so the question is decided here only."""
    said = plan.findings + built.findings
    if built.fork_guarded:
        said = tuple(f for f in said if f.code != PROCESS_CAN_FORK.code)
    return said


@dataclass(frozen=True, slots=True)
class ForkGuardCode:
    """What the fork guard adds: code at `address` in the new segment, and in-place edits
    (file offset, bytes) that make the object register the guard when it loads."""

    address: int
    text: bytes
    patches: tuple[tuple[int, bytes], ...]
    symbols: tuple[tuple[str, int, int], ...] = ()  # (name, address, size)
    marker: tuple[tuple[str, object], ...] = ()  # what the restore marker records of it


def guard_sites(plan: RewritePlan) -> tuple[tuple[int, bytes], ...]:
    """Every NOP the kernel will optimize in the output: (vaddr, its bytes in the output).

    The rewritten sites (at their new pc) and the sites that already were 5-byte NOPs.
    """
    return output_nop5_sites(plan.image, plan.form, plan.sites)


def _fork_guard(plan: RewritePlan, place_at: int) -> ForkGuardCode | None:
    """THE FORK GUARD SEAM: the guard's code to add at `place_at` (just after the detours in
    the new segment, 16-byte aligned), or None for no guard (docs/fork-guard.md).

    usdtpatch.forkguard.build_guard(image, sites, place_at) builds it (sites:
    `guard_sites(plan)`; sites a 6.18 kernel never optimizes, such as combo10's, need none).
    --fork-guard auto adds it to a file whose process may fork a copy of itself
    (forkguard.fork_exposure: it calls fork and the like, or it is a shared object), always to
    every file; a file that needs it and cannot carry it is refused (UnsupportedError) unless
    --fork-guard never.
    """
    if plan.fork_refusal is not None:  # the plan decided it (rewrite --dry-run says so too)
        raise UnsupportedError(plan.fork_refusal)
    if plan.fork_guard is ForkGuard.NEVER:
        return None
    from usdtpatch import forkguard

    exposure = forkguard.fork_exposure(plan.image)
    if plan.fork_guard is ForkGuard.AUTO and exposure is None:
        return None
    try:
        g = forkguard.build_guard(plan.image, guard_sites(plan), place_at)
    except forkguard.GuardUnsupported as exc:
        why = exposure or "--fork-guard always"
        raise UnsupportedError(
            f"the fork guard cannot be added ({exc}) and the optimized sites would crash a "
            f"forked child ({why}): rewrite with --fork-guard never to accept that") from exc
    if g.empty:
        return None
    return ForkGuardCode(place_at, g.text, g.patches, g.symbols,
                         tuple(forkguard.marker_entry(g).items()))


def _unwind_tables(plan: RewritePlan, eh_frame_addr: int, end: int
                   ) -> tuple[int, list[AllocSection], TailSection | None]:
    """The detours' unwind tables, placed from `end` on: (vaddr of the new `.eh_frame_hdr`,
    the sections of the new segment, the `.debug_frame` for gdb or None).

    The original `.eh_frame` is left where it is; the new header's table holds its FDEs (from
    the original header's table) and the detours' (docs/rewrite.md, "What each consumer needs")."""
    image = plan.image
    blob_addr = (end + 7) & ~7
    blob = bytearray(build_cie())
    cfi = load_cfi(image)
    table = list(zip(cfi.starts, cfi.fde_addresses, strict=True))
    personality_cies: dict[Personality, int] = {}  # detours with an LSDA (moved calls)
    for du in plan.unwind:
        cie_addr = blob_addr
        if du.lsda is not None and du.personality is not None:
            got = personality_cies.get(du.personality)
            if got is None:
                got = blob_addr + len(blob)
                blob += build_personality_cie(got, du.personality)
                personality_cies[du.personality] = got
            cie_addr = got
        fde_addr = blob_addr + len(blob)
        blob += build_fde(fde_addr, cie_addr, du.detour.address, du.detour.end,
                          list(du.rows), du.lsda)
        table.append((du.detour.address, fde_addr))
    blob += b"\0\0\0\0"  # terminator
    hdr_addr = (blob_addr + len(blob) + 3) & ~3
    hdr = build_eh_frame_hdr(hdr_addr, eh_frame_addr, table)
    alloc = [AllocSection(EH_FRAME_SECTION, SHT_PROGBITS, SHF_ALLOC, blob_addr, bytes(blob), 8),
             AllocSection(".eh_frame_hdr", SHT_PROGBITS, SHF_ALLOC, hdr_addr, hdr, 4)]
    old = image.section(".debug_frame")
    debug_frame = None
    if old is None or (old.type == SHT_PROGBITS and not old.flags & (SHF_ALLOC
                                                                       | SHF_COMPRESSED)):
        existing = image.section_data(old) if old is not None else b""
        debug_frame = TailSection(".debug_frame", SHT_PROGBITS, build_debug_frame(
            existing, [(du.detour.address, du.detour.end, list(du.rows))
                       for du in plan.unwind]), 8)
    return hdr_addr, alloc, debug_frame


def _build_id(image: ElfImage) -> str | None:
    sec = image.section(".note.gnu.build-id")
    return None if sec is None else build_id(image.section_data(sec))


def _symtab(image: ElfImage, syms: list[tuple[str, int, int]], text_index: int,
            limit: int, cut: int | None = None
            ) -> tuple[list[TailSection], tuple[Finding, ...]]:
    """`.symtab` and its string table with a local STT_FUNC symbol per detour added: grown
    in place when they can be (usdtpatch.elf.symbols.symtab_in_place: nothing of the table is
    copied; sections in the room it takes are re-emitted after the segment), else a new copy
    of both at the end. Past the `cut` of the input (usdtpatch.elf.writer.plan_segment)
    the table grows in the writer's copy of the input's end, with no limit."""
    grown = symtab_in_place(image, syms, text_index, limit if cut is None else 1 << 62)
    if grown is not None and cut is not None and any(
            at < cut < at + len(data) or (at < cut and at + len(data) > limit)
            for at, data in ((grown.symtab_offset, grown.prefix), (grown.names_at, grown.names))):
        grown = None  # it would straddle the cut (usdtpatch.elf.writer.plan_segment)
    if grown is not None:
        out = [TailSection(".symtab", SHT_SYMTAB, grown.prefix, 8, 24, grown.strtab_name,
                           grown.info, (grown.symtab_offset, grown.symtab_size,
                                        grown.symtab_offset)),
               TailSection(grown.strtab_name, SHT_STRTAB, grown.names, 1,
                           place=(grown.strtab_offset, grown.strtab_size, grown.names_at))]
        for name in grown.moved:
            if name == NOTE_SECTION:
                continue  # written anew with the moved pcs
            sec = image.section(name)
            assert sec is not None
            out.append(TailSection(name, sec.type, image.section_data(sec),
                                   max(1, sec.addralign), sec.entsize))
        return out, ()
    left_out = _symtab_copy_refused(image)
    if left_out is not None:
        return [], (left_out,)
    edit = symtab_with_functions(image, syms, text_index)
    return [TailSection(".symtab", SHT_SYMTAB, edit.symtab, 8, 24, edit.strtab_name, edit.info),
            TailSection(edit.strtab_name, SHT_STRTAB, edit.strtab, 1)], ()


SYMTAB_COPY_FLOOR = 64 << 10  # a table this small is copied whatever the file's size


def _symtab_copy_refused(image: ElfImage) -> Finding | None:
    """`detour-symbols-left-out` when `.symtab` cannot grow in place and copying it and its
    strings to the end would grow the file by more than 1% (and 64 KiB): a file grows by at
    most its detours, their tables and 1% (issue 22), and a 10-million-entry table is not
    copied (issue 20, item 11: 2.4 GB of memory, a file twice its size)."""
    from usdtpatch.findings import DETOUR_SYMBOLS_LEFT_OUT

    old = image.section(".symtab")
    if old is None or old.type != SHT_SYMTAB or not 0 < old.link < len(image.sections):
        return None  # a new, small table
    copied = old.size + image.sections[old.link].size
    budget = max(SYMTAB_COPY_FLOOR, len(image.data) // 100)
    if copied <= budget:
        return None
    return DETOUR_SYMBOLS_LEFT_OUT.finding(
        f".symtab ({old.size // 24} entries) cannot grow where it is, and copying it with its "
        f"strings ({copied} bytes) would grow the file by more than {budget} bytes (1%): the "
        f"detours are left without symbols")


def detour_symbols(plan: RewritePlan) -> list[tuple[str, int, int]]:
    """(name, address, size) of the local STT_FUNC symbol of each detour, named as compilers
    name the split-off parts of a function (`f.cold`, `f.part.0`): `f.usdtpatch.N`, N
    counting f's detours from 0, so that backtraces and profilers without debug information
    still name the original function f; `__usdtpatch_detour_<provider>_<name>_<index>` where
    the site's function has no symbol."""
    out = []
    count: dict[str, int] = {}
    for o in plan.sites:
        if o.action is Action.DETOUR and o.detour is not None:
            fn = o.probe.function
            if fn:
                name = f"{fn}.usdtpatch.{count.get(fn, 0)}"
                count[fn] = count.get(fn, 0) + 1
            else:
                name = f"{DETOUR_PREFIX}{o.probe.provider}_{o.probe.name}_{o.probe.index}"
            out.append((name, o.detour.address, len(o.detour.code)))
    return out


def _debug_info(plan: RewritePlan, names: dict[int, str], low: int, high: int
                ) -> list[TailSection]:
    """Where the input has DWARF (usdtpatch.elf.dwarf.has_dwarf), its `.debug_info`,
    `.debug_abbrev`, `.debug_line` (and `.debug_aranges`) with a compile unit for the
    detours appended: each detour a subprogram whose abstract origin is the original
    function's DIE, each moved instruction at the original's file and line. None where the
    input has none, or its DWARF cannot be read (the detours keep their symbols)."""
    image = plan.image
    detours = [o for o in plan.sites if o.action is Action.DETOUR and o.detour is not None
               and o.window is not None]
    if not detours or not has_dwarf(image):
        return []
    try:
        info = read_debug_info(image)
        lines = read_line_table(image, {u.stmt_list: u.comp_dir for u in info.units
                                        if u.stmt_list is not None})
        out: list[DetourLines] = []
        unit = None
        for o in detours:
            assert o.detour is not None and o.window is not None
            rows = []
            for orig, new in o.detour.insn_map[:-1]:  # the last pair: the jump back
                row = lines.lookup(orig)
                if row is not None:
                    rows.append((new, row.file, row.line, row.column))
            sp = info.subprogram_at(o.window.start)
            if sp is None and not rows:
                continue
            if unit is None and sp is not None:
                unit = info.units[sp.unit]
            out.append(DetourLines(o.detour.address, o.detour.end,
                                   None if sp is None else sp.die,
                                   names.get(o.detour.address, ""), tuple(rows)))
        if not out:
            return []
        if unit is None:
            unit = info.units[0] if info.units else None
        dd = build_detour_dwarf(image, out, low, high,
                                unit.name if unit is not None else "<usdtpatch detours>",
                                unit.comp_dir if unit is not None else "",
                                unit.language if unit is not None else 0)
    except DwarfError:
        return []
    tail = [TailSection(".debug_info", SHT_PROGBITS, dd.debug_info, 1),
            TailSection(".debug_abbrev", SHT_PROGBITS, dd.debug_abbrev, 1),
            TailSection(".debug_line", SHT_PROGBITS, dd.debug_line, 1)]
    if dd.debug_aranges is not None:
        tail.append(TailSection(".debug_aranges", SHT_PROGBITS, dd.debug_aranges, 1))
    return tail


def build_rewrite(plan: RewritePlan) -> Built:
    """The rewritten file of `plan` (which must change the file: `plan.changed`)."""
    if not plan.changed or plan.layout is None:
        raise ValueError("build_rewrite needs a plan that changes the file")
    image, ps = plan.image, plan.probeset
    text_addr, text = plan.text_addr, plan.text
    patches = list(plan.patches)
    fork = _fork_guard(plan, (text_addr + len(text) + 15) & ~15)
    if fork is not None:
        text += b"\xcc" * (fork.address - (text_addr + len(text))) + fork.text
        patches += fork.patches
    alloc = [AllocSection(TEXT_SECTION, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, text_addr, text)]
    renames: dict[str, str] = {}
    hdr_addr: int | None = None
    unwind_tail: list[TailSection] = []
    eh = image.section(".eh_frame")
    has_hdr = any(s.type == PT_GNU_EH_FRAME for s in image.segments)
    if eh is not None and eh.addr and has_hdr and plan.unwind:
        hdr_addr, blobs, debug_frame = _unwind_tables(plan, eh.addr, text_addr + len(text))
        alloc += blobs
        if debug_frame is not None:
            unwind_tail.append(debug_frame)
        if image.section(".eh_frame_hdr") is not None:
            renames = {".eh_frame_hdr": ".eh_frame_hdr.orig"}

    # notes: the moved pcs and the guarded arguments
    notes = ps.notes
    assert isinstance(notes, NoteSection)
    new_args = dict(plan.new_args)
    changed: dict[int, SdtNote] = {}
    for o in plan.sites:
        if o.new_pc is None:
            continue
        note = o.probe.note
        adjust = o.probe.address - note.pc
        changed[note.offset] = replace(note, pc=o.new_pc - adjust,
                                       args=new_args.get(o.probe.index, note.args))
    new_notes = NoteSection(tuple(changed.get(n.offset, n) if isinstance(n, SdtNote) else n
                                  for n in notes.notes), notes.trailer, notes.trailer_reason)
    note_bytes = serialize_notes(new_notes, 8, "<")

    text_index = len(image.sections)  # .usdtpatch.text is the first new section
    syms = detour_symbols(plan)
    if fork is not None:
        syms += fork.symbols
    symbols, symbol_findings = _symtab(image, syms, text_index, plan.layout.offset,
                                       plan.layout.cut)
    # what the marker must give back: the in-place edits, and the original bytes under a
    # section grown in place (restore truncates the file, so only bytes inside it count)
    kept = list(patches) + [(t.place[2], t.data) for t in symbols if t.place is not None
                            and t.place[2] < len(image.data)]
    kept += [(off, bytes(size)) for off, size in in_place_regions(image, plan.layout)]
    lengths: dict[int, int] = {}
    for off, code in kept:  # one entry per offset, the longest range written there
        lengths[off] = max(lengths.get(off, 0), len(code))
    marker: dict[str, object] = {
        "tool": "usdtpatch", "version": __version__, "form": plan.form.value,
        "guard": plan.guard.value,
        "original_size": len(image.data),
        "original_sha256": hashlib.sha256(image.data).hexdigest(),
        "elf_header": image.data[:64].hex(),
        "build_id": _build_id(image),
        "patches": [[off, image.data[off : off + n].hex()] for off, n in sorted(lengths.items())],
        "sites": [{"probe": o.probe.probe_id, "address": o.probe.address,
                   "action": o.action.value, "new_pc": o.new_pc, "guarded": o.guarded,
                   "reason": o.reason,
                   "window": None if o.window is None else [o.window.start, o.window.end]}
                  for o in plan.sites],
    }
    if plan.layout.cut is not None:  # the input from `cut` on lies at `copy` in the output
        marker["cut"] = [plan.layout.cut, cut_copy_at(plan.layout, alloc)]
    if fork is not None:  # absent without a guard: a file without one is as it always was
        marker["fork_guard"] = dict(fork.marker)
    tail = [TailSection(NOTE_SECTION, SHT_NOTE, note_bytes, 4), *unwind_tail, *symbols,
            *_debug_info(plan, dict((a, n) for n, a, _s in syms), text_addr,
                         text_addr + len(text))]
    tail.append(TailSection(MARKER_SECTION, SHT_NOTE, marker_note(marker), 4))
    rw = Rewrite(plan.layout, tuple(patches), tuple(alloc), tuple(tail), renames, hdr_addr)
    said: tuple[Finding, ...] = symbol_findings
    if fork is not None:
        from usdtpatch.findings import FORK_GUARDED

        entry = dict(fork.marker)
        span = entry.get("table")
        count = (span[1] - span[0]) // 12 if isinstance(span, list) else 0
        said += (FORK_GUARDED.finding(
            f"fork guard added for {count} site(s): a forked child puts them back on the int3 "
            f"path; the output registers it when it loads, through {entry.get('hook')}"),)
    return Built(write(image, rw), said, fork is not None)
