"""Names for the detours in a stripped file: entries appended to `.dynsym` (issue 33).

A stripped file keeps `.dynsym` only, and gdb (BFD's dynamic symbols, by section), elfutils
(eu-stack: the SHT_DYNSYM section when there is no `.symtab`) and perf (the section named
`.dynsym`) name a frame of an exported function from it. A detour lies in the new segment,
past every symbol: its frame was `??` where the original's was named. So each detour of a
function `.dynsym` names gets an entry there too, named as its `.symtab` symbol
(`<function>.usdtpatch.<n>`: a name of its own, so that `break f` in gdb and `perf probe f`
still find one place), STT_FUNC, STB_GLOBAL (ld, linking against the file, reads every entry
past sh_info as a global one and complains of a local one there), version 1 (the base one),
its st_shndx the section index `.usdtpatch.text` keeps through strip
(usdtpatch.elf.writer.added_sections_index: binutils' strip does not renumber `.dynsym`).

The loader is not changed in what it finds: the entries are appended after every original
one, so every index a relocation, `.gnu.hash` or `.gnu.version_r` uses stays; none is in a
hash chain, so `dlsym` does not find them, and `dlsym` of every original name gives what it
gave. `.dynsym` and `.gnu.version` (one entry per symbol: BFD refuses a count that differs)
are copied into the new segment with the entries appended and take over the originals'
section headers (the original bytes keep one named `.dynsym.orig`); DT_SYMTAB and DT_VERSYM
point at the copies. The names grow `.dynstr` in place, over the old `.gnu.version` that
follows it in what GNU ld writes, when they fit there (DT_STRSZ grows); else `.dynstr` is
copied too (DT_STRTAB, DT_STRSZ; ldconfig since glibc 2.31 finds DT_STRTAB in the segment
that holds it). A file with a DT_HASH table (whose nchain counts the symbols) gets no
entries.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from usdtpatch.elf.image import (
    PT_LOAD,
    SHF_ALLOC,
    SHT_DYNSYM,
    SHT_NOBITS,
    ElfImage,
    Section,
)
from usdtpatch.elf.model import (
    DT_GNU_HASH,
    DT_HASH,
    DT_STRSZ,
    DT_STRTAB,
    DT_SYMTAB,
    DT_VERSYM,
    dynamic_entries,
)
from usdtpatch.elf.symbols import STT_FUNC, STT_GNU_IFUNC, SYM64_SIZE
from usdtpatch.elf.writer import AllocSection, added_sections_index

SHT_GNU_VERSYM = 0x6FFFFFFF
STB_GLOBAL = 1
VER_NDX_GLOBAL = 1
_SYM = struct.Struct("<IBBHQQ")


@dataclass(frozen=True, slots=True)
class _Tables:
    dynsym: Section
    dynstr: Section
    versym: Section | None
    dynamic: dict[int, int]  # tag -> file offset of its d_val


def _dynamic(image: ElfImage) -> dict[int, list[int]]:
    """Each `.dynamic` tag -> the file offsets of its entries' d_val."""
    out: dict[int, list[int]] = {}
    for tag, _value, at in dynamic_entries(image):
        out.setdefault(tag, []).append(at + 8)
    return out


