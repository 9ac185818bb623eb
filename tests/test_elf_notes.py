"""SDT note parsing and serialization, including the notes the parser must reject."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from usdtpatch.elf.notes import RawNote, SdtNote, parse_notes, serialize_note, serialize_notes


def _note(provider: bytes = b"prov", name: bytes = b"probe", args: bytes = b"8@%rdi",
          pc: int = 0x1234, base: int = 0x4000, sem: int = 0, word: str = "Q",
          bo: str = "<", owner: bytes = b"stapsdt\0", ntype: int = 3,
          desc_override: bytes | None = None) -> bytes:
    desc = struct.pack(bo + word * 3, pc, base, sem) + provider + b"\0" + name + b"\0" + args \
        + b"\0"
    if desc_override is not None:
        desc = desc_override
    pad = (-len(desc)) % 4
    return (struct.pack(bo + "III", len(owner), len(desc), ntype) + owner
            + b"\0" * ((-len(owner)) % 4) + desc + b"\0" * pad)


@pytest.mark.parametrize("word,bo,size", [("Q", "<", 8), ("I", "<", 4), ("Q", ">", 8)],
                         ids=["elf64-le", "elf32-le", "elf64-be"])
def test_parse_fields(word: str, bo: str, size: int) -> None:
    data = _note(word=word, bo=bo, sem=0x5000) + _note(name=b"two", args=b"", word=word, bo=bo)
    sec = parse_notes(data, size, bo)
    assert sec.trailer == b""
    first, second = sec.sdt_notes
    assert (first.pc, first.base, first.semaphore) == (0x1234, 0x4000, 0x5000)
    assert (first.provider, first.name, first.args) == ("prov", "probe", "8@%rdi")
    assert second.offset == len(_note(word=word, bo=bo, sem=0x5000)) and second.args == ""
    assert serialize_notes(sec, size, bo) == data


def test_serialize_recomputes_sizes_after_a_change() -> None:
    from dataclasses import replace

    data = _note()
    note = parse_notes(data, 8, "<").sdt_notes[0]
    longer = replace(note, args="8@%rdi -4@136(%rsp)", pc=0x9999)
    out = serialize_note(longer, 8, "<")
    again = parse_notes(out, 8, "<").sdt_notes[0]
    assert (again.pc, again.args) == (0x9999, "8@%rdi -4@136(%rsp)")
    assert len(out) % 4 == 0


@pytest.mark.parametrize(
    "blob,reason",
    [
        (_note(desc_override=b"\0" * 20), "smaller than the 24 bytes"),
        (_note(desc_override=struct.pack("<QQQ", 1, 2, 3) + b"prov\0name"), "NUL-terminated"),
        (_note(desc_override=struct.pack("<QQQ", 1, 2, 3)), "NUL-terminated"),
    ],
    ids=["desc-too-small", "missing-nul", "no-strings"],
)
def test_malformed_notes_are_kept_raw_with_a_reason(blob: bytes, reason: str) -> None:
    data = _note() + blob + _note(name=b"after")
    sec = parse_notes(data, 8, "<")
    raws = [n for n in sec.notes if isinstance(n, RawNote)]
    assert len(raws) == 1 and reason in raws[0].reason and not raws[0].foreign
    assert [n.name for n in sec.sdt_notes] == ["probe", "after"]
    assert serialize_notes(sec, 8, "<") == data


def test_foreign_notes_are_kept() -> None:
    data = _note(owner=b"GNU\0", ntype=1) + _note(ntype=7) + _note()
    sec = parse_notes(data, 8, "<")
    assert [isinstance(n, RawNote) and n.foreign for n in sec.notes] == [True, True, False]
    assert serialize_notes(sec, 8, "<") == data


@pytest.mark.parametrize("cut", [1, 5, 11, 12, 20, 40])
def test_truncated_section_keeps_a_trailer(cut: int) -> None:
    good = _note()
    data = good + _note(name=b"cut")[:cut]
    sec = parse_notes(data, 8, "<")
    assert [n.name for n in sec.sdt_notes] == ["probe"]
    assert sec.trailer and sec.trailer_reason
    assert serialize_notes(sec, 8, "<") == data


def test_nonzero_padding_round_trips() -> None:
    data = bytearray(_note(args=b"8@%rdi "))  # desc length not a multiple of 4
    data[-1] = 0xAA
    sec = parse_notes(bytes(data), 8, "<")
    assert serialize_notes(sec, 8, "<") == bytes(data)


@given(st.binary(max_size=400))
def test_any_bytes_round_trip(data: bytes) -> None:
    for size, bo in ((8, "<"), (4, "<"), (8, ">")):
        sec = parse_notes(data, size, bo)
        assert serialize_notes(sec, size, bo) == data


@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.text(max_size=12),
                          st.text(max_size=40), st.integers(0, 2**64 - 1)), max_size=6))
def test_generated_notes_round_trip(items: list[tuple[str, str, str, int]]) -> None:
    notes = [SdtNote(0, pc, pc ^ 0xFF, 0, p.replace("\0", ""), n.replace("\0", ""),
                     a.replace("\0", "")) for p, n, a, pc in items]
    data = b"".join(serialize_note(n, 8, "<") for n in notes)
    back = parse_notes(data, 8, "<").sdt_notes
    assert [(n.provider, n.name, n.args, n.pc) for n in back] == \
        [(n.provider, n.name, n.args, n.pc) for n in notes]


def test_build_id_first_note_and_make_note() -> None:
    import re
    import shutil
    import subprocess

    from tests.helpers import fixture
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.elf.notes import build_id, first_note, make_note

    path = fixture("demo")
    image = parse_elf(path.read_bytes())
    sec = image.section(".note.gnu.build-id")
    assert sec is not None
    got = build_id(image.section_data(sec))
    exe = shutil.which("readelf")
    if exe is not None:
        text = subprocess.run([exe, "-n", str(path)], capture_output=True, text=True,
                              check=True).stdout
        m = re.search(r"Build ID: ([0-9a-f]+)", text)
        assert m is not None and got == m.group(1)
    note = make_note(b"owner\0", 7, b"abcde")
    assert len(note) % 4 == 0
    one = first_note(note)
    assert one is not None and (one.owner, one.type, one.desc) == (b"owner\0", 7, b"abcde")
    assert first_note(note[:-4]) is None  # desc cut short
    assert build_id(b"\0" * 8) is None


def test_x86_feature_1_and() -> None:
    import struct

    from usdtpatch.elf.notes import x86_feature_1_and

    prop = struct.pack("<III", 0xC0000002, 4, 3) + b"\0" * 4  # IBT | SHSTK, padded to 8
    other = struct.pack("<II", 0xC0008002, 4) + b"\x01\0\0\0" + b"\0" * 4  # ISA needed
    desc = other + prop
    note = struct.pack("<III", 4, len(desc), 5) + b"GNU\0" + desc
    assert x86_feature_1_and(note) == 3
    assert x86_feature_1_and(note[:-8]) is None  # the desc runs past the section
    foreign = struct.pack("<III", 4, len(desc), 5) + b"XYZ\0" + desc
    assert x86_feature_1_and(foreign) is None
    assert x86_feature_1_and(b"") is None
