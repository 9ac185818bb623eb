"""Writing a rewritten ELF file: one new PT_LOAD appended, nothing original moved but the
few sections in the way of one more program header.

Reference: gABI program headers and section headers; the layout that was found to work with
every consumer is in docs/usdt-format.md ("Encoders and writers") and docs/rewrite.md:

    [ELF header, the program header table one entry longer (at e_phoff 64, in the first
     PT_LOAD), the original file byte for byte except the patched code bytes and the
     sections grown in place, up to the `cut` (SegmentLayout.cut: the end of the segments'
     file bytes) when the new segment lies under the input's non-loaded end]
    [the gap up to the new segment's file offset: the tables that fit there, then zeros]
    [new PT_LOAD, R+X: the sections moved out of the table's way | sections placed by the
     caller]
    [with a cut: the input from the cut on, at `cut_copy_at` (same offset modulo the page)]
    [non-allocated sections: the new note section, unwind and symbol sections, the marker]
    [the new section header table]

Why the table stays at the start: binutils' strip and objcopy always write the program
headers right after the ELF header, inside the first PT_LOAD, and lay out every segment from
its first section; a table elsewhere, or a segment that starts before its first section, makes
them "adjust" sections and write a broken program. `head_room` finds the room: the sections
between the table's end and the end of a table one entry longer (`.interp`, notes, a hash
table) move to the start of the new segment, with the segments over them (PT_INTERP, PT_NOTE,
PT_GNU_PROPERTY) and the `.dynamic` entry of a hash table (DT_HASH, DT_GNU_HASH); where that
cannot be done the table goes into the new segment as before (such a file must be stripped
before the rewrite).

The new segment's vaddr lies past every existing segment's end (`.bss` included, its first
page past it) and its file offset has the vaddr's page offset (the loader needs only that;
neither needs a page boundary). The segment keeps the (vaddr - offset) delta of the segment
that holds `.stapsdt.base` where that costs at most `zero_fill_limit` zeros (10% of the
input, or a page): perf turns a note pc into a file offset with that delta (pc +
sh_offset(.stapsdt.base) - base), and kernels before 5.18 compute AT_PHDR from the first
PT_LOAD's delta. The delta puts the segment's file offset at least as far past the end of
the segments' file bytes as the memory image runs past them (`.bss`): that room is filled
with the input's own non-loaded end kept in place up to a cut (`_delta_place`: the end of
the segments' file bytes or the start of a later non-allocated section, `cut_points`; the
rest copied after the segment, `cut_copy_at`) and with the new tables (`_Tail`), so that
only what neither fills is zeros. Its p_align (`strip_align`) makes strip, which packs
segments, put it back at the same offset. The zeros may pass the size rule's 1% for perf's
sake (python3.11: its 282 KiB `.bss` against 3 KiB of non-loaded bytes and 90 KiB of
tables leaves about 200 KiB of zeros, 3% of the file); where they would exceed
`zero_fill_limit` the size rule wins: the segment starts right after the file's content,
vaddr still past `.bss` (`keeps_delta` False; perf's offsets for moved probes are then
wrong). Room is left before the segment for the names of the symbols a rewrite adds when
`.symtab` grows in place (usdtpatch.elf.symbols.symtab_in_place). The original section
header table is left where it was (or under the grown string table); the new one at the end
of the file lists every original section (some repointed, some renamed) and the new ones; a
replaced name that several sections share (two `.note.stapsdt`) is refused, since which of
them a reader takes is not defined.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import BinaryIO, Protocol

from usdtpatch.elf.image import (
    PF_R,
    PF_X,
    PT_GNU_EH_FRAME,
    PT_INTERP,
    PT_LOAD,
    PT_NOTE,
    PT_PHDR,
    SHF_ALLOC,
    SHT_DYNSYM,
    SHT_NOBITS,
    SHT_NOTE,
    SHT_PROGBITS,
    SHT_REL,
    SHT_RELA,
    SHT_SYMTAB,
    ElfImage,
    Segment,
)
from usdtpatch.elf.model import (
    DT_GNU_HASH,
    DT_HASH,
    PT_GNU_PROPERTY,
    SHT_GNU_HASH,
    SHT_HASH,
    dynamic_entries,
)
from usdtpatch.elf.notes import SdtNote, iter_notes
from usdtpatch.elf.symbols import (
    DETOUR_PREFIX,
    SYM64_SIZE,
    SymbolTable,
    load_symbols,
    symbol_room,
    symtab_region,
)
from usdtpatch.errors import ElfFormatError, UnsupportedError
from usdtpatch.kernelfacts import PAGE

ADDRESS_LIMIT = 1 << 64
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")


def _align(v: int, a: int) -> int:
    return (v + a - 1) // a * a


@dataclass(frozen=True, slots=True)
class HeadMove:
    """Sections moved from just after the program header table into the new segment, to make
    room for one more header (`head_room`): the file range [lo, hi) of the original, at
    vaddr `vaddr` there, and the `.dynamic` entries (file offset of d_val) that hold the
    address of a moved section (DT_HASH, DT_GNU_HASH)."""

    lo: int
    hi: int
    vaddr: int
    dynamic: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """Where the new PT_LOAD goes. The first `phdr_size` bytes at `vaddr` are reserved:
    they hold the program headers, or (`in_place`) the program headers stay at the start of
    the file, one entry longer, and this room holds the sections `moved` out of their way;
    the caller's sections start at `payload_vaddr`."""

    vaddr: int
    offset: int
    phdr_size: int
    keeps_delta: bool = True  # same (vaddr - offset) as the .stapsdt.base segment (perf)
    in_place: bool = False  # program headers at e_phoff 64 in the first PT_LOAD (strip-safe)
    moved: HeadMove | None = None
    # the input is cut at this file offset (at most the new segment's): the input's bytes
    # from there on (non-allocated sections only) are copied after the segment, at
    # `cut_copy_at`, where their section headers point; None: the input is kept whole
    cut: int | None = None

    @property
    def payload_vaddr(self) -> int:
        return _align(self.vaddr + self.phdr_size, 16)

    @property
    def moved_vaddr(self) -> int:
        """Where the moved sections start in the new segment (same offset modulo 64)."""
        return self.vaddr + (self.moved.vaddr % 64 if self.moved is not None else 0)

    def offset_of(self, vaddr: int) -> int:
        return self.offset + (vaddr - self.vaddr)