def _tables(image: ElfImage) -> _Tables | str:
    """The tables entries are appended to, or why there are none."""
    if not image.is64 or not image.little_endian:
        return "not a little-endian ELF64 file"
    dynsym = next((s for s in image.sections if s.type == SHT_DYNSYM), None)
    if dynsym is None or dynsym.entsize != SYM64_SIZE or not dynsym.flags & SHF_ALLOC or \
            not 0 < dynsym.link < len(image.sections):
        return "no .dynsym"
    dynstr = image.sections[dynsym.link]
    versyms = [s for s in image.sections if s.type == SHT_GNU_VERSYM]
    versym = versyms[0] if versyms else None
    if len(versyms) > 1 or (versym is not None and (
            versym.link != dynsym.index or versym.size != dynsym.size // SYM64_SIZE * 2)):
        return "a .gnu.version that does not match .dynsym"
    if added_sections_index(image) == len(image.sections):
        return "a symbol names a section past the last allocated one"
    tags = _dynamic(image)
    if tags.get(DT_HASH):
        return "a DT_HASH table (its nchain counts the symbols)"
    want = {DT_SYMTAB: dynsym.addr, DT_STRTAB: dynstr.addr, DT_STRSZ: dynstr.size}
    if versym is not None:
        want[DT_VERSYM] = versym.addr
    dynamic = {}
    for tag, value in want.items():
        places = tags.get(tag, [])
        if len(places) != 1 or struct.unpack_from("<Q", image.data, places[0])[0] != value:
            return f".dynamic's tag {tag:#x} is not one entry that names its section"
        dynamic[tag] = places[0]
    if not tags.get(DT_GNU_HASH):
        return "no DT_GNU_HASH"
    return _Tables(dynsym, dynstr, versym, dynamic)


def dynsym_left_out(image: ElfImage) -> str | None:
    """Why the detours get no `.dynsym` entries in this file (None: they can)."""
    got = _tables(image)
    return got if isinstance(got, str) else None


def exported_functions(image: ElfImage, addresses: list[int]) -> list[str | None]:
    """For each address, the name of the defined function `.dynsym` has there (st_value <=
    address < st_value + st_size): what a debugger names a frame there by in the stripped
    file (a global one before a weak one, the first of equals); None where there is none,
    and for every address of a file whose `.dynsym` gets no entries (`dynsym_left_out`)."""
    got = _tables(image)
    if isinstance(got, str):
        return [None] * len(addresses)
    data = image.section_data(got.dynsym)
    strs = image.section_data(got.dynstr)
    funcs: list[tuple[int, int, int, str]] = []
    for at in range(SYM64_SIZE, len(data) - SYM64_SIZE + 1, SYM64_SIZE):
        name, info, _other, shndx, value, size = _SYM.unpack_from(data, at)
        if info & 0xF not in (STT_FUNC, STT_GNU_IFUNC) or not shndx or not size:
            continue
        end = strs.find(b"\0", name)
        text = strs[name : end if end >= 0 else len(strs)].decode("utf-8", "surrogateescape")
        funcs.append((value, value + size, 0 if info >> 4 == STB_GLOBAL else 1, text))
    out: list[str | None] = []
    for address in addresses:
        best = min(((rank, i) for i, (lo, hi, rank, _t) in enumerate(funcs)
                    if lo <= address < hi), default=None)
        out.append(None if best is None else funcs[best[1]][3])
    return out


@dataclass(frozen=True, slots=True)
class DynsymGrowth:
    """What `.dynsym` entries add to a rewrite: the sections of the new segment (copies that
    take the originals' headers over), the in-place edits (`.dynamic`'s entries, the names
    written over the old `.gnu.version`) and the original sections grown in place."""

    alloc: tuple[AllocSection, ...]
    patches: tuple[tuple[int, bytes], ...]
    grown: tuple[tuple[str, int], ...]


def _room_after(image: ElfImage, sec: Section, free: Section | None) -> int:
    """How far `sec` can grow in place: over `free` (a section moved away) when it follows
    `sec` with nothing between, up to the next allocated section; 0 when it cannot."""
    if free is None or free.offset < sec.offset + sec.size or \
            free.addr - free.offset != sec.addr - sec.offset:
        return 0
    end = sec.offset + sec.size
    later = [s.offset for s in image.sections if s.flags & SHF_ALLOC and s.size
             and s.type != SHT_NOBITS and s.offset >= end and s is not free]
    nxt = min(later, default=free.offset + free.size)
    if nxt < free.offset + free.size or any(
            s.flags & SHF_ALLOC and s.size and end <= s.offset < free.offset
            for s in image.sections):
        return 0
    seg_end = min((sg.offset + sg.filesz for sg in image.segments
                   if sg.offset <= sec.offset < sg.offset + sg.filesz and sg.type == PT_LOAD),
                  default=end)
    return min(nxt, seg_end) - end


def grow_dynsym(image: ElfImage, entries: list[tuple[str, int, int]], shndx: int, at: int
                ) -> DynsymGrowth | None:
    """`.dynsym` with the global functions `entries` (name, address, size) appended in
    section `shndx`, its copies laid out from vaddr `at` on; None where the file has none to
    grow (`dynsym_left_out`) or there is nothing to add."""
    got = _tables(image)
    if isinstance(got, str) or not entries:
        return None
    old_strs = image.section_data(got.dynstr)
    names = bytearray()
    syms = bytearray(image.section_data(got.dynsym))
    for name, address, size in entries:
        syms += _SYM.pack(len(old_strs) + len(names), STB_GLOBAL << 4 | STT_FUNC, 0, shndx,
                          address, size)
        names += name.encode("utf-8", "surrogateescape") + b"\0"
    alloc: list[AllocSection] = []
    patches: list[tuple[int, bytes]] = []
    grown: list[tuple[str, int]] = []

    def place(name: str, data: bytes, align: int, old_name: str | None) -> int:
        nonlocal at
        at = (at + align - 1) & ~(align - 1)
        sec = image.section(name)
        assert sec is not None
        alloc.append(AllocSection(name=name, type=sec.type, flags=sec.flags, vaddr=at, data=data,
                                  align=align, replaces=True, old_name=old_name))
        where = at
        at += len(data)
        return where

    def dyn(tag: int, value: int) -> None:
        patches.append((got.dynamic[tag], struct.pack("<Q", value)))

    dyn(DT_SYMTAB, place(got.dynsym.name, bytes(syms), 8, got.dynsym.name + ".orig"))
    room = _room_after(image, got.dynstr, got.versym)
    in_place = len(names) <= room
    if got.versym is not None:
        versym = image.section_data(got.versym) + struct.pack("<H", VER_NDX_GLOBAL) * len(entries)
        dyn(DT_VERSYM, place(got.versym.name, versym, 2,
                             None if in_place else got.versym.name + ".orig"))
    if in_place:  # the rest of the old .gnu.version lies unused, in no section
        patches.append((got.dynstr.offset + got.dynstr.size, bytes(names)))
        grown.append((got.dynstr.name, got.dynstr.size + len(names)))
        dyn(DT_STRSZ, got.dynstr.size + len(names))
    else:
        dyn(DT_STRTAB, place(got.dynstr.name, old_strs + bytes(names), 1,
                             got.dynstr.name + ".orig"))
        dyn(DT_STRSZ, len(old_strs) + len(names))
    return DynsymGrowth(tuple(alloc), tuple(patches), tuple(grown))


def defined_function_count(image: ElfImage) -> int:
    """How many functions the file defines in its `.dynsym` (STT_FUNC or STT_GNU_IFUNC, not
    undefined, not local): what other objects can call by name."""
    n = 0
    for sec in image.sections:
        if sec.type != SHT_DYNSYM or not image.is64:
            continue
        raw = image.data[sec.offset: sec.offset + sec.size - sec.size % SYM64_SIZE]
        for info, shndx in struct.iter_unpack("<4xBxH16x", raw):
            if info & 0xF in (STT_FUNC, STT_GNU_IFUNC) and info >> 4 != 0 and shndx != 0:
                n += 1
    return n
