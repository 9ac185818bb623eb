"""Symbol tables (`.symtab`, `.dynsym`): function symbols with a fast address -> function lookup,
and the names a file imports. The only module that parses Elf{32,64}_Sym.

Reference: gABI "Symbol Table" (Elf{32,64}_Sym; STT_FUNC = 2, STT_GNU_IFUNC = 10, st_shndx
SHN_UNDEF for an imported symbol). A 64-bit little-endian table is read column by column
(strided memoryview slices: the st_info bytes, the st_shndx half-words, the st_value and st_size
words, the st_name words), and the function symbols are filtered and ranked with map, compress,
sorted and dict over those columns, so that no Python code runs per symbol; other tables are
unpacked with struct.iter_unpack into the same columns. Names are read from the string table
only for the symbols a lookup returns.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import compress
from operator import add, mul, truth

from usdtpatch.elf.image import (
    SHN_UNDEF,
    SHT_DYNSYM,
    SHT_REL,
    SHT_RELA,
    SHT_STRTAB,
    SHT_SYMTAB,
    ElfImage,
    Section,
)
from usdtpatch.errors import ElfFormatError

STT_NOTYPE = 0
STT_OBJECT = 1
STT_FUNC = 2
STT_SECTION = 3
STT_FILE = 4
STT_COMMON = 5
STT_TLS = 6
STT_GNU_IFUNC = 10
STB_LOCAL = 0
SHN_COMMON = 0xFFF2
_TYPE_NAMES = {STT_NOTYPE: "NOTYPE", STT_OBJECT: "OBJECT", STT_FUNC: "FUNC",
               STT_SECTION: "SECTION", STT_GNU_IFUNC: "IFUNC"}
_BIND_NAMES = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK", 10: "UNIQUE"}
SYM64_SIZE = 24


@dataclass(frozen=True, slots=True)
class FunctionSymbol:
    address: int
    size: int
    name: str


@dataclass(frozen=True, slots=True)
class _Columns:
    """Every symbol of the tables read, in file order (tables in section order), by column."""

    infos: bytes  # st_info
    shndx: array[int]  # arrays, not lists: 2 and 8 bytes a symbol (a list of ints costs 8
    values: array[int]  # for the pointer and 32 for each int: a 10-million-entry table took
    sizes: array[int]  # gigabytes, issue 20 item 11)
    names: list[memoryview | list[int]]  # per table: st_name of each of its symbols
    starts: list[int]  # index of each table's first symbol in the columns
    strtabs: list[int]  # each table's string table section index
    tables: list[Section]


@dataclass(frozen=True, slots=True)
class SymbolTable:
    """Function symbols sorted by address; one entry per address (a sized global preferred,
    then the first seen in section order)."""

    addresses: tuple[int, ...]
    _best: dict[int, int] = field(repr=False)  # address -> index into _cols
    _cols: _Columns = field(repr=False)
    _image: ElfImage = field(repr=False)
    # the address of every other symbol (`_IS_LABEL`), sorted, and one symbol's index for each
    labels: tuple[int, ...] = ()
    _label: dict[int, int] = field(default_factory=dict, repr=False)

    def labels_inside(self, start: int, end: int) -> list[int]:
        """Addresses of the symbols that are no function symbol (`labels`) strictly inside
        (start, end): an entry label of hand-written assembly, an object placed in code."""
        lo = bisect_right(self.labels, start)
        hi = bisect_left(self.labels, end)
        return list(self.labels[lo:hi])

    def describe_label(self, address: int) -> str:
        """`name` (TYPE BINDING, from .symtab or .dynsym) of the symbol `labels` keeps at
        `address`, or of the function symbol there."""
        k = self._label.get(address, self._best.get(address))
        if k is None:
            return f"{address:#x}"
        info = self._cols.infos[k]
        t = bisect_right(self._cols.starts, k) - 1
        table = self._cols.tables[t].name or "symbol table"
        kind = _TYPE_NAMES.get(info & 0xF, f"type {info & 0xF}")
        bind = _BIND_NAMES.get(info >> 4, f"binding {info >> 4}")
        return f"{self._name(k) or '(no name)'} ({kind} {bind} in {table})"

    def __len__(self) -> int:
        return len(self.addresses)

    @property
    def sizes(self) -> tuple[int, ...]:
        sizes = self._cols.sizes
        return tuple(sizes[self._best[a]] for a in self.addresses)

    def _name(self, k: int) -> str:
        return _column_name(self._image, self._cols, k)

    def name_at(self, i: int) -> str:
        return self._name(self._best[self.addresses[i]])

    def lookup(self, address: int) -> tuple[FunctionSymbol, int] | None:
        """The function holding `address` and the offset into it, or None."""
        i = bisect_right(self.addresses, address) - 1
        if i < 0:
            return None
        start = self.addresses[i]
        k = self._best[start]
        size = self._cols.sizes[k]
        if size and address >= start + size:
            return None
        if not size and i + 1 < len(self.addresses) and address >= self.addresses[i + 1]:
            return None
        return FunctionSymbol(start, size, self._name(k)), address - start


def _column_name(image: ElfImage, cols: _Columns, k: int, encoding: str = "utf-8") -> str:
    t = bisect_right(cols.starts, k) - 1
    sec = image.sections[cols.strtabs[t]]
    off = cols.names[t][k - cols.starts[t]]
    data = image.data
    start = sec.offset + off
    limit = min(sec.offset + sec.size, len(data))
    if start >= limit:
        return ""
    end = data.find(b"\0", start, limit)
    return data[start : end if end >= 0 else limit].decode(encoding, "replace")


_BOTH = (SHT_SYMTAB, SHT_DYNSYM)


def _tables(image: ElfImage, types: tuple[int, ...] = _BOTH) -> Iterator[tuple[Section, int]]:
    """Each readable symbol table (of the section `types`) with its usable byte count."""
    entsize = SYM64_SIZE if image.is64 else 16
    for sec in image.sections:
        if sec.type not in types or not sec.size:
            continue
        if not 0 < sec.link < len(image.sections):
            continue
        if sec.offset + sec.size > len(image.data):
            continue  # a truncated table gives no names rather than wrong ones
        yield sec, sec.size - sec.size % entsize


def _columns(image: ElfImage, types: tuple[int, ...] = _BOTH) -> _Columns:
    infos = bytearray()
    shndx = array("H")
    values = array("Q")
    sizes = array("Q")
    names: list[memoryview | list[int]] = []
    starts: list[int] = []
    strtabs: list[int] = []
    tables: list[Section] = []
    native = image.is64 and image.little_endian and sys.byteorder == "little"
    view = memoryview(image.data)
    for sec, usable in _tables(image, types):
        starts.append(len(values))
        strtabs.append(sec.link)
        tables.append(sec)
        table = view[sec.offset : sec.offset + usable]
        if native:  # Elf64_Sym: name u32, info u8, other u8, shndx u16, value u64, size u64
            infos += table[4::SYM64_SIZE].tobytes()
            shndx.frombytes(table.cast("H")[3::12].tobytes())
            words = table.cast("Q")
            values.frombytes(words[1::3].tobytes())
            sizes.frombytes(words[2::3].tobytes())
            names.append(table.cast("I")[0::6])
            continue
        fmt = image.byteorder + ("IBBHQQ" if image.is64 else "IIIBBH")
        offs: list[int] = []
        for entry in struct.iter_unpack(fmt, table):
            if image.is64:
                name, info, _other, ndx, value, size = entry
            else:
                name, value, size, info, _other, ndx = entry
            offs.append(name)
            infos.append(info)
            shndx.append(ndx)
            values.append(value)
            sizes.append(size)
        names.append(offs)
    return _Columns(infos=bytes(infos), shndx=shndx, values=values, sizes=sizes, names=names,
                    starts=starts, strtabs=strtabs, tables=tables)


# st_info -> 1 for STT_FUNC / STT_GNU_IFUNC, and -> 1 for a binding other than STB_LOCAL
_IS_FUNCTION = bytes(1 if i & 0xF in (STT_FUNC, STT_GNU_IFUNC) else 0 for i in range(256))
_IS_NONLOCAL = bytes(1 if i >> 4 != STB_LOCAL else 0 for i in range(256))
# st_info -> 1 for a symbol whose value is an address and that is no function symbol: any
# type (NOTYPE, OBJECT, SECTION, an OS or processor type) but STT_FILE (its value is no
# address), STT_TLS (an offset into the thread's block) and STT_COMMON (an alignment). A
# section symbol's value is its section's start: a target there holds no window that stays
# in one function and its padding from crossing into the next section, which is its due.
_IS_LABEL = bytes(0 if i & 0xF in (STT_FUNC, STT_GNU_IFUNC, STT_FILE, STT_TLS, STT_COMMON)
                  else 1 for i in range(256))


def load_symbols(image: ElfImage) -> SymbolTable:
    """Collect the function symbols of `.symtab` and `.dynsym`.

    Column operations only (map, compress, sorted, dict over the columns): no Python-level loop
    runs per symbol, which keeps the 57,000 symbols of libjvm.so to a few milliseconds."""
    cols = _columns(image)
    values = cols.values
    n = len(values)
    # function symbols that are defined (st_shndx != SHN_UNDEF) at a nonzero address
    keep = compress(range(n - 1, -1, -1),
                    map(mul, map(mul, reversed(cols.infos.translate(_IS_FUNCTION)),
                                 reversed(cols.shndx)), reversed(values)))
    # Prefer a sized symbol, then a global one, then the one seen first: kept newest first, a
    # stable sort by rank, and a dict built in that order keep the best index for each address.
    sized = bytes(map(truth, cols.sizes))
    rank = bytes(map(add, map(add, sized, sized), cols.infos.translate(_IS_NONLOCAL)))
    ranked = sorted(keep, key=rank.__getitem__)
    best = dict(zip(map(values.__getitem__, ranked), ranked, strict=True))
    # every other symbol defined (not SHN_UNDEF, not SHN_COMMON) at a nonzero address, of
    # .symtab and .dynsym, local or not: a way in wherever it lies in code (issue 46)
    labelled = compress(range(n - 1, -1, -1),
                        map(mul, map(mul, reversed(cols.infos.translate(_IS_LABEL)),
                                     map(SHN_COMMON.__ne__, reversed(cols.shndx))),
                            map(mul, reversed(cols.shndx), reversed(values))))
    ranked_labels = sorted(labelled, key=rank.__getitem__)
    label = dict(zip(map(values.__getitem__, ranked_labels), ranked_labels, strict=True))
    return SymbolTable(addresses=tuple(sorted(best)), _best=best, _cols=cols, _image=image,
                       labels=tuple(sorted(label)), _label=label)


def symbol_names(image: ElfImage) -> Iterator[str]:
    """The names a file links against: its imports (undefined `.dynsym` entries), or, in a file
    without `.dynsym` (a static executable), every `.symtab` name (it defines what it calls).
    Version suffixes (`@GLIBC_2.2.5`) are dropped."""
    has_dynsym = any(s.type == SHT_DYNSYM for s in image.sections)
    cols = _columns(image, (SHT_DYNSYM,) if has_dynsym else _BOTH)  # only the tables read
    for t, sec in enumerate(cols.tables):
        if has_dynsym and sec.type == SHT_SYMTAB:
            continue  # a dynamic object: its imports are in .dynsym
        strtab = image.sections[sec.link]
        if strtab.offset + strtab.size > len(image.data):
            continue
        first = cols.starts[t]
        for k in range(first, first + len(cols.names[t])):
            if sec.type == SHT_DYNSYM and cols.shndx[k] != SHN_UNDEF:
                continue
            yield _column_name(image, cols, k, "ascii").split("@")[0]


def symbol_value(image: ElfImage, name: str) -> int | None:
    """The value of the first defined `.symtab` symbol called `name` with a nonzero value.

    Only the st_name column is scanned (for the string table offsets that spell `name`), and
    only the matching entries are unpacked."""
    want = name.encode() + b"\0"
    data = image.data
    native = image.is64 and image.little_endian and sys.byteorder == "little"
    entsize = SYM64_SIZE if image.is64 else 16
    entry = struct.Struct(image.byteorder + ("IBBHQQ" if image.is64 else "IIIBBH"))
    for sec, usable in _tables(image, (SHT_SYMTAB,)):
        strtab = image.sections[sec.link]
        start, end = strtab.offset, min(strtab.offset + strtab.size, len(data))
        offsets: set[int] = set()
        at = data.find(want, start, end)
        while at >= 0:  # string tables share suffixes: every occurrence counts
            offsets.add(at - start)
            at = data.find(want, at + 1, end)
        if not offsets:
            continue
        table = memoryview(data)[sec.offset : sec.offset + usable]
        names: memoryview | list[int] = (table.cast("I")[0::6] if native else
                                         [e[0] for e in entry.iter_unpack(table)])
        for i in compress(range(len(names)), map(offsets.__contains__, names)):
            fields = entry.unpack_from(table, i * entsize)
            ndx, value = (fields[3], fields[4]) if image.is64 else (fields[5], fields[1])
            if ndx != SHN_UNDEF and value:
                return int(value)
    return None


def symbol_indices(image: ElfImage, table: Section, name: str) -> list[int]:
    """The indices of the entries of symbol table `table` (a `.dynsym` or `.symtab` section)
    called `name` (version suffixes are not part of a name in the file), in table order: what
    a relocation's symbol index is compared with. Found by searching the string table for the
    name and the table for its st_name words, not by reading every name."""
    entsize = SYM64_SIZE if image.is64 else 16
    if table.type not in _BOTH or not 0 < table.link < len(image.sections):
        return []
    strtab = image.sections[table.link]
    data = image.data
    first, last = table.offset, min(table.offset + table.size, len(data))
    last -= (last - first) % entsize
    names_end = min(strtab.offset + strtab.size, len(data))
    want = name.encode() + b"\0"
    found: set[int] = set()
    at = data.find(want, strtab.offset, names_end)
    while at >= 0:  # string tables share suffixes: every occurrence counts
        word = struct.pack(image.byteorder + "I", at - strtab.offset)
        hit = data.find(word, first, last)
        while hit >= 0:
            if (hit - first) % entsize == 0:  # st_name is the first word of an entry
                found.add((hit - first) // entsize)
            hit = data.find(word, hit + 1, last)
        at = data.find(want, at + 1, names_end)
    return sorted(found)


@dataclass(frozen=True, slots=True)
class SymtabEdit:
    """A `.symtab` and its string table with function symbols added (what a writer stores)."""

    symtab: bytes
    strtab: bytes
    info: int  # sh_info: index of the first non-local symbol
    strtab_name: str  # the string table's section name


def symtab_with_functions(image: ElfImage, functions: list[tuple[str, int, int]],
                          shndx: int) -> SymtabEdit:
    """`.symtab` (ELF64 little-endian) with an STT_FUNC symbol (name, address, size) in
    section `shndx` for each of `functions`: local symbols inserted after the existing locals,
    or, when a relocation section indexes `.symtab` (its indices must not move), global
    hidden symbols appended. Without a usable `.symtab`, a new one."""
    old = image.section(".symtab")
    entries: list[bytes] = []
    strtab = bytearray(b"\0")
    info = 1
    strtab_name = ".strtab"
    append_global = False
    if old is not None and old.type == SHT_SYMTAB and 0 < old.link < len(image.sections):
        str_sec = image.sections[old.link]
        strtab = bytearray(image.section_data(str_sec))
        strtab_name = str_sec.name
        raw = image.section_data(old)
        entries = [raw[i : i + SYM64_SIZE]
                   for i in range(0, len(raw) - len(raw) % SYM64_SIZE, SYM64_SIZE)]
        info = old.info
        if not 0 < info <= len(entries):
            raise ElfFormatError(f"section {old.index} (.symtab): sh_info {info:#x} is not an "
                                 f"index of its {len(entries)} entries (the first non-local "
                                 f"symbol)")
        append_global = any(s.type in (SHT_REL, SHT_RELA) and s.link == old.index
                            for s in image.sections)
    else:
        entries = [b"\0" * SYM64_SIZE]
    new: list[bytes] = []
    for name, address, size in functions:
        off = len(strtab)
        # a note's provider or name holds its raw bytes (surrogate-escaped): keep them
        strtab += name.encode("utf-8", "surrogateescape") + b"\0"
        bind = 1 if append_global else STB_LOCAL
        new.append(struct.pack("<IBBHQQ", off, (bind << 4) | STT_FUNC,
                               2 if append_global else 0, shndx, address, size))
    if append_global:
        entries += new
    else:
        entries = entries[:info] + new + entries[info:]
        info += len(new)
    return SymtabEdit(b"".join(entries), bytes(strtab), info, strtab_name)


# ---------------------------------------------------------------------------------------
# Adding symbols without copying the table (a rewrite's detours)

SHT_NOBITS = 8
SHT_GROUP = 17
SHT_SYMTAB_SHNDX = 18
# sections a rewrite re-emits elsewhere, so their old bytes may be overwritten
DEAD_BEFORE_SYMTAB = (".note.stapsdt", ".gnu_debuglink")
DETOUR_PREFIX = "__usdtpatch_detour_"
FIXED_NAME_ROOM = 512  # the fork guard's few symbols


@dataclass(frozen=True, slots=True)
class SymtabInPlace:
    """`.symtab` grown in place: the new null entry and the added symbols are written in
    the `prefix_at` bytes just before the old table's entry 1 (over the old null entry and
    sections the rewrite re-emits elsewhere: `moved`), the names right after the old string
    table (over the old `.shstrtab` and section header table, which a writer replaces, and
    on past the end of the input). Nothing of the old table is copied."""

    symtab_offset: int
    symtab_size: int
    prefix: bytes  # written at symtab_offset
    info: int
    strtab_name: str
    strtab_offset: int
    strtab_size: int
    names_at: int
    names: bytes
    moved: tuple[str, ...]


def _symtab_region(image: ElfImage) -> tuple[Section, Section, int, tuple[str, ...]] | None:
    """(.symtab, its strings, the lowest file offset the table may grow down to, the sections
    in that room that must be re-emitted), or None when the table cannot grow in place: not a
    64-bit little-endian table, indices referenced by another section, the string table not
    the last data of the file, or sections that stay before the table."""
    if not image.is64 or not image.little_endian:
        return None
    sym = image.section(".symtab")
    if sym is None or sym.type != SHT_SYMTAB or sym.allocated or sym.size % SYM64_SIZE or \
            sym.size < SYM64_SIZE or not 0 < sym.link < len(image.sections):
        return None
    strs = image.sections[sym.link]
    shstrndx = int.from_bytes(image.data[0x3E:0x40], "little")
    if strs.type != SHT_STRTAB or strs.allocated or strs.index == shstrndx or \
            strs.offset < sym.offset + sym.size or not 0 < sym.info <= sym.size // SYM64_SIZE:
        return None
    if any(s.link == sym.index and (s.type in (SHT_GROUP, SHT_SYMTAB_SHNDX) or
                                    (s.type in (SHT_REL, SHT_RELA) and _names_symbols(image, s)))
           for s in image.sections):
        return None
    strs_end = strs.offset + strs.size
    if image.shoff < strs_end or strs_end > len(image.data):
        return None
    floor = max(64, image.phoff + 56 * len(image.segments))
    moved: list[str] = []
    for s in image.sections:
        if s.type == SHT_NOBITS or not s.size or s.index in (sym.index, strs.index):
            continue
        end = s.offset + s.size
        if s.index == shstrndx and s.offset >= strs_end:
            continue
        if end > sym.offset:
            return None  # data after the table (other than the section names) stays there
        if s.name in DEAD_BEFORE_SYMTAB and not s.allocated:
            moved.append(s.name)
            continue
        floor = max(floor, end)
    for seg in image.segments:
        if seg.filesz and seg.offset < sym.offset:
            floor = max(floor, seg.offset + seg.filesz)
    all_names = [s.name for s in image.sections]
    if any(all_names.count(n) > 1 for n in moved):
        return None  # which one a re-emitted copy replaces would not be defined
    return sym, strs, floor, tuple(n for n in moved
                                  if _section_end(image, n) > floor)


def _names_symbols(image: ElfImage, rel: Section) -> bool:
    """Whether a relocation section names any symbol by its index (which growing the table in
    place would move). A static executable's `.rela.plt` links to `.symtab` but holds only
    R_X86_64_IRELATIVE entries, whose symbol is 0: the table may grow there too."""
    entsize = 24 if rel.type == SHT_RELA else 16
    if rel.offset + rel.size > len(image.data) or rel.size % entsize:
        return True
    view = memoryview(image.data)[rel.offset : rel.offset + rel.size]
    if sys.byteorder != "little":
        return True  # the words below are read in this machine's order
    return any(view.cast("I")[3 :: entsize // 4])  # r_info's high word: the symbol index


def _section_end(image: ElfImage, name: str) -> int:
    s = image.section(name)
    return 0 if s is None else s.offset + s.size


def symtab_region(image: ElfImage) -> tuple[Section, Section, int, tuple[str, ...]] | None:
    """The room `.symtab` grows into in place (`_symtab_region`), for the writer's cut."""
    return _symtab_region(image)


