"""Relocation tables: the R_X86_64_RELATIVE entries of a file's SHT_RELA sections.

Reference: gABI "Relocation" (Elf64_Rela: r_offset, r_info, r_addend; the type is the low 32
bits of r_info) and the x86-64 psABI (R_X86_64_RELATIVE = 8: the loader stores base + addend at
r_offset). A position-independent table of code pointers (a computed-goto table, `__rseq_cs`)
holds zeros in the file and gets its values from these entries.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from itertools import compress, repeat
from operator import and_, eq

from usdtpatch.elf.image import SHT_DYNSYM, SHT_RELA, ElfImage
from usdtpatch.elf.model import (
    R_X86_64_64,
    R_X86_64_GLOB_DAT,
    R_X86_64_JUMP_SLOT,
    R_X86_64_RELATIVE,
)
from usdtpatch.elf.symbols import symbol_indices

IMPORT_TYPES = frozenset({R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT})
RELA64_SIZE = 24


def relative_relocations(image: ElfImage) -> dict[int, int]:
    """R_X86_64_RELATIVE relocations of an ELF64 file: place -> addend (empty for ELF32)."""
    out: dict[int, int] = {}
    if not image.is64:
        return out
    for sec in image.sections:
        if sec.type != SHT_RELA or sec.offset + sec.size > len(image.data):
            continue
        usable = sec.size - sec.size % RELA64_SIZE
        raw = memoryview(image.data)[sec.offset : sec.offset + usable]
        for off, info, addend in struct.iter_unpack(image.byteorder + "QQq", raw):
            if info & 0xFFFFFFFF == R_X86_64_RELATIVE:
                out[off] = addend
    return out


def rela_table(image: ElfImage, offset: int, size: int) -> list[tuple[int, int, int, int]]:
    """(file offset of the entry, r_offset, type, addend) of each Elf64_Rela in the `size`
    bytes at file `offset` (a DT_RELA table); a partial last entry is ignored."""
    usable = max(0, min(size, len(image.data) - offset))
    usable -= usable % RELA64_SIZE
    raw = memoryview(image.data)[offset : offset + usable]
    places = range(offset, offset + usable, RELA64_SIZE)
    if image.little_endian and sys.byteorder == "little":  # by column, no tuple per entry
        words, signed = raw.cast("Q"), raw.cast("q")
        return list(zip(places, words[0::3].tolist(),
                        map(and_, words[1::3].tolist(), repeat(0xFFFFFFFF)),
                        signed[2::3].tolist(), strict=True))
    return [(place, r_offset, info & 0xFFFFFFFF, addend)
            for place, (r_offset, info, addend)
            in zip(places, struct.iter_unpack(image.byteorder + "QQq", raw), strict=True)]


class RelaTable:
    """A DT_RELA table read by column: the same entries as `rela_table`, but without a tuple
    per entry; the questions a caller asks of one place (`at`: a byte search for the packed
    r_offset, or a look-up in the index of places once `in_range` has built it) or of the
    whole table (`self_relative`: map/compress over the columns) are answered without
    unpacking every entry. Iterating yields the `rela_table` tuples."""

    __slots__ = ("_addends", "_data", "_end", "_fmt", "_infos", "_native", "_offsets", "_raw",
                 "_where", "offset")

    def __init__(self, image: ElfImage, offset: int, size: int) -> None:
        usable = max(0, min(size, len(image.data) - offset))
        usable -= usable % RELA64_SIZE
        self.offset = offset
        self._end = offset + usable
        self._data = image.data
        self._raw = memoryview(image.data)[offset : offset + usable]
        self._native = image.little_endian and sys.byteorder == "little"
        self._offsets: list[int] | None = None
        self._infos: list[int] | None = None
        self._addends: list[int] | None = None
        self._where: dict[int, int] | None = None
        self._fmt = image.byteorder
        if not self._native:
            rows = list(struct.iter_unpack(image.byteorder + "QQq", self._raw))
            self._offsets = [r[0] for r in rows]
            self._infos = [r[1] for r in rows]
            self._addends = [r[2] for r in rows]

    @property
    def r_offsets(self) -> list[int]:
        if self._offsets is None:
            self._offsets = self._raw.cast("Q")[0::3].tolist()
        return self._offsets

    def _columns(self) -> tuple[list[int], list[int]]:
        if self._infos is None or self._addends is None:
            self._infos = self._raw.cast("Q")[1::3].tolist()
            self._addends = self._raw.cast("q")[2::3].tolist()
        return self._infos, self._addends

    def __len__(self) -> int:
        return len(self._raw) // RELA64_SIZE

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        infos, addends = self._columns()
        places = range(self.offset, self.offset + RELA64_SIZE * len(self), RELA64_SIZE)
        return zip(places, self.r_offsets, map(and_, infos, repeat(0xFFFFFFFF)), addends,
                   strict=True)

    def at(self, place: int) -> list[tuple[int, int, int]]:
        """(file offset of the entry, type, addend) of each entry whose r_offset is `place`,
        in table order."""
        where = self._where
        if where is not None and len(where) == len(self):  # in_range's index; places unique
            i = where.get(place)
            if i is None:
                return []
            info, addend = struct.unpack_from(self._fmt + "Qq", self._raw, RELA64_SIZE * i + 8)
            return [(self.offset + RELA64_SIZE * i, info & 0xFFFFFFFF, addend)]
        if not self._native:
            infos, addends = self._columns()
            hits = compress(range(len(self)), map(place.__eq__, self.r_offsets))
            return [(self.offset + RELA64_SIZE * i, infos[i] & 0xFFFFFFFF, addends[i])
                    for i in hits]
        if not 0 <= place < 1 << 64:
            return []
        key = place.to_bytes(8, "little")
        found: list[int] = []
        pos = self._data.find(key, self.offset, self._end)
        while pos >= 0:  # the 8 bytes anywhere; an r_offset only at an entry's start
            if (pos - self.offset) % RELA64_SIZE == 0:
                found.append((pos - self.offset) // RELA64_SIZE)
            pos = self._data.find(key, pos + 1, self._end)
        words, signed = self._raw.cast("Q"), self._raw.cast("q")
        return [(self.offset + RELA64_SIZE * i, words[3 * i + 1] & 0xFFFFFFFF,
                 signed[3 * i + 2]) for i in found]

    def in_range(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(r_offset, type, addend) of each entry whose r_offset is one of the 8-byte words
        in [start, end) (start, start + 8, ...), in table order: what `at` gives for a run of
        places, from an index of the places built once per table."""
        if self._where is None:
            self._where = dict(zip(self.r_offsets, range(len(self)), strict=False))
        where = self._where
        if len(where) == len(self):  # every place once: one entry each
            hits = sorted(where[p] for p in range(start, end, 8) if p in where)
        else:
            hits = list(compress(range(len(self)),
                                 map(range(start, end, 8).__contains__, self.r_offsets)))
        fmt = self._fmt + "QQq"
        return [(r_offset, info & 0xFFFFFFFF, addend) for r_offset, info, addend
                in (struct.unpack_from(fmt, self._raw, RELA64_SIZE * i) for i in hits)]

    def self_relative(self) -> list[int]:
        """r_offset of each R_X86_64_RELATIVE entry whose addend is its own place, in table
        order."""
        infos, addends = self._columns()
        offsets = self.r_offsets
        hits = compress(range(len(self)), map(eq, offsets, addends))
        return [offsets[i] for i in hits if infos[i] & 0xFFFFFFFF == R_X86_64_RELATIVE]


