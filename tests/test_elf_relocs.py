"""usdtpatch/elf/relocs.py against pyelftools' relocation reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from tests.helpers import REAL_BINARIES, fixture
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.model import R_X86_64_RELATIVE
from usdtpatch.elf.relocs import (
    RelaTable,
    rela_table,
    relative_relocations,
)

FILES = [fixture("pie"), fixture("libprobes.so"), fixture("nopie"), fixture("static"),
         fixture("i386"), REAL_BINARIES["libstdc++"]]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_relocations_match_pyelftools(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")
    image = parse_elf(path.read_bytes())
    want: dict[int, int] = {}
    tables: list[tuple[int, int, list[tuple[int, int, int]]]] = []
    with path.open("rb") as fh:
        elf = ELFFile(fh)
        for sec in elf.iter_sections():
            if isinstance(sec, RelocationSection) and sec.is_RELA() and elf.elfclass == 64:
                rows = [(r["r_offset"], r["r_info_type"], r["r_addend"])
                        for r in sec.iter_relocations()]
                tables.append((sec["sh_offset"], sec["sh_size"], rows))
                want.update({o: a for o, t, a in rows if t == R_X86_64_RELATIVE})
    assert relative_relocations(image) == want
    for offset, size, rows in tables:
        got = rela_table(image, offset, size)
        assert [(o, t, a) for _e, o, t, a in got] == rows
        assert [e for e, *_ in got] == list(range(offset, offset + 24 * len(rows), 24))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_rela_table_by_column_answers_as_the_tuples(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")
    image = parse_elf(path.read_bytes())
    tables = [(s.offset, s.size) for s in image.sections if s.type == 4]  # SHT_RELA
    assert tables or not image.is64
    for offset, size in [*tables, (0, 0)]:
        rows = rela_table(image, offset, size)
        table = RelaTable(image, offset, size)
        assert list(table) == rows and len(table) == len(rows)
        assert table.self_relative() == [r for _o, r, t, a in rows
                                          if t == R_X86_64_RELATIVE and a == r]
        places = {r for _o, r, _t, _a in rows[:50]} | {0, 1}
        for place in places:
            assert table.at(place) == [(o, t, a) for o, r, t, a in rows if r == place]
        if rows:  # once in_range has built its index, `at` answers from it: the same
            lo = min(r for _o, r, _t, _a in rows)
            assert table.in_range(lo, lo + 64) == [(r, t, a) for _o, r, t, a in rows
                                                   if r in range(lo, lo + 64, 8)]
            for place in places:
                assert table.at(place) == [(o, t, a) for o, r, t, a in rows if r == place]