def symbol_room(image: ElfImage, names_bound: int) -> int:
    """Bytes past the end of `image` that `symtab_in_place` may write names of at most
    `names_bound` bytes into (0 when the table cannot grow in place)."""
    region = _symtab_region(image)
    if region is None:
        return 0
    _sym, strs, _floor, _moved = region
    return max(0, strs.offset + strs.size + names_bound + FIXED_NAME_ROOM - len(image.data))


def symtab_in_place(image: ElfImage, functions: list[tuple[str, int, int]], shndx: int,
                    limit: int) -> SymtabInPlace | None:
    """Local STT_FUNC symbols for `functions` added to `.symtab` in place (SymtabInPlace), or
    None when there is no room: names must end by file offset `limit`."""
    region = _symtab_region(image)
    if region is None:
        return None
    sym, strs, floor, moved = region
    start = sym.offset + SYM64_SIZE - SYM64_SIZE * (len(functions) + 1)
    if start < floor:
        return None
    names = bytearray()
    entries = [b"\0" * SYM64_SIZE]
    for name, address, size in functions:
        entries.append(struct.pack("<IBBHQQ", strs.size + len(names),
                                   (STB_LOCAL << 4) | STT_FUNC, 0, shndx, address, size))
        names += name.encode("utf-8", "surrogateescape") + b"\0"
    names_at = strs.offset + strs.size
    if names_at + len(names) > limit:
        return None
    return SymtabInPlace(symtab_offset=start, symtab_size=sym.size + SYM64_SIZE * len(functions),
                         prefix=b"".join(entries), info=sym.info + len(functions),
                         strtab_name=strs.name, strtab_offset=strs.offset,
                         strtab_size=strs.size + len(names), names_at=names_at, names=bytes(names),
                         moved=tuple(n for n in moved if _section_end(image, n) > start))


