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
from collections.abc import Generator
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
    walk = iter_notes(data, word_size, byteorder)
    while True:
        try:
            notes.append(next(walk))
        except StopIteration as stop:
            trailer, reason = stop.value
            return NoteSection(tuple(notes), trailer, reason)


def iter_notes(data: bytes, word_size: int, byteorder: str
               ) -> Generator[Note, None, tuple[bytes, str]]:
    """The notes of a note section one at a time (parse_notes' walk: none is kept); the
    generator returns the trailer and its reason (NoteSection's)."""
    hdr = struct.Struct(byteorder + "III")
    words = byteorder + ("QQQ" if word_size == 8 else "III")
    fixed = 3 * word_size
    pos = 0
    while pos < len(data):
        if pos + _NOTE_HEADER > len(data):
            return data[pos:], (f"{len(data) - pos} bytes left, too few for a "
                                f"12-byte note header")
        namesz, descsz, ntype = hdr.unpack_from(data, pos)
        name_off = pos + _NOTE_HEADER
        desc_off = name_off + _align4(namesz)
        end = desc_off + _align4(descsz)
        if desc_off + descsz > len(data):
            return data[pos:], (f"namesz {namesz} and descsz {descsz} run past the "
                                f"end of the section ({len(data):#x} bytes)")
        end = min(end, len(data))  # the last note's padding may be missing
        whole = data[pos:end]
        name = data[name_off : name_off + namesz]
        desc = data[desc_off : desc_off + descsz]
        pad = data[desc_off + descsz : end]
        if name != SDT_OWNER or ntype != NT_STAPSDT:
            yield RawNote(pos, whole, "", foreign=True)
        elif descsz < fixed:
            yield RawNote(pos, whole, f"descsz {descsz} is smaller than the {fixed} "
                                      f"bytes of pc/base/semaphore")
        elif len(pad) != _align4(descsz) - descsz or (
            _align4(namesz) != namesz and any(data[name_off + namesz : desc_off])
        ):
            yield RawNote(pos, whole, "the note's padding is missing or not zero")
        else:
            pc, base, sem = struct.unpack_from(words, desc, 0)
            strings = desc[fixed:]
            parts = strings.split(b"\0", 3)
            if len(parts) < 4:
                yield RawNote(pos, whole, f"desc holds {len(parts) - 1} NUL-terminated "
                                          f"strings, expected provider, name and args")
            else:
                provider, pname, args, tail = parts
                yield SdtNote(offset=pos, pc=pc, base=base, semaphore=sem,
                              provider=_decode(provider), name=_decode(pname),
                              args=_decode(args), desc_tail=tail,
                              pad=pad if any(pad) else None)
        pos = end
    return b"", ""


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


# ---------------------------------------------------------------------------------------------
# Other notes: one note read or made, the GNU build-id


@dataclass(frozen=True, slots=True)
class OneNote:
    """The first note of a note section's bytes (owner without its NUL padding)."""

    owner: bytes  # namesz bytes, the terminating NUL included when the note has one
    type: int
    desc: bytes


def first_note(data: bytes, byteorder: str = "<") -> OneNote | None:
    """The first note of `data`, or None when its header or its name and desc run past the
    end of `data`."""
    if len(data) < _NOTE_HEADER:
        return None
    namesz, descsz, ntype = struct.unpack_from(byteorder + "III", data, 0)
    desc_at = _NOTE_HEADER + _align4(namesz)
    if desc_at + descsz > len(data):
        return None
    return OneNote(data[_NOTE_HEADER : _NOTE_HEADER + namesz], ntype,
                   data[desc_at : desc_at + descsz])


def make_note(owner: bytes, ntype: int, desc: bytes, byteorder: str = "<") -> bytes:
    """One note's bytes: `owner` (NUL included) and `desc`, each padded to 4 bytes."""
    return (note_head(owner, ntype, len(desc), byteorder)
            + desc + b"\0" * (_align4(len(desc)) - len(desc)))


def note_head(owner: bytes, ntype: int, descsz: int, byteorder: str = "<") -> bytes:
    """A note's bytes up to its descriptor: the header and `owner` (NUL included), padded
    to 4 bytes."""
    return (struct.pack(byteorder + "III", len(owner), descsz, ntype)
            + owner + b"\0" * (_align4(len(owner)) - len(owner)))


def build_id(data: bytes, byteorder: str = "<") -> str | None:
    """The hex build-id held by the bytes of a `.note.gnu.build-id` section, or None.

    (As the rewriter's marker has always recorded it: the first note's desc, whatever its
    owner; a desc cut short by the section's end is kept as far as it goes.)"""
    if len(data) < 16:
        return None
    namesz, descsz = struct.unpack_from(byteorder + "II", data, 0)
    off = _NOTE_HEADER + _align4(namesz)
    return data[off : off + descsz].hex() or None


GNU_PROPERTY_X86_FEATURE_1_AND = 0xC0000002
GNU_PROPERTY_X86_FEATURE_1_IBT = 0x1
GNU_PROPERTY_X86_FEATURE_1_SHSTK = 0x2
NT_GNU_PROPERTY_TYPE_0 = 5


def x86_feature_1_and(data: bytes, is64: bool = True) -> int | None:
    """The GNU_PROPERTY_X86_FEATURE_1_AND bits (IBT, SHSTK) of the bytes of a
    `.note.gnu.property` section, or None when it holds no such property.

    Reference: the x86-64 psABI, "Program Property" (NT_GNU_PROPERTY_TYPE_0 notes of owner
    "GNU"; an ELF64 note's desc and each property are 8-byte aligned)."""
    pos = 0
    while pos + _NOTE_HEADER <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
        name_at = pos + _NOTE_HEADER
        desc_at = name_at + _align4(namesz)
        desc_at = (desc_at + 7) & ~7 if is64 else desc_at
        end = desc_at + descsz
        if end > len(data):
            return None
        if data[name_at : name_at + namesz].rstrip(b"\0") == b"GNU" and \
                ntype == NT_GNU_PROPERTY_TYPE_0:
            q = desc_at
            while q + 8 <= end:
                pr_type, pr_size = struct.unpack_from("<II", data, q)
                if pr_type == GNU_PROPERTY_X86_FEATURE_1_AND and pr_size >= 4 and q + 12 <= end:
                    bits: int = struct.unpack_from("<I", data, q + 8)[0]
                    return bits
                q += 8 + ((pr_size + 7) & ~7)
        pos = (end + 7) & ~7 if is64 else (end + 3) & ~3
    return None
