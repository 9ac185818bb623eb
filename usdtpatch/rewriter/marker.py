"""Restoring the original of a rewritten file from its marker (usdtpatch.elf.marker).

The marker holds the original's size, sha256 and ELF header, and the original bytes of every
in-place edit: `restore_image` gives back the original byte for byte (checked against the
sha256).

Deferred import: hashlib (OpenSSL), only when a file is restored: `check` reads markers
(through the fork guard) and never hashes.
"""

from __future__ import annotations

from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.marker import MARKER_SECTION, marker_of
from usdtpatch.errors import UnsupportedError


class AlreadyRewritten(UnsupportedError):
    """The file carries a usdtpatch marker: rewriting it again is a no-op."""


def restore_image(image: ElfImage) -> bytes:
    """The original file of a rewritten one, byte for byte (checked against its sha256)."""
    doc = marker_of(image)
    if doc is None:
        raise UnsupportedError("not rewritten by usdtpatch (no .note.usdtpatch marker)")
    try:
        size = int(doc["original_size"])  # type: ignore[call-overload]
        header = bytes.fromhex(str(doc["elf_header"]))
        patches = [(int(off), bytes.fromhex(str(raw)))
                   for off, raw in doc["patches"]]  # type: ignore[attr-defined]
        want = str(doc["original_sha256"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedError(f"{MARKER_SECTION} is damaged: {exc}") from exc
    if size > len(image.data):
        raise UnsupportedError(f"the marker says the original had {size} bytes, more than "
                               f"this file ({len(image.data)})")
    out = bytearray(memoryview(image.data)[:size])  # one copy, not two
    cut = doc.get("cut")  # the input from cut[0] on, copied to cut[1] (writer.plan_segment)
    if cut is not None:
        try:
            at, copy = int(cut[0]), int(cut[1])  # type: ignore[index]
        except (TypeError, ValueError, IndexError) as exc:
            raise UnsupportedError(f"{MARKER_SECTION} is damaged: {exc}") from exc
        if not 0 <= at <= size or copy + size - at > len(image.data):
            raise UnsupportedError(f"{MARKER_SECTION} is damaged: the copy of the original "
                                   f"from {at} lies outside the file")
        out[at:] = memoryview(image.data)[copy : copy + size - at]
    out[: len(header)] = header
    for off, raw in patches:
        out[off : off + len(raw)] = raw
    import hashlib  # here: check reads markers (fork guard) and never hashes

    if hashlib.sha256(out).hexdigest() != want:
        raise UnsupportedError("restoring would not give the original back (sha256 differs): "
                               "the file was changed after the rewrite")
    return bytes(out)
