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

import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from usdtpatch.elf.image import SHT_PROGBITS, ElfImage
from usdtpatch.elf.notes import first_note, note_head
from usdtpatch.errors import UnsupportedError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` reads markers)
if TYPE_CHECKING:
    from typing import BinaryIO

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


@dataclass(frozen=True, slots=True)
class Encoded:
    """An item of a MarkerNote array given as its JSON text, in pieces (a large patch's
    hex, a 4.8 MB string at 100,000 symbols, is never one string)."""

    text: Iterator[bytes]


class MarkerNote:
    """The marker note for `doc` with the arrays of `arrays` among its keys, never held
    whole: each array is a callable that gives its items anew, each item encoded as it
    comes, once to count the note's bytes (`len`) and once as it is written (`write_to`),
    straight into the output file (usdtpatch.elf.writer; a 100,000-site marker held and
    then copied was ~35 MiB of the rewrite's peak, issue 38). The JSON text is the one
    json.dumps gives the whole document with sorted keys and no spaces."""

    def __init__(self, doc: Mapping[str, object],
                 arrays: Mapping[str, Callable[[], Iterable[object]]] | None = None) -> None:
        self._doc = doc
        self._arrays = arrays or {}
        text = sum(len(chunk) for chunk in self._text())
        self._descsz = text + (-text) % 4  # descsz counts the padding (as it always has)
        self._head = note_head(MARKER_OWNER, MARKER_TYPE, self._descsz)

    def __len__(self) -> int:
        return len(self._head) + self._descsz

    def _text(self) -> Iterator[bytes]:
        import json

        enc = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
        yield b"{"
        for i, key in enumerate(sorted([*self._doc, *self._arrays])):
            yield f"{',' if i else ''}{enc.encode(key)}:".encode()
            if key not in self._arrays:
                yield enc.encode(self._doc[key]).encode()
                continue
            yield b"["
            for j, item in enumerate(self._arrays[key]()):
                if j:
                    yield b","
                if isinstance(item, Encoded):
                    yield from item.text
                else:
                    yield enc.encode(item).encode()
            yield b"]"
        yield b"}"

    def write_to(self, out: BinaryIO) -> None:
        """The note's bytes written to `out` (len(self) of them)."""
        out.write(self._head)
        text = 0
        for chunk in self._text():
            out.write(chunk)
            text += len(chunk)
        if text + (-text) % 4 != self._descsz:
            raise AssertionError("the marker's arrays gave other items the second time")
        out.write(bytes((-text) % 4))


def marker_note(doc: Mapping[str, object],
                arrays: Mapping[str, Callable[[], Iterable[object]]] | None = None) -> bytes:
    """The marker note's bytes (MarkerNote's, whole)."""

    out = io.BytesIO()
    MarkerNote(doc, arrays).write_to(out)
    return out.getvalue()
