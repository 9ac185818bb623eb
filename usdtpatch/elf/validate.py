"""The check every rewritten file passes before it is renamed into place.

`validate_output(data, original)` reads the new bytes again, with this package's reader
(usdtpatch.elf.image, usdtpatch.elf.notes) and with an independent one (pyelftools), and
raises OutputError with the first reason the file is not sound:

- both readers parse the file, and agree on every program and section header (pyelftools
  decodes the headers from the same bytes with its own code);
- every segment and every section with file contents lies inside the file; a PT_LOAD has
  p_filesz <= p_memsz, ends below 2^64 (2^32 for ELF32), and p_offset and p_vaddr agree
  modulo p_align (what the loader maps);
- there is exactly one `.note.stapsdt` (consumers find the notes by that name: libbpf takes
  the first) and one `.note.usdtpatch`, the marker `usdtpatch restore` needs: one note
  (owner "usdtpatch", type 1) whose descriptor is a JSON object with the original's size,
  sha256, ELF header and patched bytes;
- given the original image: no program or section header of the input reaches past the
  input's end (in the output it would cover the appended data instead of nothing); the same
  ELF class, byte order, machine, type and entry point;
  the same SDT notes in the same order (provider and name), each still mapped where it was;
  and the marker restores the original byte for byte (its recipe is replayed here and the
  sha256 compared), so `restore` can always give the input back.

Reference: the gABI (ELF header, program and section headers, notes); the marker's layout is
usdtpatch.elf.marker's. The marker is parsed again here on purpose, with the output check's
own error messages, rather than through marker_of.

Deferred import: elftools (pyelftools), in the one function that reads the headers with it.
"""

from __future__ import annotations

import hashlib
import io
import struct
from itertools import pairwise, zip_longest
from typing import Any

from usdtpatch import jsondoc
from usdtpatch.elf.image import (
    PT_LOAD,
    SHT_NOBITS,
    SHT_NULL,
    ElfImage,
    FileBytes,
    Section,
    parse_elf,
)
from usdtpatch.elf.marker import MARKER_OWNER, MARKER_SECTION, MARKER_TYPE
from usdtpatch.elf.notes import Note, SdtNote, iter_notes
from usdtpatch.errors import ElfFormatError, OutputError

SDT_NOTE_SECTION = ".note.stapsdt"
_SEGMENT_FIELDS = ("type", "flags", "offset", "vaddr", "paddr", "filesz", "memsz", "align")
_SECTION_FIELDS = ("type", "flags", "addr", "offset", "size", "link", "info", "addralign",
                   "entsize")


def validate_output(data: bytes, original: ElfImage | None = None) -> None:
    """Raise OutputError(reason) unless `data` is a sound rewritten file (of `original`)."""
    try:
        image = parse_elf(data)
    except ElfFormatError as exc:
        raise OutputError(f"output check: our ELF reader rejects it: {exc}") from exc
    _check_layout(image)
    _check_against_pyelftools(image)
    notes = _only(image, SDT_NOTE_SECTION)  # read note by note against the original's
    marker = _marker(image)
    if original is not None:
        _check_against_original(image, notes, marker, original)


def _fail(reason: str) -> OutputError:
    return OutputError(f"output check: {reason}")


def _name(sec: Section) -> str:
    return f"section {sec.index} ({sec.name or 'no name'})"


