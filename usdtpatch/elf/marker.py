"""`.note.usdtpatch`: the restore marker of a rewritten file.

One ELF note (owner `usdtpatch`, type 1) whose descriptor is a JSON object: the original's
size, sha256 and ELF header, and the original bytes of every in-place edit (docs/rewrite.md).
The section is SHT_PROGBITS (MARKER_TYPE_NOW), not allocated: what tools print as notes
(`readelf -n`, `eu-readelf -n`) are the SHT_NOTE sections and PT_NOTE segments, and a marker
shown there as hex swamped the file's own notes (libjvm.so: 612 KB printed instead of
137 KB, issue 33). Files rewritten before carry the same bytes in an SHT_NOTE section: they
read the same (`marker_of` does not ask the type).
Reading and framing it is ELF parsing, so it lives here, below every layer that asks whether
a file was rewritten (the rewriter, the fork guard, the emulator's fork model, the output
check).

Deferred imports: jsondoc and json, only where a marker is read or made (`check` of a file
that was never rewritten loads no json).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from usdtpatch.elf.image import SHT_PROGBITS, ElfImage
from usdtpatch.elf.notes import first_note, note_head
from usdtpatch.errors import UnsupportedError

MARKER_SECTION = ".note.usdtpatch"
MARKER_OWNER = b"usdtpatch\0"
MARKER_TYPE = 1
MARKER_SECTION_TYPE = SHT_PROGBITS  # out of `readelf -n` (an old marker's: SHT_NOTE)


def marker_of(image: ElfImage) -> dict[str, object] | None:
    """The restore marker of a rewritten file, or None."""
    sec = image.section(MARKER_SECTION)
    if sec is None:
        return None
    data = image.section_data(sec)
    if len(data) < 12:
        raise UnsupportedError(f"{MARKER_SECTION} is truncated")
    note = first_note(data)
    if note is None or note.owner != MARKER_OWNER or note.type != MARKER_TYPE:
        raise UnsupportedError(f"{MARKER_SECTION} is not a usdtpatch marker")
    from usdtpatch import jsondoc  # only a rewritten file has the note: `check` of others
    # does not import json

    try:
        doc = jsondoc.loads(note.desc.rstrip(b"\0"))
    except ValueError as exc:
        raise UnsupportedError(f"{MARKER_SECTION} does not hold valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise UnsupportedError(f"{MARKER_SECTION} does not hold a JSON object")
    return doc


def marker_note(doc: Mapping[str, object],
                arrays: Mapping[str, Iterable[object]] | None = None) -> bytes:
    """The marker note's bytes for `doc` with the arrays of `arrays` among its keys, each
    given item by item: every item is encoded as it comes and dropped, so that a marker of
    many sites is never held as objects (a dict per site held 570 bytes a probe at the
    rewrite's peak, issue 38). The JSON text is the one json.dumps gives the whole document
    with sorted keys and no spaces; the note is written into one buffer (`io.BytesIO`, whose
    getvalue hands its bytes over without a copy)."""
    import io
    import json

    enc = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
    arrays = arrays or {}
    out = io.BytesIO()
    head = note_head(MARKER_OWNER, MARKER_TYPE, 0)  # descsz written once known
    out.write(head)
    start = len(head)  # the descriptor: the JSON text
    out.write(b"{")
    for i, key in enumerate(sorted([*doc, *arrays])):
        out.write(f"{',' if i else ''}{enc.encode(key)}:".encode())
        if key not in arrays:
            out.write(enc.encode(doc[key]).encode())
            continue
        out.write(b"[")
        for j, item in enumerate(arrays[key]):
            out.write(f"{',' if j else ''}{enc.encode(item)}".encode())
        out.write(b"]")
    out.write(b"}")
    out.write(bytes((-(out.tell() - start)) % 4))  # descsz counts the padding (as it
    # always has)
    descsz = out.tell() - start
    out.seek(0)
    out.write(note_head(MARKER_OWNER, MARKER_TYPE, descsz))
    return out.getvalue()
