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

from usdtpatch import __version__
from usdtpatch.elf.cfi import load_cfi
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
from usdtpatch.elf.symbols import symtab_in_place, symtab_with_functions
from usdtpatch.elf.writer import AllocSection, Rewrite, TailSection, in_place_regions, write
from usdtpatch.errors import UnsupportedError
from usdtpatch.findings import PROCESS_CAN_FORK, Finding
from usdtpatch.rewriter.forms import ForkGuard
from usdtpatch.rewriter.marker import MARKER_SECTION, marker_note
from usdtpatch.rewriter.plan import Action, RewritePlan, output_nop5_sites
from usdtpatch.sites.probes import NOTE_SECTION

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
            limit: int) -> list[TailSection]:
    """`.symtab` and its string table with a local STT_FUNC symbol per detour added: grown
    in place when they can be (usdtpatch.elf.symbols.symtab_in_place: nothing of the table is
    copied; sections in the room it takes are re-emitted after the segment), else a new copy
    of both at the end."""
    grown = symtab_in_place(image, syms, text_index, limit)
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
        return out
    edit = symtab_with_functions(image, syms, text_index)
    return [TailSection(".symtab", SHT_SYMTAB, edit.symtab, 8, 24, edit.strtab_name, edit.info),
            TailSection(edit.strtab_name, SHT_STRTAB, edit.strtab, 1)]


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
    syms = []
    for o in plan.sites:
        if o.action is Action.DETOUR and o.detour is not None:
            tag = f"{o.probe.provider}_{o.probe.name}_{o.probe.index}"
            syms.append((f"__usdtpatch_detour_{tag}", o.detour.address, len(o.detour.code)))
    if fork is not None:
        syms += fork.symbols
    symbols = _symtab(image, syms, text_index, plan.layout.offset)
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
    if fork is not None:  # absent without a guard: a file without one is as it always was
        marker["fork_guard"] = dict(fork.marker)
    tail = [TailSection(NOTE_SECTION, SHT_NOTE, note_bytes, 4), *unwind_tail, *symbols,
            TailSection(MARKER_SECTION, SHT_NOTE, marker_note(marker), 4)]
    rw = Rewrite(plan.layout, tuple(patches), tuple(alloc), tuple(tail), renames, hdr_addr)
    said: tuple[Finding, ...] = ()
    if fork is not None:
        from usdtpatch.findings import FORK_GUARDED

        entry = dict(fork.marker)
        span = entry.get("table")
        count = (span[1] - span[0]) // 12 if isinstance(span, list) else 0
        said = (FORK_GUARDED.finding(
            f"fork guard added for {count} site(s): a forked child puts them back on the int3 "
            f"path; the output registers it when it loads, through {entry.get('hook')}"),)
    return Built(write(image, rw), said, fork is not None)