def _check_layout(image: ElfImage) -> None:
    size = len(image.data)
    limit = 1 << (64 if image.is64 else 32)
    for seg in image.segments:
        if seg.offset + seg.filesz > size:
            raise _fail(f"program header {seg.index}: file bytes {seg.offset:#x}+"
                        f"{seg.filesz:#x} end past the end of the file ({size:#x})")
        if seg.type != PT_LOAD:
            continue
        if seg.filesz > seg.memsz:
            raise _fail(f"PT_LOAD {seg.index}: p_filesz {seg.filesz:#x} is larger than "
                        f"p_memsz {seg.memsz:#x}")
        if seg.vaddr + seg.memsz > limit:
            raise _fail(f"PT_LOAD {seg.index}: {seg.vaddr:#x}+{seg.memsz:#x} ends past the "
                        f"address space")
        if seg.align > 1 and (seg.align & (seg.align - 1) or
                              seg.offset % seg.align != seg.vaddr % seg.align):
            raise _fail(f"PT_LOAD {seg.index}: p_offset {seg.offset:#x} and p_vaddr "
                        f"{seg.vaddr:#x} disagree modulo p_align {seg.align:#x}")
    for sec in image.sections:
        if sec.type in (SHT_NULL, SHT_NOBITS):
            continue
        if sec.offset + sec.size > size:
            raise _fail(f"{_name(sec)}: {sec.offset:#x}+{sec.size:#x} ends past the end of "
                        f"the file ({size:#x})")


def _pyelftools_headers(data: FileBytes
                        ) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """Program headers and (name, section header) pairs as pyelftools reads them, with the
    enumerated fields turned back into numbers."""
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(data))

    def numbers(struct_: Any, header: Any) -> dict[str, Any]:
        out = dict(header)
        for sub in struct_.subcons:
            encoding = getattr(sub, "encoding", None)
            if isinstance(encoding, dict) and isinstance(out.get(sub.name), str):
                out[sub.name] = encoding.get(out[sub.name], out[sub.name])
        return out

    segments = [numbers(elf.structs.Elf_Phdr, elf.get_segment(i).header)
                for i in range(elf.num_segments())]
    sections = []
    for i in range(elf.num_sections()):
        sec = elf.get_section(i)
        sections.append((str(sec.name), numbers(elf.structs.Elf_Shdr, sec.header)))
    return segments, sections


def _check_against_pyelftools(image: ElfImage) -> None:
    try:
        segments, sections = _pyelftools_headers(image.data)
    except Exception as exc:  # the independent reader's own errors are many and unrelated
        raise _fail(f"pyelftools cannot read it: {type(exc).__name__}: {exc}") from exc
    if len(segments) != len(image.segments):
        raise _fail(f"pyelftools reads {len(segments)} program headers, we read "
                    f"{len(image.segments)}")
    for seg, theirs in zip(image.segments, segments, strict=True):
        for f in _SEGMENT_FIELDS:
            if theirs.get(f"p_{f}") != getattr(seg, f):
                raise _fail(f"program header {seg.index}: p_{f} is {getattr(seg, f)!r} to us, "
                            f"{theirs.get(f'p_{f}')!r} to pyelftools")
    if len(sections) != len(image.sections):
        raise _fail(f"pyelftools reads {len(sections)} section headers, we read "
                    f"{len(image.sections)}")
    for sec, (name, header) in zip(image.sections, sections, strict=True):
        # both decode UTF-8 with replacement (pyelftools' older versions latin-1)
        if name != sec.name and \
                name.encode("latin-1", "replace").decode("utf-8", "replace") != sec.name:
            raise _fail(f"section {sec.index}: named {sec.name!r} by us, {name!r} by "
                        f"pyelftools")
        for f in _SECTION_FIELDS:
            if header.get(f"sh_{f}") != getattr(sec, f):
                raise _fail(f"{_name(sec)}: sh_{f} is {getattr(sec, f)!r} to us, "
                            f"{header.get(f'sh_{f}')!r} to pyelftools")


def _only(image: ElfImage, name: str) -> Section:
    found = [s for s in image.sections if s.name == name]
    if len(found) != 1:
        raise _fail(f"{len(found)} sections are named {name}, expected exactly one")
    return found[0]


