"""usdtpatch.elf.validate: every real rewrite output passes; damaged outputs are rejected with
the reason (truncated, a section or segment past the end, two note sections, no marker, a
marker that would not restore the input, pyelftools reading other headers than ours)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES, fixture, fixture_files
from usdtpatch.analysis.probes import NOTE_SECTION
from usdtpatch.elf.image import PT_LOAD, ElfImage, parse_elf
from usdtpatch.elf.marker import MARKER_SECTION
from usdtpatch.elf.notes import SdtNote, parse_notes
from usdtpatch.elf.validate import SDT_NOTE_SECTION, validate_output
from usdtpatch.errors import OutputError, UnsupportedError
from usdtpatch.rewriter.build import build_rewrite
from usdtpatch.rewriter.plan import plan_rewrite

_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")


def _rewritten(path: Path) -> tuple[bytes, ElfImage] | None:
    image = parse_elf(path.read_bytes())
    try:
        plan = plan_rewrite(image, verify=None)
        return (build_rewrite(plan), image) if plan.changed else None
    except UnsupportedError:
        return None


def _pie() -> tuple[bytes, ElfImage]:
    got = _rewritten(fixture("pie"))
    assert got is not None
    return got


def _set_shdr(data: bytes, index: int, **fields: int) -> bytes:
    image = parse_elf(data)
    at = image.shoff + index * _SHDR.size
    names = ("name", "type", "flags", "addr", "offset", "size", "link", "info", "addralign",
             "entsize")
    values = dict(zip(names, _SHDR.unpack_from(data, at), strict=True))
    values.update(fields)
    out = bytearray(data)
    _SHDR.pack_into(out, at, *(values[n] for n in names))
    return bytes(out)


def _index(data: bytes, name: str) -> int:
    (sec,) = [s for s in parse_elf(data).sections if s.name == name]
    return sec.index


def _rejects(data: bytes, *words: str, original: ElfImage | None = None) -> str:
    with pytest.raises(OutputError) as exc:
        validate_output(data, original)
    text = str(exc.value)
    assert text.startswith("output check: ")
    for w in words:
        assert w in text, text
    return text


def test_note_section_name_is_the_readers() -> None:
    assert SDT_NOTE_SECTION == NOTE_SECTION


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.name)
def test_every_fixture_rewrite_passes(path: Path) -> None:
    got = _rewritten(path)
    if got is None:
        pytest.skip(f"{path.name}: not rewritten (foreign or nothing to change)")
    data, image = got
    validate_output(data, image)
    validate_output(data)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["python3.11", "libstdc++"])
def test_real_binary_rewrites_pass(name: str) -> None:
    path = REAL_BINARIES[name]
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    got = _rewritten(path)
    assert got is not None
    validate_output(*got)


@pytest.mark.parametrize("cut", [1, 64, 200, 4096])
def test_truncated_output(cut: int) -> None:
    data, image = _pie()
    _rejects(data[:-cut], original=image)


def test_section_past_the_end() -> None:
    data, _ = _pie()
    i = _index(data, ".comment")
    _rejects(_set_shdr(data, i, size=len(data)), ".comment", "past the end of the file")


def test_segment_past_the_end() -> None:
    data, _ = _pie()
    image = parse_elf(data)
    load = next(s for s in image.segments if s.type == PT_LOAD)
    out = bytearray(data)
    at = image.phoff + load.index * _PHDR.size
    _PHDR.pack_into(out, at, load.type, load.flags, load.offset, load.vaddr, load.paddr,
                    len(data) - load.offset + 1, len(data) + 4096, load.align)
    _rejects(bytes(out), f"program header {load.index}", "past the end of the file")


def test_filesz_larger_than_memsz() -> None:
    data, _ = _pie()
    image = parse_elf(data)
    load = next(s for s in image.segments if s.type == PT_LOAD and s.filesz > 16)
    out = bytearray(data)
    _PHDR.pack_into(out, image.phoff + load.index * _PHDR.size, load.type, load.flags,
                    load.offset, load.vaddr, load.paddr, load.filesz, load.filesz - 16,
                    load.align)
    _rejects(bytes(out), "p_filesz", "p_memsz")


def test_two_note_sections() -> None:
    data, _ = _pie()
    notes = parse_elf(data).sections[_index(data, SDT_NOTE_SECTION)]
    name_offset = _SHDR.unpack_from(data, parse_elf(data).shoff + notes.index * _SHDR.size)[0]
    twice = _set_shdr(data, _index(data, ".comment"), name=name_offset)
    assert [s.name for s in parse_elf(twice).sections].count(SDT_NOTE_SECTION) == 2
    _rejects(twice, "2 sections are named .note.stapsdt")


def test_marker_missing() -> None:
    data, image = _pie()
    comment = _SHDR.unpack_from(data, parse_elf(data).shoff + _index(data, ".comment") *
                                _SHDR.size)[0]
    gone = _set_shdr(data, _index(data, MARKER_SECTION), name=comment)
    _rejects(gone, "0 sections are named .note.usdtpatch", original=image)


def test_marker_that_is_not_json() -> None:
    data, _ = _pie()
    sec = parse_elf(data).sections[_index(data, MARKER_SECTION)]
    out = bytearray(data)
    desc = sec.offset + 12 + 12  # header, then "usdtpatch\0" padded to 12
    assert out[desc : desc + 1] == b"{"
    out[desc] = ord("[")
    _rejects(bytes(out), "does not hold JSON")


def test_marker_that_would_not_restore() -> None:
    data, image = _pie()
    out = bytearray(data)
    text = image.section(".text")
    assert text is not None
    out[text.offset + 3] ^= 0xFF  # a byte of the original code no patch restores
    _rejects(bytes(out), "would not restore the original", original=image)
    validate_output(bytes(out))  # without the original, nothing tells


def test_marker_of_another_file() -> None:
    data, _ = _pie()
    other = parse_elf(fixture("nopie").read_bytes())
    _rejects(data, original=other)


def test_notes_changed() -> None:
    data, image = _pie()
    sec = parse_elf(data).sections[_index(data, SDT_NOTE_SECTION)]
    chunk = data[sec.offset : sec.offset + sec.size]
    at = chunk.index(b"basic\0") + sec.offset
    out = bytearray(data)
    out[at : at + 5] = b"BASIC"
    _rejects(bytes(out), "other notes than the original", original=image)


def test_a_note_fewer_or_moved_out_of_the_segments() -> None:
    """The notes are compared a pair at a time (issue 38, the output check's memory): the
    count still names both sides, and a pc moved out of every PT_LOAD is still found."""
    data, image = _pie()
    out = parse_elf(data)
    sec = out.sections[_index(data, SDT_NOTE_SECTION)]
    notes = parse_notes(out.section_data(sec), 8, "<").notes
    assert len(notes) >= 2
    fewer = _set_shdr(data, sec.index, size=notes[-1].offset)
    _rejects(fewer, "other notes than the original",
             f"({len(notes) - 1} against {len(notes)})", original=image)
    moved = bytearray(data)
    last = notes[-1]
    assert isinstance(last, SdtNote)
    end = max(s.vaddr + s.memsz for s in out.segments if s.type == PT_LOAD)
    struct.pack_into("<Q", moved, sec.offset + last.offset + 12 + 8, end + 0x1000)
    _rejects(bytes(moved), f"probe {last.provider}:{last.name}", "lies in no PT_LOAD",
             original=image)


def test_pyelftools_reads_another_name() -> None:
    """A section name cut by the end of the name table: we stop at the table's end, pyelftools
    reads on to the next NUL in the file."""
    data, _ = _pie()
    image = parse_elf(data)
    shstrndx = struct.unpack_from("<H", data, 0x3E)[0]
    table = image.sections[shstrndx]
    offsets = {s.index: _SHDR.unpack_from(data, image.shoff + s.index * _SHDR.size)[0]
               for s in image.sections if s.name}
    last = max(offsets, key=lambda i: offsets[i])
    name = image.sections[last].name
    assert len(name) > 2 and offsets[last] + len(name) + 1 == table.size, (name, table.size)
    cut = _set_shdr(data, shstrndx, size=table.size - 2)
    assert parse_elf(cut).sections[last].name == name[:-1]
    _rejects(cut, "pyelftools", repr(name[:-1]))


def test_marker_size_larger_than_the_file() -> None:
    data, image = _pie()
    size = len(image.data)
    old = f'"original_size":{size},'.encode()
    assert data.count(old) == 1
    too_big = f'"original_size":{"9" * len(str(size))},'.encode()  # same length, > the file
    assert int(too_big[16:-1]) > len(data)
    _rejects(data.replace(old, too_big), "does not fit this file")


def test_input_header_past_its_end() -> None:
    """A section of the input that runs past the input's end would cover the appended data in
    the output (readelf then reads garbage relocations, notes, symbols from it). The writer
    refuses such an input too; the check does not depend on it."""
    data, image = _pie()
    comment = image.section(".comment")
    assert comment is not None
    size = len(image.data) - comment.offset + 16
    bad = parse_elf(_set_shdr(bytes(image.data), comment.index, size=size))
    _rejects(data, "the input's section", ".comment", original=bad)


def test_a_name_that_is_not_utf8_is_read_alike() -> None:
    data, image = _pie()
    out = parse_elf(data)
    shstrndx = struct.unpack_from("<H", data, 0x3E)[0]
    table = out.sections[shstrndx]
    at = data.index(b".comment\0", table.offset) + 2
    damaged = bytearray(data)
    damaged[at] = 0xFF  # ".c\xffmment"
    assert "\ufffd" in parse_elf(bytes(damaged)).sections[_index(data, ".comment")].name
    validate_output(bytes(damaged), image)