def plan_segment(image: ElfImage, anchor_vaddr: int | None,
                 symbols: SymbolTable | None = None) -> SegmentLayout:
    """Choose the new segment's place. `anchor_vaddr`: an address in the segment whose delta
    the new one must share (`.stapsdt.base`); None: the first executable PT_LOAD's.
    `symbols`: the file's symbol table, when the caller has read it."""
    if not image.is64 or not image.little_endian:
        raise UnsupportedError("rewriting needs a little-endian ELF64 file")
    loads = [s for s in image.segments if s.type == PT_LOAD]
    if not loads:
        raise UnsupportedError("the file has no PT_LOAD segment")
    _refuse_ranges_past_the_end(image)
    anchor = None
    if anchor_vaddr is not None:
        anchor = next((s for s in loads if s.vaddr <= anchor_vaddr < s.vaddr + s.memsz), None)
    if anchor is None:
        anchor = next((s for s in loads if s.flags & PF_X), loads[0])
    delta = anchor.vaddr - anchor.offset
    if delta % PAGE:
        raise UnsupportedError(f"segment delta {delta:#x} is not a multiple of the page size")
    last = max(loads, key=lambda s: s.vaddr + s.memsz)
    vend = last.vaddr + last.memsz
    if _align(vend, PAGE) + PAGE > ADDRESS_LIMIT:
        raise ElfFormatError(
            f"program header {last.index}: p_vaddr {last.vaddr:#x} + p_memsz {last.memsz:#x} "
            f"ends at {vend:#x}, past the end of the 64-bit address space: no room for a new "
            f"segment after it")
    phdr_size = (len(image.segments) + 1) * _PHDR.size
    in_place, moved = head_room(image)
    if moved is not None:
        # the reserved room must hold the moved sections (never less than the headers' room,
        # so that the payload, and the detours' page offsets, do not depend on it)
        phdr_size = max(phdr_size, moved.vaddr % 64 + moved.hi - moved.lo)
    low = _align(vend, PAGE)
    loads_end = max(s.offset + s.filesz for s in loads)
    room = _symbol_room(image, symbols)
    best = None
    for limit in zero_fill_limits(len(image.data)):  # the size rule's first, perf's after
        best = best or _delta_place(image, low - delta, loads_end, room, delta, phdr_size,
                                    limit)
    if best is not None:
        offset, cut = best
        return SegmentLayout(vaddr=offset + delta, offset=offset, phdr_size=phdr_size,
                             keeps_delta=True, in_place=in_place, moved=moved, cut=cut)
    # past 10% the size rule wins: right after the content, vaddr past .bss (same page offset)
    offset = _align(len(image.data) + room, SEGMENT_ALIGN)
    return SegmentLayout(vaddr=low + offset % PAGE, offset=offset, phdr_size=phdr_size,
                         keeps_delta=False, in_place=in_place, moved=moved)


SEGMENT_ALIGN = 64  # the new segment's file offset (the moved sections keep theirs modulo 64)