def _marker(image: ElfImage) -> dict[str, Any]:
    sec = _only(image, MARKER_SECTION)
    # read where it lies (_check_layout: inside the file), not copied out
    data = memoryview(image.data)[sec.offset : sec.offset + sec.size] \
        if sec.type != SHT_NOBITS else memoryview(b"")
    bo = "<" if image.little_endian else ">"
    if len(data) < 12:
        raise _fail(f"{MARKER_SECTION} holds {len(data)} bytes, too few for a note")
    namesz, descsz, ntype = struct.unpack_from(bo + "III", data, 0)
    desc_at = 12 + ((namesz + 3) & ~3)
    if data[12 : 12 + namesz] != MARKER_OWNER or ntype != MARKER_TYPE:
        raise _fail(f"{MARKER_SECTION} is not a usdtpatch marker (owner "
                    f"{bytes(data[12 : 12 + namesz])!r}, type {ntype})")
    if desc_at + descsz > len(data):
        raise _fail(f"{MARKER_SECTION}: descsz {descsz} runs past the section")
    try:
        doc = jsondoc.loads(_without_nuls(data[desc_at : desc_at + descsz]), _no_site)
    except ValueError as exc:
        raise _fail(f"{MARKER_SECTION} does not hold JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise _fail(f"{MARKER_SECTION} does not hold a JSON object")
    try:
        size = doc["original_size"]
        header = bytes.fromhex(doc["elf_header"])
        patches = [(off, bytes.fromhex(raw)) for off, raw in doc["patches"]]
        sha = doc["original_sha256"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _fail(f"{MARKER_SECTION} lacks a restore recipe field ({exc!r})") from exc
    if not isinstance(size, int) or not 0 < size <= len(image.data) or \
            len(header) > size or not isinstance(sha, str) or len(sha) != 64:
        raise _fail(f"{MARKER_SECTION}: original size {size!r}, header of {len(header)} "
                    f"bytes or sha256 {sha!r} does not fit this file")
    for off, raw in patches:
        if not isinstance(off, int) or off < 0 or off + len(raw) > size:
            raise _fail(f"{MARKER_SECTION}: a patch at {off!r} of {len(raw)} bytes lies "
                        f"outside the original's {size} bytes")
    cut = doc.get("cut")  # the original from cut[0] on lies at cut[1] (writer.plan_segment)
    if cut is not None and not (isinstance(cut, list) and len(cut) == 2 and
                                all(isinstance(v, int) for v in cut) and 0 <= cut[0] <= size
                                and cut[1] >= 0 and cut[1] + size - cut[0] <= len(image.data)):
        raise _fail(f"{MARKER_SECTION}: the copy {cut!r} of the original's end does not fit")
    return {"size": size, "header": header, "patches": patches, "sha256": sha, "cut": cut}


def _without_nuls(view: memoryview) -> memoryview:
    """`view` without its trailing NUL bytes (bytes.rstrip without the copy), 4 KiB at a
    time."""
    end = len(view)
    while end:
        chunk = view[max(0, end - 4096) : end].tobytes()
        kept = len(chunk.rstrip(b"\0"))
        end -= len(chunk) - kept
        if kept:
            break
    return view[:end]


def _no_site(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The marker's objects as the output check reads them: a site's entry (an object with a
    "probe", not the marker's own) as None, since the check reads no site (issue 38, rewrite's
    memory: every site's object held at once was ~0.7 KB a site)."""
    return None if "probe" in obj and "original_sha256" not in obj else obj


def _check_against_original(image: ElfImage, notes: Section, marker: dict[str, Any],
                            original: ElfImage) -> None:
    for what in ("elfclass", "byteorder", "machine", "type", "entry"):
        if getattr(image, what) != getattr(original, what):
            raise _fail(f"the ELF header's {what} changed: {getattr(original, what)!r} -> "
                        f"{getattr(image, what)!r}")
    # A header of the input that reaches past the input's end reaches into the data the
    # rewrite appends: in the output it would cover other bytes than it did in the input.
    size = len(original.data)
    for seg in original.segments:
        if seg.filesz and seg.offset + seg.filesz > size:
            raise _fail(f"the input's program header {seg.index} ({seg.offset:#x}+"
                        f"{seg.filesz:#x}) ends past the input's end ({size:#x}): in the "
                        f"output it would cover the appended data")
    for sec in original.sections:
        if sec.type not in (SHT_NULL, SHT_NOBITS) and sec.offset + sec.size > size:
            raise _fail(f"the input's {_name(sec)} ({sec.offset:#x}+{sec.size:#x}) ends past "
                        f"the input's end ({size:#x}): in the output it would cover the "
                        f"appended data")
    before = _original_notes(original)
    if before is not None:
        _check_notes(before, original, image.section_data(notes), image)
    want = hashlib.sha256(original.data).hexdigest()
    if marker["sha256"] != want or _replayed_sha256(image.data, marker) != want:
        raise _fail(f"the {MARKER_SECTION} marker would not restore the original byte for "
                    f"byte")


def _original_notes(original: ElfImage) -> bytes | None:
    secs = [s for s in original.sections if s.name == SDT_NOTE_SECTION]
    if len(secs) != 1:
        return None
    try:
        return original.section_data(secs[0])
    except ElfFormatError:
        return None


def _check_notes(before: bytes, original: ElfImage, after: bytes, image: ElfImage) -> None:
    """The output's notes (`after`) are the original's (`before`), in the same order
    (provider and name; other notes in the same places), each still mapped where it was.
    Read a note of each at a time (issue 38: both sections' notes held at once were ~700
    bytes a probe at the output check's peak)."""
    def key(n: Note | None) -> tuple[str, str] | None:
        return (n.provider, n.name) if isinstance(n, SdtNote) else None

    count_old = count_new = 0
    same = True
    unmapped: str | None = None  # the first note whose new pc lies in no PT_LOAD
    for a, b in zip_longest(iter_notes(before, original.word_size, original.byteorder),
                            iter_notes(after, image.word_size, image.byteorder)):
        count_old += a is not None
        count_new += b is not None
        if a is None or b is None or key(a) != key(b):
            same = False
        elif same and unmapped is None and isinstance(a, SdtNote) and \
                isinstance(b, SdtNote) and original.vaddr_to_offset(a.pc) is not None and \
                image.vaddr_to_offset(b.pc) is None:
            unmapped = f"probe {b.provider}:{b.name}: the new pc {b.pc:#x} lies in no PT_LOAD"
    if not same:
        raise _fail(f"{SDT_NOTE_SECTION} lists other notes than the original "
                    f"({count_new} against {count_old})")
    if unmapped is not None:
        raise _fail(unmapped)


__all__ = ["MARKER_OWNER", "MARKER_SECTION", "MARKER_TYPE", "SDT_NOTE_SECTION",
           "validate_output"]


def _replayed_sha256(data: FileBytes | bytearray, marker: dict[str, Any]) -> str | None:
    """The sha256 of what the marker's recipe gives back from `data` (the first `size` bytes,
    or with a cut the bytes up to it and the copy of the rest, with the ELF header and the
    patches written over them), hashed piece by piece without a copy of the file; None when
    the recipe would not give `size` bytes."""
    size = marker["size"]
    view = memoryview(data)
    parts = [view]
    if marker.get("cut") is not None:  # the original's end was copied: read it there
        at, copy = marker["cut"]
        parts = [view[:at], view[copy : copy + size - at]]
    edits = sorted([(0, marker["header"]), *marker["patches"]], key=lambda e: e[0])
    if size > sum(len(p) for p in parts) or any(off + len(raw) > size for off, raw in edits):
        return None
    if any(a + len(ra) > b for (a, ra), (b, _rb) in pairwise(edits)):
        out = bytearray()  # overlapping edits: replay them in order
        for p in parts:
            out += p
        del out[size:]
        for off, raw in [(0, marker["header"]), *marker["patches"]]:
            out[off : off + len(raw)] = raw
        return hashlib.sha256(out).hexdigest()
    h = hashlib.sha256()

    def feed(lo: int, hi: int) -> None:  # the recipe's bytes [lo, hi) before the edits
        start = 0
        for p in parts:
            a, b = max(lo, start), min(hi, start + len(p))
            if a < b:
                h.update(p[a - start : b - start])
            start += len(p)

    pos = 0
    for off, raw in edits:
        feed(pos, off)
        h.update(raw)
        pos = off + len(raw)
    feed(pos, size)
    return h.hexdigest()
