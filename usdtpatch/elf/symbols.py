"""Function symbols from `.symtab` and `.dynsym`, and a fast address -> function lookup.

Reference: gABI "Symbol Table" (Elf{32,64}_Sym; STT_FUNC = 2, STT_GNU_IFUNC = 10). The table
is unpacked in bulk with struct.iter_unpack; names are read from the string table only for the
symbols a lookup returns.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from dataclasses import dataclass

from usdtpatch.elf.image import SHN_UNDEF, SHT_DYNSYM, SHT_SYMTAB, ElfImage

STT_FUNC = 2
STT_GNU_IFUNC = 10
STB_LOCAL = 0


@dataclass(frozen=True, slots=True)
class FunctionSymbol:
    address: int
    size: int
    name: str


@dataclass(frozen=True, slots=True)
class SymbolTable:
    """Function symbols sorted by address; one entry per address (a sized global preferred)."""

    addresses: tuple[int, ...]
    sizes: tuple[int, ...]
    _name_refs: tuple[tuple[int, int], ...]  # (string table section index, name offset)
    _image: ElfImage

    def __len__(self) -> int:
        return len(self.addresses)

    def name_at(self, i: int) -> str:
        strtab_index, off = self._name_refs[i]
        sec = self._image.sections[strtab_index]
        data = self._image.data
        start = sec.offset + off
        limit = min(sec.offset + sec.size, len(data))
        if start >= limit:
            return ""
        end = data.find(b"\0", start, limit)
        return data[start : end if end >= 0 else limit].decode("utf-8", "replace")

    def lookup(self, address: int) -> tuple[FunctionSymbol, int] | None:
        """The function holding `address` and the offset into it, or None."""
        i = bisect_right(self.addresses, address) - 1
        if i < 0:
            return None
        start, size = self.addresses[i], self.sizes[i]
        if size and address >= start + size:
            return None
        if not size and i + 1 < len(self.addresses) and address >= self.addresses[i + 1]:
            return None
        return FunctionSymbol(start, size, self.name_at(i)), address - start


def load_symbols(image: ElfImage) -> SymbolTable:
    """Collect the function symbols of `.symtab` and `.dynsym`."""
    best: dict[int, tuple[int, int, int, int]] = {}  # addr -> (rank, size, strtab, name off)
    fmt = image.byteorder + ("IBBHQQ" if image.is64 else "IIIBBH")
    entsize = struct.calcsize(fmt)
    for sec in image.sections:
        if sec.type not in (SHT_SYMTAB, SHT_DYNSYM) or not sec.size:
            continue
        if not 0 < sec.link < len(image.sections):
            continue
        if sec.offset + sec.size > len(image.data):
            continue  # a truncated table gives no names rather than wrong ones
        usable = sec.size - sec.size % entsize
        table = memoryview(image.data)[sec.offset : sec.offset + usable]
        for entry in struct.iter_unpack(fmt, table):
            if image.is64:
                name, info, _other, shndx, value, size = entry
            else:
                name, value, size, info, _other, shndx = entry
            typ = info & 0xF
            if typ not in (STT_FUNC, STT_GNU_IFUNC) or shndx == SHN_UNDEF or value == 0:
                continue
            # Prefer a sized symbol, then a global one, then the .symtab one (seen first).
            rank = (2 if size else 0) + (1 if info >> 4 != STB_LOCAL else 0)
            old = best.get(value)
            if old is None or rank > old[0]:
                best[value] = (rank, size, sec.link, name)
    addrs = sorted(best)
    return SymbolTable(
        addresses=tuple(addrs),
        sizes=tuple(best[a][1] for a in addrs),
        _name_refs=tuple((best[a][2], best[a][3]) for a in addrs),
        _image=image,
    )
