"""Rewrite-side regressions of hostile inputs (issue 10, item 4): each input below once ended
in an internal error (exit 3) or a damaged output with exit 0. Every reproducer is built here
from a copy of a committed fixture; the fixture itself is only read.

- two SDT notes naming one pc (the second note's pc set to the first's): `KeyError: 0`
- a note whose provider holds a byte that is not UTF-8: `UnicodeEncodeError`
- a rewritten file whose `.note.stapsdt` lies past the end of the file: copied as "already
  rewritten" with exit 0, although list and check reject it
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.notes import SdtNote, parse_notes


def _notes(data: bytes) -> tuple[int, list[SdtNote]]:
    """The file offset of .note.stapsdt and its SDT notes."""
    image = parse_elf(data)
    sec = image.section(".note.stapsdt")
    assert sec is not None
    section = parse_notes(image.section_data(sec), 8, "<")
    return sec.offset, [n for n in section.notes if isinstance(n, SdtNote)]


def _desc_at(note: SdtNote) -> int:
    """Offset of a note's descriptor within the note section (owner "stapsdt\\0": 8 bytes)."""
    return note.offset + 12 + 8


def two_notes_one_pc(src: Path, dst: Path) -> None:
    """A copy of `src` whose second SDT note names the first note's pc."""
    data = bytearray(src.read_bytes())
    base, notes = _notes(bytes(data))
    assert len(notes) >= 2
    struct.pack_into("<Q", data, base + _desc_at(notes[1]), notes[0].pc)
    dst.write_bytes(bytes(data))
    dst.chmod(0o755)


def non_utf8_provider(src: Path, dst: Path) -> None:
    """A copy of `src` whose first note's provider has its first byte replaced by 0xff."""
    data = bytearray(src.read_bytes())
    base, notes = _notes(bytes(data))
    data[base + _desc_at(notes[0]) + 24] = 0xFF
    dst.write_bytes(bytes(data))
    dst.chmod(0o755)


def note_past_eof(rewritten: Path, dst: Path) -> None:
    """A copy of a rewritten file whose .note.stapsdt section header points past its end."""
    data = bytearray(rewritten.read_bytes())
    image = parse_elf(bytes(data))
    sec = image.section(".note.stapsdt")
    assert sec is not None
    shoff, shentsize = struct.unpack_from("<Q", data, 0x28)[0], struct.unpack_from(
        "<H", data, 0x3A)[0]
    struct.pack_into("<Q", data, shoff + sec.index * shentsize + 0x18, len(data) + 0x1000)
    dst.write_bytes(bytes(data))


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_two_notes_at_one_pc_are_rewritten_together(tmp_path: Path) -> None:
    src = tmp_path / "twice"
    two_notes_one_pc(fixture("demo"), src)
    before = _sha(src)
    res = run_cli("rewrite", src, "-o", tmp_path / "out", "--json")
    assert res.rc in (0, 1), res.err
    assert _sha(src) == before
    listed = run_cli("list", "--json", tmp_path / "out")
    assert listed.rc == 0, listed.err
    # both notes still name one pc, the moved site's
    import json

    probes = json.loads(listed.out)["files"][0]["probes"]
    assert probes[0]["address"] == probes[1]["address"]
    back = run_cli("restore", tmp_path / "out", "-o", tmp_path / "back")
    assert back.rc == 0, back.err
    assert _sha(tmp_path / "back") == before


def test_non_utf8_note_string_is_rewritten_and_restored(tmp_path: Path) -> None:
    src = tmp_path / "bytes"
    non_utf8_provider(fixture("demo"), src)
    res = run_cli("rewrite", src, "-o", tmp_path / "out")
    assert res.rc in (0, 1), res.err
    assert "internal error" not in res.err
    back = run_cli("restore", tmp_path / "out", "-o", tmp_path / "back")
    assert back.rc == 0, back.err
    assert _sha(tmp_path / "back") == _sha(src)


def test_rewritten_file_with_note_past_eof_is_refused(tmp_path: Path) -> None:
    assert run_cli("rewrite", fixture("demo"), "-o", tmp_path / "rw").rc == 0
    bad = tmp_path / "bad"
    note_past_eof(tmp_path / "rw", bad)
    assert run_cli("list", bad).rc == 2  # list rejects it: rewrite must not copy it
    res = run_cli("rewrite", bad, "-o", tmp_path / "out")
    assert res.rc == 2
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0], res.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make", [two_notes_one_pc, non_utf8_provider])
def test_dry_run_of_hostile_notes_is_not_an_internal_error(make: object, tmp_path: Path
                                                            ) -> None:
    src = tmp_path / "in"
    make(fixture("demo"), src)  # type: ignore[operator]
    res = run_cli("rewrite", "--dry-run", src)
    assert res.rc in (0, 1), res.err
