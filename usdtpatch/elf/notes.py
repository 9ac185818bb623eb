"""SystemTap SDT notes (`.note.stapsdt`): parse every note, serialize them back byte for byte.

Reference: the ELF note format (gABI: namesz, descsz, type, name, desc, each of name and desc
padded to 4 bytes) and systemtap's SDT v3 note: owner "stapsdt", type 3, desc = pc, base,
semaphore (one address word each: 8 bytes in ELFCLASS64, 4 in ELFCLASS32, in the file's byte
order), then the NUL-terminated provider, name and argument strings.

pyelftools 0.33 dispatches on the note type alone and calls these notes NT_GNU_BUILD_ID, so
they are parsed here, keyed on (owner, type).

Nothing is dropped: a note that is not an SDT note, or is malformed, is kept as a RawNote with
the reason, so that `serialize_notes(parse_notes(x)) == x` for every input.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SDT_OWNER = b"stapsdt\0"
NT_STAPSDT = 3
_NOTE_HEADER = 12


def _align4(n: int) -> int:
    return (n + 3) & ~3


@dataclass(frozen=True, slots=True)
class SdtNote:
    """One SDT probe note. Field names follow systemtap's note layout."""

    offset: int  # of the note header, from the start of the section
    pc: int
    base: int
    semaphore: int
    provider: str
    name: str
    args: str
    desc_tail: bytes = b""  # bytes inside descsz after the args string (normally none)
    pad: bytes | None = None  # non-zero padding after desc, kept only to round-trip it

    @property
    def probe_id(self) -> str:
        return f"{self.provider}:{self.name}"


@dataclass(frozen=True, slots=True)
class RawNote:
    """A note kept as bytes: a foreign note (reason empty) or a malformed one (reason set)."""

    offset: int
    data: bytes
    reason: str
    foreign: bool = False


Note = SdtNote | RawNote


@dataclass(frozen=True, slots=True)
class NoteSection:
    notes: tuple[Note, ...]
    trailer: bytes  # bytes after the last whole note (a truncated header, or garbage)
    trailer_reason: str

    @property
    def sdt_notes(self) -> tuple[SdtNote, ...]:
        return tuple(n for n in self.notes if isinstance(n, SdtNote))


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def _encode(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def parse_notes(data: bytes, word_size: int, byteorder: str) -> NoteSection:
    """Walk a note section. `word_size` is 8 for ELFCLASS64, 4 for ELFCLASS32."""
    notes: list[Note] = []
    hdr = struct.Struct(byteorder + "III")
    words = byteorder + ("QQQ" if word_size == 8 else "III")
    fixed = 3 * word_size
    pos = 0
    while pos < len(data):
        if pos + _NOTE_HEADER > len(data):
            return NoteSection(tuple(notes), data[pos:],
                               f"{len(data) - pos} bytes left, too few for a "
                               f"12-byte note header")
        namesz, descsz, ntype = hdr.unpack_from(data, pos)
        name_off = pos + _NOTE_HEADER
        desc_off = name_off + _align4(namesz)
        end = desc_off + _align4(descsz)
        if desc_off + descsz > len(data):
            return NoteSection(tuple(notes), data[pos:],
                               f"namesz {namesz} and descsz {descsz} run past the "
                               f"end of the section ({len(data):#x} bytes)")
        end = min(end, len(data))  # the last note's padding may be missing
        whole = data[pos:end]
        name = data[name_off : name_off + namesz]
        desc = data[desc_off : desc_off + descsz]
        pad = data[desc_off + descsz : end]
        if name != SDT_OWNER or ntype != NT_STAPSDT:
            notes.append(RawNote(pos, whole, "", foreign=True))
        elif descsz < fixed:
            notes.append(RawNote(pos, whole, f"descsz {descsz} is smaller than the {fixed} "
                                             f"bytes of pc/base/semaphore"))
        elif len(pad) != _align4(descsz) - descsz or (
            _align4(namesz) != namesz and any(data[name_off + namesz : desc_off])
        ):
            notes.append(RawNote(pos, whole, "the note's padding is missing or not zero"))
        else:
            pc, base, sem = struct.unpack_from(words, desc, 0)
            strings = desc[fixed:]
            parts = strings.split(b"\0", 3)
            if len(parts) < 4:
                notes.append(RawNote(pos, whole, f"desc holds {len(parts) - 1} NUL-terminated "
                                                 f"strings, expected provider, name and args"))
            else:
                provider, pname, args, tail = parts
                notes.append(SdtNote(pos, pc, base, sem, _decode(provider), _decode(pname),
                                     _decode(args), tail, pad if any(pad) else None))
        pos = end
    return NoteSection(tuple(notes), b"", "")


def serialize_note(note: Note, word_size: int, byteorder: str) -> bytes:
    """The bytes of one note, padding included."""
    if isinstance(note, RawNote):
        return note.data
    words = byteorder + ("QQQ" if word_size == 8 else "III")
    desc = (struct.pack(words, note.pc, note.base, note.semaphore)
            + _encode(note.provider) + b"\0" + _encode(note.name) + b"\0"
            + _encode(note.args) + b"\0" + note.desc_tail)
    padlen = _align4(len(desc)) - len(desc)
    pad = note.pad if note.pad is not None and len(note.pad) == padlen else b"\0" * padlen
    header = struct.pack(byteorder + "III", len(SDT_OWNER), len(desc), NT_STAPSDT)
    return header + SDT_OWNER + desc + pad


def serialize_notes(section: NoteSection, word_size: int, byteorder: str) -> bytes:
    """The bytes of a whole note section: every note, then the trailer."""
    return b"".join(serialize_note(n, word_size, byteorder) for n in section.notes) + \
        section.trailer