def import_slots(image: ElfImage, name: str) -> list[int]:
    """The places (r_offset) the dynamic linker fills with the address of the dynamic symbol
    `name`: the R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT and R_X86_64_64 entries against it in
    the SHT_RELA sections tied to `.dynsym` (DT_RELA's and DT_JMPREL's tables), in file order.
    A GOT slot a PLT stub jumps through, or a `call *slot(%rip)` calls through, is one of them.
    Empty for an ELF32 file. Found by searching each table for the r_info words those entries
    would have, not by unpacking every entry."""
    if not image.is64:
        return []
    out: list[int] = []
    for sec in image.sections:
        if sec.type != SHT_RELA or not 0 < sec.link < len(image.sections):
            continue
        table = image.sections[sec.link]
        if table.type != SHT_DYNSYM:
            continue
        indices = symbol_indices(image, table, name)
        if not indices:
            continue
        data = image.data
        first = sec.offset
        last = min(sec.offset + sec.size, len(data))
        last -= (last - first) % RELA64_SIZE
        for index in indices:  # search r_info's upper half, then check the type
            word = struct.pack(image.byteorder + "I", index)
            upper = 12 if image.little_endian else 8
            hit = data.find(word, first, last)
            while hit >= 0:
                if (hit - first) % RELA64_SIZE == upper:
                    _place, info = struct.unpack_from(image.byteorder + "QQ", data,
                                                      hit - upper)
                    if info >> 32 == index and info & 0xFFFFFFFF in IMPORT_TYPES:
                        out.append(_place)
                hit = data.find(word, hit + 1, last)
    return sorted(out)
