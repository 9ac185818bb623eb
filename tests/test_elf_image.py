"""The ELF model's headers against pyelftools, an independent reader, on every fixture and the
real binaries; and the model's own refusals."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from tests.helpers import REAL_BINARIES, fixture, fixture_files
from usdtpatch.elf.image import parse_elf
from usdtpatch.errors import ElfFormatError

INPUTS = [*fixture_files(), *REAL_BINARIES.values()]


@pytest.mark.parametrize("path", INPUTS, ids=[p.name for p in INPUTS])
def test_headers_agree_with_pyelftools(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    data = path.read_bytes()
    ours = parse_elf(data)
    with path.open("rb") as f:
        theirs = ELFFile(f)
        assert ours.elfclass * 32 == theirs.elfclass
        assert ours.little_endian == theirs.little_endian
        assert ours.entry == theirs.header["e_entry"]
        segs = [(s["p_type"], s["p_offset"], s["p_vaddr"], s["p_filesz"], s["p_memsz"],
                 s["p_flags"]) for s in theirs.iter_segments()]
        assert [(s.type, s.offset, s.vaddr, s.filesz, s.memsz, s.flags)
                for s in ours.segments] == [
            (t if isinstance(t, int) else _ptype(t), o, v, fs, ms, fl)
            for t, o, v, fs, ms, fl in segs]
        secs = [(s.name, s["sh_offset"], s["sh_addr"], s["sh_size"], s["sh_flags"])
                for s in theirs.iter_sections()]
        assert [(s.name, s.offset, s.addr, s.size, s.flags) for s in ours.sections] == secs


def _ptype(name: str) -> int:
    from elftools.elf import enums

    table: dict[str, int] = {}
    for attr in dir(enums):
        if attr.startswith("ENUM_P_TYPE"):
            table.update(getattr(enums, attr))
    return int(table[name])


def test_vaddr_to_offset_round_trips_through_the_segments() -> None:
    image = parse_elf(fixture("nopie").read_bytes())
    for seg in image.segments:
        if seg.type == 1 and seg.filesz:
            assert image.vaddr_to_offset(seg.vaddr) == seg.offset
            assert image.vaddr_to_offset(seg.vaddr + seg.filesz - 1) == \
                seg.offset + seg.filesz - 1
            assert image.vaddr_to_offset(seg.vaddr + seg.memsz) in (None, *[
                s.offset + seg.vaddr + seg.memsz - s.vaddr for s in image.segments
                if s.type == 1 and s.contains_vaddr(seg.vaddr + seg.memsz)])


@pytest.mark.parametrize("patch,message", [
    ((0x36, "<H", 8), "e_phentsize is 8"),
    ((0x3A, "<H", 8), "e_shentsize is 8"),
    ((0x3E, "<H", 999), "e_shstrndx is 999"),
    ((0x20, "<Q", 1 << 40), "program header 0"),
], ids=["phentsize", "shentsize", "shstrndx", "phoff"])
def test_header_lies_are_refused_with_the_value(patch: tuple[int, str, int],
                                                message: str) -> None:
    data = bytearray(fixture("pie").read_bytes())
    off, fmt, value = patch
    struct.pack_into(fmt, data, off, value)
    with pytest.raises(ElfFormatError, match=message):
        parse_elf(bytes(data))
