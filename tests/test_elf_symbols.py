"""usdtpatch/elf/symbols.py against pyelftools: the function-symbol table (one symbol per
address, sized global first, then the first seen), lookups, and the imported names."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from tests.helpers import REAL_BINARIES, fixture
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.symbols import (
    load_symbols,
    symbol_names,
    symbol_value,
    symtab_with_functions,
)

FILES = [fixture("cxx-throw"), fixture("static"), fixture("stripped"), fixture("i386"),
         fixture("libprobes.so"), fixture("bigendian"), REAL_BINARIES["python3.11"],
         REAL_BINARIES["libstdc++"], REAL_BINARIES["libjvm"]]


def _oracle(path: Path) -> tuple[dict[int, tuple[int, str]], set[str]]:
    """(address -> (size, name) by the documented preference, imported names)."""
    best: dict[int, tuple[int, int, str]] = {}
    imports: set[str] = set()
    defined: set[str] = set()
    with path.open("rb") as fh:
        elf = ELFFile(fh)
        has_dynsym = elf.get_section_by_name(".dynsym") is not None
        for sec in elf.iter_sections():
            if not isinstance(sec, SymbolTableSection) or sec["sh_size"] == 0:
                continue
            for sym in sec.iter_symbols():
                shndx = sym["st_shndx"]
                if sec["sh_type"] == "SHT_DYNSYM" and shndx == "SHN_UNDEF":
                    imports.add(sym.name.split("@")[0])
                if sec["sh_type"] == "SHT_SYMTAB" and not has_dynsym:
                    defined.add(sym.name.split("@")[0])
                info = sym["st_info"]
                if info["type"] not in ("STT_FUNC", "STT_LOOS") or shndx == "SHN_UNDEF":
                    continue
                value, size = sym["st_value"], sym["st_size"]
                if not value:
                    continue
                rank = (2 if size else 0) + (0 if info["bind"] == "STB_LOCAL" else 1)
                if value not in best or rank > best[value][0]:
                    best[value] = (rank, size, sym.name)
    return {a: (s, n) for a, (_r, s, n) in best.items()}, imports | defined


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_function_symbols_match_pyelftools(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")
    image = parse_elf(path.read_bytes())
    table = load_symbols(image)
    want, names = _oracle(path)
    assert table.addresses == tuple(sorted(want))
    sizes = table.sizes
    step = max(1, len(table) // 2000)  # every symbol of small files, a sample of libjvm's
    for i in range(0, len(table), step):
        a = table.addresses[i]
        assert (sizes[i], table.name_at(i)) == want[a]
        got = table.lookup(a)
        assert got is not None and got[0].name == want[a][1] and got[1] == 0
    assert set(symbol_names(image)) == names


def test_lookup_inside_and_past_a_function() -> None:
    image = parse_elf(fixture("cxx-throw").read_bytes())
    table = load_symbols(image)
    sized = [i for i in range(len(table)) if table.sizes[i]]
    assert sized
    i = sized[0]
    a, size = table.addresses[i], table.sizes[i]
    got = table.lookup(a + size - 1)
    assert got is not None and got[1] == size - 1
    nxt = table.addresses[i + 1] if i + 1 < len(table) else None
    if nxt != a + size:
        assert table.lookup(a + size) is None
    assert table.lookup(table.addresses[0] - 1) is None


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_symbol_value_matches_pyelftools(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")
    image = parse_elf(path.read_bytes())
    first: dict[str, int] = {}
    with path.open("rb") as fh:
        for sec in ELFFile(fh).iter_sections():
            if isinstance(sec, SymbolTableSection) and sec["sh_type"] == "SHT_SYMTAB":
                for sym in sec.iter_symbols():
                    if sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
                        first.setdefault(sym.name, sym["st_value"])
    names = sorted(first)[:: max(1, len(first) // 300)]
    for name in [*names, "__dso_handle", "main", "no such symbol"]:
        assert symbol_value(image, name) == first.get(name), name


@pytest.mark.parametrize("name", ["demo", "stripped", "static", "libprobes.so"])
def test_symtab_with_functions_is_read_back(name: str) -> None:
    path = fixture(name)
    image = parse_elf(path.read_bytes())
    edit = symtab_with_functions(image, [("__detour_a", 0x9000, 16), ("__detour_b", 0x9010, 8)],
                                 7)
    assert len(edit.symtab) % 24 == 0 and edit.strtab.startswith(b"\0")
    syms = list(struct.iter_unpack("<IBBHQQ", edit.symtab))
    added = [s for s in syms if s[4] in (0x9000, 0x9010) and s[3] == 7]
    assert [edit.strtab[s[0]:].split(b"\0")[0] for s in added] == [b"__detour_a", b"__detour_b"]
    assert all(s[1] & 0xF == 2 for s in added)
    old = image.section(".symtab")
    if old is not None:
        assert len(syms) == old.size // 24 + 2
        # locals stay before sh_info, the first global after it
        assert all(s[1] >> 4 == 0 for s in syms[: edit.info])