def zero_fill_limits(size: int) -> tuple[int, int]:
    """The most zeros the writer puts before the new segment to keep the (vaddr - offset)
    delta perf needs, tried in turn: the size rule's 1% of the input's `size` (a file grows
    by at most its detours, its tables and 1%), then 10%, where 1% cannot keep the delta:
    perf finding every moved probe is worth more than a tenth of the file; beyond that the
    delta is given up. Each at least a page, since the first page past `.bss` alone can lie
    a page past a small file's content (tests/test_rewrite_size.py, docs/rewrite.md)."""
    return max(size // 100, PAGE), max(size // 10, PAGE)


def zero_fill_limit(size: int) -> int:
    """The most zeros the writer ever puts before the new segment (`zero_fill_limits`)."""
    return zero_fill_limits(size)[-1]


def _delta_place(image: ElfImage, floor: int, loads_end: int, room: int, delta: int,
                 phdr_size: int, limit: int) -> tuple[int, int | None] | None:
    """(file offset, cut) of the new segment with the anchor's `delta`, or None when every
    such place needs more zeros than `limit`. The offset is at least `floor` (the
    first page past the memory image, minus the delta) and past what is kept of the input:
    all of it and the symbol room (cut None), or the input up to a cut (`cut_points`), the
    rest copied after the segment. The vaddr needs no page alignment, only the page offset of
    the file offset, so the zeros are what the delta forces, not a page's rounding. Of the
    places within the limit, the ones strip gives back at the same offset (`strip_align`)
    come first, then the lowest (the smallest p_align: fewer address-space randomization
    bits lost)."""
    kept = [(len(image.data) + room, None)] + [(c, c) for c in cut_points(image, loads_end)]
    places: list[tuple[bool, int, int | None]] = []
    filler = tables_bound(image)
    for end, cut in kept:
        offset = max(floor, _align(end, SEGMENT_ALIGN))
        if offset - end - filler <= limit:
            gap = offset + phdr_size - loads_end
            align = strip_align(delta, offset + phdr_size, loads_end)
            places.append((gap >= align, offset, cut))
    if not places:
        return None
    _far, offset, cut = min(places, key=lambda p: (p[0], p[1]))
    return offset, cut


MAX_STRIP_ALIGN = 1 << 21  # the largest p_align given to the new segment (x86-64's huge page)


def tables_bound(image: ElfImage) -> int:
    """Bytes of the tables every rewrite writes after the input whatever its plan, which
    `write` puts into the room before the new segment when they fit there: the new section
    header table (one more entry per original section, and the new text's) and the
    rewritten notes."""
    sec = image.section(".note.stapsdt")
    return (len(image.sections) + 1) * _SHDR.size + (sec.size if sec is not None else 0)


def cut_points(image: ElfImage, loads_end: int) -> list[int]:
    """File offsets the input can be cut at, the rest copied after the new segment: the end of
    the segments' file bytes or the start of a non-allocated section after it, where no
    section, no segment and no allocated section's bytes lie across or past (the copy moves
    sections whole) and `.symtab`, when it can grow in place, does so wholly on one side:
    its new entries before the cut, or all of it after, its new names in the copy."""
    if len(image.data) <= loads_end:
        return []
    present = [sec for sec in image.sections if sec.type != SHT_NOBITS and sec.size]
    points = sorted({loads_end} | {sec.offset for sec in present
                                   if sec.offset > loads_end and not sec.flags & SHF_ALLOC})
    if any(sg.filesz and sg.offset + sg.filesz > loads_end for sg in image.segments) or \
            any(sec.flags & SHF_ALLOC and sec.offset + sec.size > loads_end for sec in present):
        return []

    region = symtab_region(image)
    out = []
    for c in points:
        if c >= len(image.data) or any(sec.offset < c < sec.offset + sec.size
                                       for sec in present):
            continue
        if region is not None:
            sym, strs, floor, _moved = region
            if floor < c < sym.offset + SYM64_SIZE or c > strs.offset:
                continue
        out.append(c)
    return out


def cut_copy_at(layout: SegmentLayout, alloc: Sequence[AllocSection]) -> int:
    """Where `write` puts the copy of the input from `layout.cut` on: the first file offset
    after the new segment congruent with the cut modulo the page size (every section in it
    keeps its alignment)."""
    assert layout.cut is not None
    end = max([layout.vaddr + layout.phdr_size] + [a.vaddr + len(a.data) for a in alloc])
    return _align(layout.offset_of(end), PAGE) + layout.cut % PAGE


def strip_align(delta: int, seg_offset: int, loads_end: int) -> int:
    """p_align for the new segment so that binutils' strip and objcopy, which lay every
    PT_LOAD out again from the end of the previous one (the first file offset past `loads_end`
    congruent with p_vaddr modulo p_align), put it back at `seg_offset`, its (vaddr - offset)
    `delta` kept: perf turns a note pc into a file offset with the delta of the segment that
    holds `.stapsdt.base`. The smallest power of two above the gap that divides `delta` (the
    loader needs p_vaddr = p_offset modulo p_align), or PAGE when there is none up to
    MAX_STRIP_ALIGN (a larger alignment costs the process address-space randomization)."""
    align = PAGE
    while align <= seg_offset - loads_end:
        align *= 2
    if align > MAX_STRIP_ALIGN or delta % align:
        return PAGE
    return align


MOVABLE_SEGMENTS = (PT_INTERP, PT_NOTE, PT_GNU_PROPERTY)


def head_room(image: ElfImage) -> tuple[bool, HeadMove | None]:
    """Whether the program header table can stay at the start of the file with one more
    entry (binutils' strip and objcopy put it right after the ELF header in the first
    PT_LOAD whatever the input did, and lay every segment out from there: a table elsewhere
    makes them "adjust" sections and break the file), and which sections must move out of
    its way: the ones between the table's end and the end of the grown table, when each is
    `.interp`, a note, or a hash table (its `.dynamic` entry repointed), and every segment
    over them other than the first PT_LOAD lies inside them. (False, None): it cannot."""
    n = len(image.segments)
    if image.phoff != 64 or not image.is64 or not image.little_endian:
        return False, None
    loads = [sg for sg in image.segments if sg.type == PT_LOAD]
    first = min(loads, key=lambda sg: sg.offset, default=None)
    end = 64 + (n + 1) * _PHDR.size
    if first is None or first.offset != 0 or first.filesz < end:
        return False, None
    present = [sec for sec in image.sections if sec.size and sec.type != SHT_NOBITS]
    lo, hi = 64 + n * _PHDR.size, end
    block = [sec for sec in present if sec.offset + sec.size > lo and sec.offset < hi]
    if not block:
        return True, None
    lo = min(sec.offset for sec in block)
    while True:  # a segment over a moved section moves whole, with every section under it
        hi = max([hi] + [sec.offset + sec.size for sec in block] +
                 [sg.offset + sg.filesz for sg in image.segments if sg is not first
                  and sg.filesz and sg.offset < hi and sg.offset + sg.filesz > lo])
        more = [sec for sec in present if sec not in block and sec.offset < hi
                and sec.offset + sec.size > lo]
        if not more:
            break
        block += more
    if lo < 64 + n * _PHDR.size or hi > first.filesz or \
            any(not sec.flags & SHF_ALLOC or sec.addr - sec.offset != first.vaddr - first.offset
                for sec in block):
        return False, None
    dynamic: list[int] = []
    for sec in block:
        if sec.type in (SHT_HASH, SHT_GNU_HASH):
            at = _dynamic_entry(image, DT_HASH if sec.type == SHT_HASH else DT_GNU_HASH,
                                sec.addr)
            if at is None:
                return False, None
            dynamic.append(at)
        elif sec.type != SHT_NOTE and sec.name != ".interp":
            return False, None
    for sg in image.segments:
        if sg is first or not sg.filesz or sg.offset >= hi or sg.offset + sg.filesz <= lo:
            continue
        if sg.type not in MOVABLE_SEGMENTS or sg.offset < lo or sg.offset + sg.filesz > hi:
            return False, None
    return True, HeadMove(lo, hi, first.vaddr + lo - first.offset, tuple(dynamic))


def _dynamic_entry(image: ElfImage, tag: int, value: int) -> int | None:
    """File offset of the d_val of the one `.dynamic` entry (tag, value), or None (none, or
    the tag twice, or another value)."""
    found = [(v, off) for t, v, off in dynamic_entries(image) if t == tag]
    if len(found) != 1 or found[0][0] != value:
        return None
    return found[0][1] + 8


def in_place_regions(image: ElfImage, layout: SegmentLayout) -> tuple[tuple[int, int], ...]:
    """The (file offset, size) ranges of the input that `write` overwrites besides the
    caller's patches and grown sections (a restore marker must keep their original bytes)."""
    out: list[tuple[int, int]] = []
    if layout.in_place:
        out.append((64, (len(image.segments) + 1) * _PHDR.size))
    if layout.moved is not None:
        out += [(at, 8) for at in layout.moved.dynamic]
    return tuple(out)


def _refuse_ranges_past_the_end(image: ElfImage) -> None:
    """A section or segment whose file range runs past the end of the input would, in the
    output, cover the bytes appended after it: refuse such a file instead."""
    size = len(image.data)
    for sec in image.sections:
        if sec.type != SHT_NOBITS and sec.size and sec.offset + sec.size > size:
            raise ElfFormatError(
                f"section {sec.index} ({sec.name or 'no name'}) at file offset {sec.offset:#x} "
                f"size {sec.size:#x} runs past the end of the file ({size:#x}): rewriting would "
                f"make it cover the new data")
    for seg in image.segments:
        if seg.filesz and seg.offset + seg.filesz > size:
            raise ElfFormatError(
                f"program header {seg.index} at file offset {seg.offset:#x} p_filesz "
                f"{seg.filesz:#x} runs past the end of the file ({size:#x}): rewriting would make "
                f"it cover the new data")


def _symbol_room(image: ElfImage, symbols: SymbolTable | None = None) -> int:
    """Bytes to leave after the input's content for the names of the symbols a rewrite adds
    (at most one per probe) when `.symtab` can grow in place (usdtpatch.elf.symbols).
    `symbols`: the file's table when the caller has it (else it is read here).

    The notes are walked one at a time (iter_notes), none kept: a file's 100,000 notes held
    at once were ~40 MiB of the rewrite's peak (issue 38)."""

    sec = image.section(".note.stapsdt")
    if sec is None or not image.is64 or not image.little_endian:
        return 0
    count = named = 0
    pcs: list[int] = []
    try:
        for n in iter_notes(image.section_data(sec), 8, "<"):
            if isinstance(n, SdtNote):
                count += 1
                named += (len(DETOUR_PREFIX) + len(n.provider.encode("utf-8", "surrogateescape"))
                          + len(n.name.encode("utf-8", "surrogateescape")) + 3)
                pcs.append(n.pc)
    except (ValueError, UnsupportedError, ElfFormatError):
        return 0
    digits = len(str(count))
    return symbol_room(image, max(named + count * digits,
                                  _split_part_names_bound(image, pcs, digits, symbols)))


def _split_part_names_bound(image: ElfImage, pcs: Sequence[int], digits: int,
                            symbols: SymbolTable | None) -> int:
    """An upper bound of the string bytes of detour symbols named after their function
    (`f.usdtpatch.N`, usdtpatch.rewriter.build.detour_symbols), one per note's pc."""

    if symbols is None:
        try:
            symbols = load_symbols(image)
        except (ValueError, UnsupportedError, ElfFormatError):
            return 0
    total = 0
    for pc in pcs:
        found = symbols.lookup(pc)
        name = found[0].name if found is not None else ""
        total += len(name.encode("utf-8", "surrogateescape")) + len(".usdtpatch.") + digits + 1
    return total


@dataclass(frozen=True, slots=True)
class AllocSection:
    """A section inside the new segment, at a vaddr from SegmentLayout."""

    name: str
    type: int
    flags: int
    vaddr: int
    data: bytes
    align: int = 16
    # an original section of this name this one takes over (its header, index and links
    # kept, pointed here, allocated: `.dynsym` with entries added, usdtpatch.elf.dynsym; an
    # input's `.debug_frame` with the detours' FDEs); the original's bytes keep a header of
    # their own named `old_name` (SHT_PROGBITS), or none when a grown section covers them
    replaces: bool = False
    old_name: str | None = None


class Deferred(Protocol):
    """A section's bytes made as they are written into the output, never held whole (the
    restore marker, usdtpatch.elf.marker.MarkerNote): `len` of them, by `write_to`."""

    def __len__(self) -> int: ...

    def write_to(self, out: BinaryIO) -> None: ...


@dataclass(frozen=True, slots=True)
class TailSection:
    """A non-allocated section appended after the segment. `link_name` names the section its
    sh_link points at (new or original)."""

    name: str
    type: int
    data: bytes | Deferred
    align: int = 8
    entsize: int = 0
    link_name: str | None = None
    info: int = 0
    # (header offset, header size, where `data` is written): a section grown in place over
    # bytes the rewrite no longer needs and the room before the new segment (a symbol table
    # with added entries); None: `data` appended after the segment
    place: tuple[int, int, int] | None = None
    # the flags of an original section this one replaces, where they change (a compressed
    # debug section written again uncompressed); None: the original's
    flags: int | None = None


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Everything a rewrite changes, as data."""

    layout: SegmentLayout
    patches: tuple[tuple[int, bytes], ...]  # (file offset, new bytes) inside the original file
    alloc: tuple[AllocSection, ...]
    tail: tuple[TailSection, ...]  # a tail section named like an original replaces it
    renames: dict[str, str] = field(default_factory=dict)  # original section -> new name
    eh_frame_hdr: int | None = None  # vaddr of the new .eh_frame_hdr (PT_GNU_EH_FRAME)
    # original allocated sections grown in place (the bytes written by a patch): name, size
    grown: tuple[tuple[str, int], ...] = ()
    # (file offset in the input, new bytes) inside the sections moved into the new segment
    # (SegmentLayout.moved), written where they land there: a moved build-id note's new id
    moved_patches: tuple[tuple[int, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class ProgramHeader:
    """One Elf64_Phdr of the output, by field (gABI names without the p_ prefix)."""

    type: int
    flags: int
    offset: int
    vaddr: int
    paddr: int
    filesz: int
    memsz: int
    align: int

    @classmethod
    def of(cls, sg: Segment) -> ProgramHeader:
        return cls(sg.type, sg.flags, sg.offset, sg.vaddr, sg.paddr, sg.filesz, sg.memsz,
                   sg.align)

    def pack(self) -> bytes:
        return _PHDR.pack(self.type, self.flags, self.offset, self.vaddr, self.paddr,
                          self.filesz, self.memsz, self.align)

    def check(self, index: int) -> None:
        """Refuse a field a hostile header moved past 64 bits."""
        for name in ("offset", "vaddr", "paddr", "filesz", "memsz", "align"):
            value = getattr(self, name)
            if not 0 <= value < ADDRESS_LIMIT:
                raise ElfFormatError(f"program header {index}: p_{name} would be {value:#x} in "
                                     f"the rewritten file, past 64 bits")


Piece = tuple[int, bytes | memoryview | Deferred]  # (file offset, what is written there)


@dataclass(slots=True)
class _Segment:
    """The new PT_LOAD from the layout's vaddr on, as pieces (offset from the layout's
    file offset, bytes; zeros between them) up to `size`: where its first section starts
    (`start`, from the layout's vaddr), and how far the moved sections went (`shift`)."""

    pieces: list[Piece]
    size: int
    start: int
    shift: int


def _new_segment(image: ElfImage, rw: Rewrite) -> _Segment:
    """[room for the program headers or the moved sections] [the caller's sections]."""
    lay = rw.layout
    pieces: list[Piece] = []
    size = lay.phdr_size
    mv = lay.moved
    shift = 0  # how far the moved sections go (vaddr and file offset alike)
    if mv is not None:
        shift = lay.moved_vaddr - mv.vaddr
        at = lay.moved_vaddr - lay.vaddr
        pieces.append((at, memoryview(image.data)[mv.lo : mv.hi]))
        size = max(size, at + mv.hi - mv.lo)
        for off, data in rw.moved_patches:
            if not mv.lo <= off <= off + len(data) <= mv.hi:
                raise UnsupportedError(f"patch at file offset {off:#x} is outside the sections "
                                       f"moved into the new segment")
            pieces.append((at + off - mv.lo, data))
    elif rw.moved_patches:
        raise UnsupportedError("patches of moved sections, but no section moves")
    for piece in rw.alloc:
        start = piece.vaddr - lay.vaddr
        if start < size:
            raise UnsupportedError(f"section {piece.name} at {piece.vaddr:#x} overlaps another")
        pieces.append((start, piece.data))
        size = start + len(piece.data)
    # the PT_LOAD starts at its first section (strip lays a segment out from its first
    # section; the file offset stays congruent with the vaddr modulo the page size)
    first = 0
    if lay.in_place:
        first = (lay.moved_vaddr - lay.vaddr) if mv is not None else \
            min((a.vaddr - lay.vaddr for a in rw.alloc), default=0)
    return _Segment(pieces, size, first, shift)


def _program_headers(image: ElfImage, rw: Rewrite, seg: _Segment) -> list[ProgramHeader]:
    """The original headers, repointed where the rewrite moved what they cover, and the new
    PT_LOAD after the last PT_LOAD (PT_LOADs stay sorted by vaddr)."""
    lay, mv = rw.layout, rw.layout.moved
    first = min((sg for sg in image.segments if sg.type == PT_LOAD), key=lambda sg: sg.offset)
    out = []
    for sg in image.segments:
        p = ProgramHeader.of(sg)
        if sg.type == PT_PHDR and lay.in_place:
            size = (len(image.segments) + 1) * _PHDR.size
            p = replace(p, offset=64, vaddr=first.vaddr + 64 - first.offset,
                        paddr=first.paddr + 64 - first.offset, filesz=size, memsz=size)
        elif sg.type == PT_PHDR:
            p = replace(p, offset=lay.offset, vaddr=lay.vaddr, paddr=lay.vaddr,
                        filesz=lay.phdr_size, memsz=lay.phdr_size, align=8)
        elif sg.type == PT_GNU_EH_FRAME and rw.eh_frame_hdr is not None:
            hdr = next(a for a in rw.alloc if a.vaddr == rw.eh_frame_hdr)
            p = replace(p, offset=lay.offset_of(hdr.vaddr), vaddr=hdr.vaddr, paddr=hdr.vaddr,
                        filesz=len(hdr.data), memsz=len(hdr.data))
        elif sg.type != PT_LOAD and sg.filesz and mv is not None and \
                mv.lo <= sg.offset < mv.hi:
            p = replace(p, offset=lay.offset_of(sg.vaddr + seg.shift),
                        vaddr=sg.vaddr + seg.shift, paddr=sg.paddr + seg.shift)
        out.append(p)
    align = PAGE
    if lay.keeps_delta:
        align = strip_align(lay.vaddr - lay.offset, lay.offset + seg.start,
                            max(sg.offset + sg.filesz for sg in image.segments
                                if sg.type == PT_LOAD))
    size = seg.size - seg.start
    last_load = max(i for i, sg in enumerate(image.segments) if sg.type == PT_LOAD)
    out.insert(last_load + 1, ProgramHeader(type=PT_LOAD, flags=PF_R | PF_X,
                                            offset=lay.offset + seg.start,
                                            vaddr=lay.vaddr + seg.start,
                                            paddr=lay.vaddr + seg.start, filesz=size, memsz=size,
                                            align=align))
    for i, p in enumerate(out):
        p.check(i)
    return out


def _edits(image: ElfImage, rw: Rewrite, table: bytes, seg: _Segment
           ) -> tuple[list[Piece], list[Piece]]:
    """(file offset, bytes) written over the input before the cut, and (offset in the copy,
    bytes) past it: the program header table (or its room in the new segment), the moved
    hash tables' `.dynamic` entries, the patches, and the sections grown in place."""
    lay = rw.layout
    edits: list[Piece] = []
    if lay.in_place:
        edits.append((64, table))
        for at in lay.moved.dynamic if lay.moved is not None else ():
            (old,) = struct.unpack_from("<Q", image.data, at)
            edits.append((at, struct.pack("<Q", old + seg.shift)))
    else:
        if len(table) != lay.phdr_size:
            raise UnsupportedError(f"{len(table)} bytes of program headers for a room of "
                                   f"{lay.phdr_size}")
        seg.pieces.insert(0, (0, table))
    for off, data in rw.patches:
        if off < 64 or off + len(data) > len(image.data):
            raise UnsupportedError(f"patch at file offset {off:#x} is outside the file's code")
    edits += rw.patches  # the caller's pairs themselves (a new pair per patch: 56 bytes each)
    in_copy: list[Piece] = []
    for t in rw.tail:
        if t.place is None:
            continue
        at = t.place[2]
        if lay.cut is not None and at >= lay.cut:
            in_copy.append((at - lay.cut, t.data))
            continue
        if at < 64 or at + len(t.data) > (lay.offset if lay.cut is None else lay.cut):
            raise UnsupportedError(f"section {t.name} grown in place at file offset "
                                   f"{at:#x} would overlap the header or the new segment")
        edits.append((at, t.data))
    return edits, in_copy


def _head(image: ElfImage, lay: SegmentLayout, edits: list[Piece]) -> int:
    """Where the input from byte 64 to the cut (or its end) with the edits ends: the room up
    to the new segment is the gap (`_Tail`). Refuses edits that overlap or lie past the
    cut."""
    pos = 64
    for off, data in sorted(edits, key=lambda e: e[0]):
        if off < pos:
            raise UnsupportedError(f"two edits overlap at file offset {off:#x}")
        pos = off + len(data)
    if lay.cut is None:  # names of a grown table may run past the input's end
        return max(pos, len(image.data))
    end = min(lay.cut, len(image.data))
    if pos > end:
        raise UnsupportedError(f"an edit at file offset {pos:#x} lies past the cut at "
                               f"{end:#x}")
    return end


@dataclass(slots=True)
class _Tail:
    """The file from the end of the kept input (`gap_at`) on, as it is laid out: the gap up
    to the new segment's offset (`base`), where the tables go first when they fit (the zeros
    a kept delta forces, plan_segment), up to `gap_end`, then the file from `base` on, up to
    `end`. What goes where is in `pieces` (file offset, bytes), zeros between them."""

    base: int
    cut: int | None
    copy_at: int | None
    gap_at: int
    end: int
    gap_end: int = 0
    pieces: list[Piece] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gap_end = self.gap_at

    def copied(self, offset: int) -> int:
        """The output's file offset of the input's `offset` (moved when past the cut)."""
        if self.copy_at is None or self.cut is None or offset < self.cut:
            return offset
        return self.copy_at + offset - self.cut

    def put(self, at: int, data: bytes | memoryview | Deferred) -> None:
        """`data` at file offset `at` from `base` on (the file grows to hold it)."""
        self.pieces.append((at, data))
        self.end = max(self.end, at + len(data))

    def append(self, data: bytes | Deferred, align: int) -> int:
        """`data` at the next offset aligned to `align`, in the gap when it fits there; its
        file offset."""
        at = _align(self.gap_end, align)
        if at + len(data) <= self.base:
            self.gap_end = at + len(data)
            self.pieces.append((at, data))
            return at
        at = self.base + _align(self.end - self.base, align)
        self.put(at, data)
        return at


def _segment_and_copy(image: ElfImage, rw: Rewrite, seg: _Segment,
                      in_copy: list[Piece], gap_at: int) -> _Tail:
    """The new segment, then (with a cut) the input from the cut on with the edits that fall
    there: no second copy of a large end (a symbol table)."""
    lay = rw.layout
    tail = _Tail(base=lay.offset, cut=lay.cut, copy_at=None, gap_at=gap_at,
                 end=lay.offset + seg.size)
    for at, data in seg.pieces:
        tail.put(lay.offset + at, data)
    if lay.cut is None:
        return tail
    tail.copy_at = start = cut_copy_at(lay, rw.alloc)
    if start < tail.end:
        raise UnsupportedError(f"the copy of the input at file offset {start:#x} would overlap "
                               f"the new segment")
    tail.put(start, memoryview(image.data)[lay.cut :])
    for rel, data in in_copy:
        tail.put(start + rel, data)
    return tail


def _place_tail(image: ElfImage, rw: Rewrite, tail: _Tail) -> list[tuple[TailSection, int]]:
    """Each tail section with its file offset: grown in place, or appended."""
    for t in rw.tail:
        same = [s.index for s in image.sections if s.name == t.name]
        if len(same) > 1:
            raise UnsupportedError(
                f"{len(same)} sections are named {t.name} (sections "
                f"{', '.join(map(str, same))}): the rewrite would not know which one to "
                f"replace")
    placed: list[tuple[TailSection, int]] = []
    for t in rw.tail:
        if t.place is not None:
            placed.append((t, tail.copied(t.place[0])))
        else:
            placed.append((t, tail.append(t.data, t.align)))
    return placed


def added_sections_index(image: ElfImage) -> int:
    """The section index of the first section a rewrite adds to the new segment
    (`.usdtpatch.text`): right after the input's last allocated section, the non-allocated
    ones after them, so that strip, which drops non-allocated sections (`.symtab`, `.debug_*`)
    and renumbers the ones after them but leaves the st_shndx of `.dynsym` as it is, keeps
    every allocated section's index (a `.dynsym` entry in the new segment names its section
    after strip too, usdtpatch.elf.dynsym). At the end of the table where a symbol names a
    section past the last allocated one (its index would change)."""
    got = image.derived.get("added_sections_index")
    if isinstance(got, int):
        return got
    last = max((s.index for s in image.sections if s.flags & SHF_ALLOC), default=0)
    got = len(image.sections) if symbols_past(image, last) else last + 1
    image.derived["added_sections_index"] = got
    return got


def symbols_past(image: ElfImage, index: int) -> bool:
    """Whether a symbol of `.symtab` or `.dynsym` names a section past `index`."""
    for sec in image.sections:
        if sec.type not in (SHT_SYMTAB, SHT_DYNSYM) or sec.entsize != SYM64_SIZE:
            continue
        data = image.section_data(sec)
        for at in range(6, len(data) - SYM64_SIZE + 7, SYM64_SIZE):
            (ndx,) = struct.unpack_from("<H", data, at)
            if index < ndx < SHN_LORESERVE:
                return True
    return False


SHN_LORESERVE = 0xFF00
SHF_INFO_LINK = 0x40


@dataclass(frozen=True, slots=True)
class _Header:
    """One section header of the output, before its name is an offset."""

    name: str
    fields: tuple[int, ...]  # sh_type .. sh_entsize, as _SHDR packs them after sh_name


def _section_headers(image: ElfImage, rw: Rewrite, tail: _Tail,
                     placed: list[tuple[TailSection, int]]) -> tuple[bytes, int, int]:
    """The new .shstrtab and section header table appended to `tail`: the originals
    (renamed, repointed), the new segment's sections right after the last allocated
    original (`added_sections_index`; the later originals' indices and the links to them
    moved up), then the new non-allocated sections. Returns (the table, its file offset,
    the index of `.shstrtab`)."""
    lay, mv = rw.layout, rw.layout.moved
    originals = {s.name for s in image.sections}
    new_tail = [(t, off) for t, off in placed if t.name not in originals]
    replaced = {t.name: (t, off, t.place[1] if t.place is not None else len(t.data))
                for t, off in placed if t.name in originals}
    takes = {a.name: a for a in rw.alloc if a.replaces}
    grown = dict(rw.grown)
    shstrndx = _shstrndx(image)
    at = added_sections_index(image)
    added: list[_Header] = []
    for a in rw.alloc:
        if not a.replaces:
            added.append(_Header(a.name, (a.type, a.flags | SHF_ALLOC, a.vaddr,
                                          lay.offset_of(a.vaddr), len(a.data), 0, 0, a.align,
                                          0)))
    # A section the new segment replaces keeps its original bytes, where they were, under
    # its old name: its name and index now belong to the new copy.
    olds = [(a, sec) for a in rw.alloc if a.replaces and a.old_name is not None
            and (sec := image.section(a.name)) is not None]
    for a, sec in sorted(olds, key=lambda p: not p[1].flags & SHF_ALLOC):  # loaded first
        assert a.old_name is not None
        added.append(_Header(a.old_name, (SHT_PROGBITS, sec.flags, sec.addr,
                                          tail.copied(sec.offset), sec.size, 0, 0,
                                          sec.addralign, sec.entsize)))

    def index(i: int) -> int:  # an original's index in the output (one that names no
        # section of the input, a damaged sh_link, stays as it is: it names none in the output)
        return i + len(added) if at <= i < len(image.sections) and i else i

    headers: list[_Header] = []
    for sec in image.sections:
        n = rw.renames.get(sec.name, sec.name)
        off, size, info, addr, flags = sec.offset, sec.size, sec.info, sec.addr, sec.flags
        align, link = sec.addralign, index(sec.link)
        if sec.type in (SHT_REL, SHT_RELA) or sec.flags & SHF_INFO_LINK:
            info = index(info)
        if sec.name in replaced:
            t, off, size = replaced[sec.name]
            info = t.info if t.info else info
            if t.flags is not None:
                flags, align = t.flags, t.align
        elif sec.name in takes:  # a non-allocated one (.debug_frame) becomes allocated
            a = takes[sec.name]
            addr, off, size = a.vaddr, lay.offset_of(a.vaddr), len(a.data)
            flags |= SHF_ALLOC
        elif sec.type != SHT_NOBITS and sec.size:
            off = tail.copied(sec.offset)
        size = grown.get(sec.name, size)
        if sec.index == shstrndx:
            off = -1  # written below, once the names are known
        # a section moved out of the grown program header table's way lives in the new
        # segment now: its header follows it there
        if sec.size and sec.type != SHT_NOBITS and mv is not None and \
                mv.lo <= sec.offset < mv.hi:
            addr = sec.addr + lay.moved_vaddr - mv.vaddr
            off = lay.offset_of(addr)
        headers.append(_Header(n, (sec.type, flags, addr, off, size, link, info, align,
                                   sec.entsize)))
    headers[at:at] = added
    for t, off in new_tail:
        size = t.place[1] if t.place is not None else len(t.data)
        headers.append(_Header(t.name, (t.type, 0, 0, off, size, 0, t.info, t.align,
                                        t.entsize)))
    # the new non-allocated sections name their sh_link by section name: the indices are
    # known only now that every header has its place
    index_of: dict[str, int] = {}
    for i, h in enumerate(headers):
        index_of.setdefault(h.name, i)
    for t, _off in new_tail:
        if t.link_name:
            i = len(headers) - len(new_tail) + new_tail.index((t, _off))
            f = list(headers[i].fields)
            f[5] = index_of.get(t.link_name, 0)
            headers[i] = _Header(t.name, tuple(f))
    shstr = bytearray(b"\0")
    name_off: dict[str, int] = {}
    for h in headers:
        if h.name not in name_off:
            name_off[h.name] = len(shstr) if h.name else 0
            if h.name:
                shstr += h.name.encode() + b"\0"
    shstr_off = tail.append(bytes(shstr), 8)
    out = []
    for h in headers:
        f = list(h.fields)
        if f[3] == -1:
            f[3], f[4] = shstr_off, len(shstr)
        out.append(_SHDR.pack(name_off[h.name], *f))
    table = b"".join(out)
    return table, tail.append(table, 8), index(shstrndx)


def _elf_header(image: ElfImage, lay: SegmentLayout, phnum: int, shnum: int,
                shoff: int, shstrndx: int) -> bytes:
    """The input's ELF header with the tables moved and the counts grown."""
    if phnum >= 0xFFFF or shnum >= 0xFF00:
        raise UnsupportedError("too many program or section headers for the ELF header")
    ehdr = bytearray(image.data[:64])
    struct.pack_into("<Q", ehdr, 0x20, 64 if lay.in_place else lay.offset)  # e_phoff
    struct.pack_into("<Q", ehdr, 0x28, shoff)  # e_shoff
    struct.pack_into("<H", ehdr, 0x38, phnum)
    struct.pack_into("<H", ehdr, 0x3C, shnum)
    struct.pack_into("<H", ehdr, 0x3E, shstrndx)
    return bytes(ehdr)


def write(image: ElfImage, rw: Rewrite) -> bytes:
    """The bytes of the rewritten file."""
    lay = rw.layout
    if lay.offset < (len(image.data) if lay.cut is None else lay.cut) or \
            lay.offset % PAGE != lay.vaddr % PAGE:
        raise UnsupportedError(f"new segment at file offset {lay.offset:#x}, vaddr "
                               f"{lay.vaddr:#x}: not after the file's content or not congruent "
                               f"modulo the page size")
    seg = _new_segment(image, rw)
    phdrs = _program_headers(image, rw, seg)
    edits, in_copy = _edits(image, rw, b"".join(p.pack() for p in phdrs), seg)
    gap_at = _head(image, lay, edits)
    tail = _segment_and_copy(image, rw, seg, in_copy, gap_at)
    placed = _place_tail(image, rw, tail)
    table, shoff, shstrndx = _section_headers(image, rw, tail, placed)
    ehdr = _elf_header(image, lay, len(phdrs), len(table) // _SHDR.size, shoff, shstrndx)
    kept = len(image.data) if lay.cut is None else min(lay.cut, len(image.data))
    return _assemble(tail.end, [(0, ehdr), (64, memoryview(image.data)[64:kept]), *edits,
                                *tail.pieces])


def _assemble(size: int, pieces: list[Piece]) -> bytes:
    """The file of `size` bytes with each piece written at its offset, in order (a later
    one over an earlier), zeros elsewhere: into one buffer allocated once, whose bytes
    io.BytesIO's getvalue hands over without a copy (the pieces joined took a second copy
    of the output, the rewrite's peak, issue 38)."""
    out = io.BytesIO()
    out.seek(size - 1)
    out.write(b"\0")  # the whole file, zeros (BytesIO fills what a write skips)
    for at, data in pieces:
        if at + len(data) > size:
            raise AssertionError(f"a piece at {at:#x} runs past the file's end {size:#x}")
        out.seek(at)
        if isinstance(data, bytes | bytearray | memoryview):
            out.write(data)
        else:
            data.write_to(out)
    return out.getvalue()


def _shstrndx(image: ElfImage) -> int:
    (ndx,) = struct.unpack_from("<H", image.data, 0x3E)
    if ndx == 0xFFFF or struct.unpack_from("<H", image.data, 0x3C)[0] == 0:
        raise UnsupportedError("extended section numbering is not supported by the writer")
    return int(ndx)

