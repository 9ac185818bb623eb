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

from usdtpatch.elf.image import SHT_PROGBITS, ElfImage
from usdtpatch.elf.notes import first_note, make_note
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


def marker_note(doc: dict[str, object]) -> bytes:
    """The marker note's bytes for `doc`."""
    import json

    desc = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    desc += b"\0" * ((-len(desc)) % 4)  # descsz counts the padding (as it always has)
    return make_note(MARKER_OWNER, MARKER_TYPE, desc)