def symbol_name_of(image: ElfImage, table: int, index: int) -> str | None:
    """The name of symbol `index` of the symbol table section `table` (a relocation's
    symbol), or None when there is no such entry."""
    secs = image.sections
    if not 0 < table < len(secs) or not 0 < secs[table].link < len(secs):
        return None
    tab, entsize = secs[table], SYM64_SIZE if image.is64 else 16
    at = tab.offset + index * entsize
    if index <= 0 or at + entsize > min(len(image.data), tab.offset + tab.size):
        return None
    (name,) = struct.unpack_from(image.byteorder + "I", image.data, at)
    strtab = secs[tab.link]
    start = strtab.offset + name
    limit = min(strtab.offset + strtab.size, len(image.data))
    if start >= limit:
        return None
    end = image.data.find(b"\0", start, limit)
    return bytes(image.data[start:end if end >= 0 else limit]).decode("utf-8", "replace")


def names_at(image: ElfImage, address: int) -> list[str]:
    """The names of every symbol of .symtab and .dynsym whose value is `address`: defined
    ones, and an undefined function's canonical PLT address in a fixed-address program."""
    cols = _columns(image)
    out: list[str] = []
    for k in compress(range(len(cols.values)), map(address.__eq__, cols.values)):
        name = _column_name(image, cols, k)
        if name and name not in out:
            out.append(name)
    return out
