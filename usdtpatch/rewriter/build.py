"""Rewrite, step 2: build the output file from a `RewritePlan` (bytes in, bytes out).

The builder follows the plan and decides nothing: what the output holds and what the rewrite
says about it (the fork guard, the detours' symbols and where they go, every finding) is the
plan's, so that `rewrite --dry-run` says what the real run does. In order: the new segment's
code (the plan's detours), the plan's fork guard code after it, an FDE per detour and a new
`.eh_frame_hdr` indexing them with the original `.eh_frame`'s, the notes with their moved pcs
and guarded arguments, the plan's symbols, the restore marker; then usdtpatch.elf.writer lays
out the file.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator
from dataclasses import replace

from usdtpatch import heap
from usdtpatch.analysis.probes import NOTE_SECTION
from usdtpatch.elf.cfi import load_cfi
from usdtpatch.elf.dwarf import (
    DebugInfo,
    DetourLines,
    DwarfError,
    LineMove,
    LineTable,
    build_detour_dwarf,
    compressed,
    picked_statements,
)
from usdtpatch.elf.dynsym import grow_dynsym
from usdtpatch.elf.ehframe import (
    Personality,
    build_cie,
    build_debug_frame,
    build_eh_frame_hdr,
    build_fde,
    build_personality_cie,
)
from usdtpatch.elf.image import (
    SHF_ALLOC,
    SHF_COMPRESSED,
    SHF_EXECINSTR,
    SHT_NOTE,
    SHT_PROGBITS,
    SHT_STRTAB,
    SHT_SYMTAB,
    ElfImage,
    FileBytes,
)
from usdtpatch.elf.marker import MARKER_SECTION, MARKER_SECTION_TYPE, Encoded, MarkerNote
from usdtpatch.elf.notes import NoteSection, SdtNote, build_id, serialize_note
from usdtpatch.elf.symbols import symtab_with_functions
from usdtpatch.elf.writer import (
    AllocSection,
    Rewrite,
    TailSection,
    cut_copy_at,
    in_place_regions,
    write,
)
from usdtpatch.errors import UnsupportedError
from usdtpatch.rewriter.plan import (
    Action,
    DetourSymbols,
    RewritePlan,
    UnwindTables,
    text_section_index,
)
from usdtpatch.version import __version__

TEXT_SECTION = ".usdtpatch.text"
EH_FRAME_SECTION = ".usdtpatch.eh_frame"  # the detours' CIE and FDEs


def _unwind_tables(plan: RewritePlan, where: UnwindTables, end: int
                   ) -> tuple[int, list[AllocSection]]:
    """The detours' unwind tables, as the plan places them (`where`), from `end` on: (vaddr
    of the new `.eh_frame_hdr`, the sections of the new segment).

    The original `.eh_frame` is left where it is; the new header's table holds its FDEs (from
    the original header's table) and the detours' (docs/rewrite.md, "What each consumer needs").
    The detours' FDEs go to an allocated `.debug_frame` in the new segment too: gdb and
    elfutils (eu-stack, perf) read `.eh_frame` by name and merge `.debug_frame`, and strip,
    `strip --strip-debug` and eu-strip keep an allocated section (binutils marks only
    non-allocated `.debug*` sections as debugging, issue 33). Where the input has a
    `.debug_frame` of its own, that one is copied there with them (two sections of one name
    are read differently: gdb takes the last, elfutils the first)."""
    image = plan.image
    blob_addr = (end + 7) & ~7
    blob = bytearray(build_cie())
    cfi = load_cfi(image)
    starts, fdes = list(cfi.starts), list(cfi.fde_addresses)  # then the detours'
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
        blob += build_fde(fde_addr, cie_addr, du.start, du.end, du.program, du.lsda)
        starts.append(du.start)
        fdes.append(fde_addr)
    blob += b"\0\0\0\0"  # terminator
    hdr_addr = (blob_addr + len(blob) + 3) & ~3
    hdr = build_eh_frame_hdr(hdr_addr, where.eh_frame, starts, fdes)
    del starts, fdes
    alloc = [AllocSection(name=EH_FRAME_SECTION, type=SHT_PROGBITS, flags=SHF_ALLOC,
                          vaddr=blob_addr, data=bytes(blob), align=8),
             AllocSection(name=".eh_frame_hdr", type=SHT_PROGBITS, flags=SHF_ALLOC,
                          vaddr=hdr_addr, data=hdr, align=4)]
    old = image.section(".debug_frame")
    if where.debug_frame:
        existing = image.section_data(old) if old is not None else b""
        data = build_debug_frame(existing, [(du.start, du.end, du.program)
                                            for du in plan.unwind])
        at = (hdr_addr + len(hdr) + 7) & ~7
        # the input's own (its functions' rows with the detours') takes its header over;
        # its bytes stay as `.debug_frame.orig`, which strip removes
        alloc.append(AllocSection(name=".debug_frame", type=SHT_PROGBITS, flags=SHF_ALLOC,
                                  vaddr=at, data=data, align=8, replaces=old is not None,
                                  old_name=".debug_frame.orig"))
    return hdr_addr, alloc


BUILD_ID_SECTION = ".note.gnu.build-id"


def _build_id(image: ElfImage) -> str | None:
    sec = image.section(BUILD_ID_SECTION)
    return None if sec is None else build_id(image.section_data(sec))


def new_build_id(old: bytes, text: bytes, patches: list[tuple[int, bytes]]) -> bytes:
    """The output's build-id (docs/rewrite.md, "Debugging information"): as long as the
    original's, derived from it and from what the rewrite writes (the new segment's code and
    the in-place edits), so that the same rewrite of the same file gets the same id and a
    rewritten file never shares its original's (perf's build-id cache, issue 33)."""
    h = hashlib.sha256(b"usdtpatch build-id\0" + old)
    h.update(hashlib.sha256(text).digest())
    for off, code in sorted(patches):
        h.update(off.to_bytes(8, "little") + len(code).to_bytes(4, "little") + code)
    out = b""
    while len(out) < len(old):
        out += h.digest()
        h = hashlib.sha256(out)
    return out[: len(old)]


def _build_id_place(image: ElfImage) -> tuple[int, bytes] | None:
    """(file offset, bytes) of the input's build-id (the first note's desc of
    `.note.gnu.build-id`), or None."""
    sec = image.section(BUILD_ID_SECTION)
    old = _build_id(image)
    if sec is None or old is None:
        return None
    namesz = int.from_bytes(image.data[sec.offset : sec.offset + 4], "little")
    return sec.offset + 12 + ((namesz + 3) & ~3), bytes.fromhex(old)


def _symtab(image: ElfImage, symbols: DetourSymbols) -> list[TailSection]:
    """`.symtab` and its string table with the plan's symbols added (DetourSymbols): grown in
    place (nothing of the table is copied; sections in the room it takes are re-emitted after
    the segment), a new copy of both at the end, or as they are (`left_out`)."""
    grown = symbols.in_place
    if grown is not None:
        out = [TailSection(name=".symtab", type=SHT_SYMTAB, data=grown.prefix, align=8,
                           entsize=24, link_name=grown.strtab_name, info=grown.info,
                           place=(grown.symtab_offset, grown.symtab_size,
                                  grown.symtab_offset)),
               TailSection(grown.strtab_name, SHT_STRTAB, grown.names, 1,
                           place=(grown.strtab_offset, grown.strtab_size, grown.names_at))]
        for name in grown.moved:
            if name == NOTE_SECTION:
                continue  # written anew with the moved pcs
            sec = image.section(name)
            assert sec is not None
            out.append(TailSection(name=name, type=sec.type, data=image.section_data(sec),
                                   align=max(1, sec.addralign), entsize=sec.entsize))
        return out
    if symbols.left_out is not None:
        return []
    edit = symtab_with_functions(image, list(symbols.symbols), text_section_index(image))
    return [TailSection(name=".symtab", type=SHT_SYMTAB, data=edit.symtab, align=8, entsize=24,
                        link_name=edit.strtab_name, info=edit.info),
            TailSection(edit.strtab_name, SHT_STRTAB, edit.strtab, 1)]


def _line_moves(plan: RewritePlan, info: DebugInfo) -> dict[int, LineMove]:
    """What each rewritten window does to the line rows in it (LineMove), by the window's
    start: a detour's window, a NOP run written over and a system call's window moved to
    the fork guard's hook drop the rows strictly inside, a re-laid window moves each row
    with its instruction."""
    out = {}
    for o in plan.sites:
        w = o.span
        if w is None or o.action not in (Action.DETOUR, Action.IN_PLACE):
            continue
        sp = info.subprogram_at(w.start)
        scope = (sp.low, sp.high) if sp is not None else (w.function_start, w.function_end)
        out[w.start] = LineMove(start=w.start, end=w.end,
                                moved=None if o.relaid is None else o.relaid.insn_map, scope=scope,
                                detour=o.action is Action.DETOUR, blocks=info.blocks_in(*scope))
    if plan.fork_guard_code is not None:  # a static executable's hooked system calls
        for start, end in plan.fork_guard_code.hooked:
            out[start] = LineMove(start, end, detour=False)
    return out


def _detour_rows(lines: LineTable, mv: LineMove, insn_map: tuple[tuple[int, int], ...]
                 ) -> list[tuple[int, str, int, int, bool]]:
    """The detour's line rows: each original row at a moved instruction's address, at the
    copy's address, a statement where a debugger's `break FILE:LINE` picked the original's
    (picked_statements: the original keeps the row at the window's start, where its `jmp`
    is, so the copy of that one is no statement and a breakpoint on its line is hit once);
    an instruction without a row of its own gets the row in force there, no statement."""
    picked = {id(r) for r in picked_statements(lines, mv)}
    rows = []
    for orig, new in insn_map[:-1]:  # the last pair: the jump back
        own = lines.at(orig) if orig != mv.start else []
        if own:
            rows += [(new, r.file, r.line, r.column, id(r) in picked) for r in own]
        elif (row := lines.lookup(orig)) is not None:
            rows.append((new, row.file, row.line, row.column, False))
    return rows


def _debug_info(plan: RewritePlan, names: dict[int, str], low: int, high: int
                ) -> list[TailSection]:
    """Where the input has DWARF (usdtpatch.elf.dwarf.has_dwarf), its `.debug_info`,
    `.debug_abbrev`, `.debug_line` (and `.debug_aranges`) with a compile unit for the
    detours appended: each detour a subprogram whose abstract origin is the original
    function's DIE, each moved instruction at the original's file and line; and the line
    programs with a row inside a rewritten window written again without it (`_line_moves`).
    None where the plan read no DWARF to extend (`plan.dwarf`: the input has none, or the
    plan said why not, `detour-dwarf-left-out`, and refused every window with a line row
    inside, `window-line-row`; the detours keep their symbols)."""
    image = plan.image
    detours = [o for o in plan.sites if o.action is Action.DETOUR and o.detour is not None
               and o.span is not None]
    if plan.dwarf is None:
        return []
    info, lines = plan.dwarf.info, plan.dwarf.lines
    moves = _line_moves(plan, info)
    if not detours and not any(lines.inside(m.start, m.end) for m in moves.values()):
        return []
    try:
        out: list[DetourLines] = []
        unit = None
        for o in detours:
            assert o.detour is not None and o.span is not None
            rows = _detour_rows(lines, moves[o.span.start], o.detour.insn_map)
            sp = info.subprogram_at(o.span.start)
            if sp is None and not rows:
                continue
            if unit is None and sp is not None:
                unit = info.units[sp.unit]
            out.append(DetourLines(start=o.detour.address, end=o.detour.end,
                                   origin=None if sp is None else sp.die,
                                   name=names.get(o.detour.address, ""), rows=tuple(rows)))
        if unit is None:
            unit = info.units[0] if info.units else None
        dd = build_detour_dwarf(image, out, low, high,
                                unit.name if unit is not None else "<usdtpatch detours>",
                                unit.comp_dir if unit is not None else "",
                                unit.language if unit is not None else 0, plan.dwarf,
                                list(moves.values()))
    except DwarfError:  # what the plan's reading accepted (read_for_detours) it can extend
        return []
    sections = [(".debug_info", dd.debug_info), (".debug_abbrev", dd.debug_abbrev),
                (".debug_line", dd.debug_line)]
    if dd.debug_aranges is not None:
        sections.append((".debug_aranges", dd.debug_aranges))
    # a section read inflated (gcc -gz) is written uncompressed
    return [TailSection(name, SHT_PROGBITS, data, 1,
                        flags=(sec.flags & ~SHF_COMPRESSED) if compressed(image, name) and
                        (sec := image.section(name)) is not None else None)
            for name, data in sections]


def _notes(plan: RewritePlan) -> bytes:
    """The `.note.stapsdt` of the output: the moved pcs and the guarded arguments, each note
    made and written in turn (issue 38: every changed note held at once was ~0.3 KB a
    site of the rewrite's peak)."""
    notes = plan.probeset.notes
    assert isinstance(notes, NoteSection)
    new_args = dict(plan.new_args)
    moved = {o.probe.note.offset: o for o in plan.sites if o.new_pc is not None}
    out = bytearray()
    for n in notes.notes:
        o = moved.get(n.offset) if isinstance(n, SdtNote) else None
        if o is not None and o.new_pc is not None:
            note = o.probe.note
            out += serialize_note(replace(note, pc=o.new_pc - (o.probe.address - note.pc),
                                          args=new_args.get(o.probe.index, note.args)), 8, "<")
        else:
            out += serialize_note(n, 8, "<")
    out += notes.trailer
    return bytes(out)


def _hex_pair(data: FileBytes, off: int, n: int) -> Iterator[bytes]:
    """The JSON text of [off, data[off : off + n] in hex], a piece at a time."""
    yield b"[%d,\"" % off
    for at in range(off, off + n, 1 << 16):
        yield data[at : min(at + (1 << 16), off + n)].hex().encode()
    yield b"\"]"


def _marker(plan: RewritePlan, patches: list[tuple[int, bytes]], symbols: list[TailSection],
            alloc: list[AllocSection]) -> MarkerNote:
    """The restore marker's note: the in-place edits' original bytes and the original bytes
    under a section grown in place (restore truncates the file, so only bytes inside it
    count), the sites, the cut and the fork guard. The patches and the sites are encoded one
    by one as the note is written into the output (MarkerNote; a dict per site held at once
    was 570 bytes a probe, the note's bytes held 250, issue 38)."""
    image, layout = plan.image, plan.layout
    assert layout is not None
    kept = [*((off, len(code)) for off, code in patches),
            *((t.place[2], len(t.data)) for t in symbols if t.place is not None
              and t.place[2] < len(image.data)),
            *in_place_regions(image, layout)]
    lengths: dict[int, int] = {}
    for off, size in kept:  # one entry per offset, the longest range written there
        lengths[off] = max(lengths.get(off, 0), size)
    del kept
    offsets = array("q", sorted(lengths))
    sizes = array("q", (lengths[off] for off in offsets))
    del lengths
    marker: dict[str, object] = {
        "tool": "usdtpatch", "version": __version__, "form": plan.form.value,
        "guard": plan.guard.value,
        "original_size": len(image.data),
        "original_sha256": hashlib.sha256(image.data).hexdigest(),
        "elf_header": image.data[:64].hex(),
        "build_id": _build_id(image),
    }
    if layout.cut is not None:  # the input from `cut` on lies at `copy` in the output
        marker["cut"] = [layout.cut, cut_copy_at(layout, alloc)]
    if plan.fork_guard_code is not None:  # absent without a guard: as it always was
        marker["fork_guard"] = dict(plan.fork_guard_code.marker)

    def patched() -> Iterator[Encoded]:  # [offset, "hex"], json's text, 64 KiB at a time
        return (Encoded(_hex_pair(image.data, off, n)) for off, n in zip(offsets, sizes,
                                                                         strict=True))

    def sites() -> Iterator[dict[str, object]]:
        return ({"probe": o.probe.probe_id, "address": o.probe.address,
                 "action": o.action.value, "new_pc": o.new_pc, "guarded": o.guarded,
                 "reason": o.reason,
                 "window": None if o.span is None else [o.span.start, o.span.end]}
                for o in plan.sites)

    return MarkerNote(marker, {"patches": patched, "sites": sites})


def build_rewrite(plan: RewritePlan, keep_build_id: bool = False) -> bytes:
    """The rewritten file of `plan` (which must change the file: `plan.changed`, and not be
    refused: `plan.fork_refusal`). Its build-id is a new one (`new_build_id`; the marker keeps
    the original's), or the original's with `keep_build_id`."""
    if not plan.changed or plan.layout is None or plan.symbols is None:
        raise ValueError("build_rewrite needs a plan that changes the file")
    if plan.fork_refusal is not None:
        raise UnsupportedError(plan.fork_refusal)
    image = plan.image
    text_addr, text = plan.text_addr, plan.text
    patches = list(plan.patches)
    fork = plan.fork_guard_code
    if fork is not None:
        text += b"\xcc" * (fork.address - (text_addr + len(text))) + fork.text
        patches += fork.patches
    alloc = [AllocSection(name=TEXT_SECTION, type=SHT_PROGBITS, flags=SHF_ALLOC | SHF_EXECINSTR,
                          vaddr=text_addr, data=text)]
    bid = None if keep_build_id else _build_id_place(image)
    moved: tuple[tuple[int, bytes], ...] = ()  # a build-id note moved into the new segment
    if bid is not None:
        at, old_id = bid
        new_id = new_build_id(old_id, text, patches)
        mv = plan.layout.moved
        if mv is not None and mv.lo <= at < mv.hi:
            moved = ((at, new_id),)  # written where the note lands (its old place is the
            # headers')
        else:
            patches.append((at, new_id))  # in place: the marker keeps the original bytes
    renames: dict[str, str] = {}
    hdr_addr: int | None = None
    if plan.unwind_tables is not None:
        hdr_addr, blobs = _unwind_tables(plan, plan.unwind_tables, text_addr + len(text))
        alloc += blobs
        if image.section(".eh_frame_hdr") is not None:
            renames = {".eh_frame_hdr": ".eh_frame_hdr.orig"}
    grown: tuple[tuple[str, int], ...] = ()
    dyn = grow_dynsym(image, list(plan.symbols.dynamic), text_section_index(image),
                      max(a.vaddr + len(a.data) for a in alloc))
    if dyn is not None:  # the detours' names in `.dynsym` (a stripped file's)
        alloc += dyn.alloc
        patches += dyn.patches
        grown = dyn.grown
    symbols = _symtab(image, plan.symbols)
    names = {a: n for n, a, _s in plan.symbols.symbols}
    tail = [TailSection(NOTE_SECTION, SHT_NOTE, _notes(plan), 4), *symbols,
            *_debug_info(plan, names, text_addr, text_addr + len(text))]
    del names  # the detours' names, a dict entry each, are not held while the file is made
    tail.append(TailSection(MARKER_SECTION, MARKER_SECTION_TYPE,
                            _marker(plan, patches, symbols, alloc), 4))
    heap.give_back()  # the output, a buffer the size of the file, does not sit on freed pages
    return write(image, Rewrite(layout=plan.layout, patches=tuple(patches), alloc=tuple(alloc),
                                tail=tuple(tail), renames=renames, eh_frame_hdr=hdr_addr,
                                grown=grown, moved_patches=moved))
