"""Writing a rewritten ELF file: one new PT_LOAD appended, nothing original moved.

Reference: gABI program headers and section headers; the layout that was found to work with
every consumer is in shared/design/usdt-and-rewriting.md ("Encoders and writers"):

    [original file, byte for byte, except the ELF header and the patched code bytes]
    [zero padding up to the new segment's file offset]
    [new PT_LOAD, R+X: program header table | sections placed by the caller]
    [non-allocated sections: the new note section, symbols, string tables, the marker]
    [the new section header table]

The new segment has the same (vaddr - offset) delta as the segment that holds `.stapsdt.base`
(what perf assumes), a vaddr past every existing segment's end (`.bss` included), and p_align
4096. The program header table moves into it (one more entry), PT_PHDR follows it. Since the
delta equals the first PT_LOAD's in ordinary links, kernels that compute AT_PHDR from the
first PT_LOAD still find it. The original section header table is left where it was; the new
one at the end of the file lists every original section (some renamed or repointed) and the
new ones.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from usdtpatch.elf.image import (
    PF_R,
    PF_X,
    PT_GNU_EH_FRAME,
    PT_LOAD,
    PT_PHDR,
    SHF_ALLOC,
    ElfImage,
)
from usdtpatch.errors import UnsupportedError

PAGE = 4096
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")


def _align(v: int, a: int) -> int:
    return (v + a - 1) // a * a


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """Where the new PT_LOAD goes. `phdr_size` bytes at `vaddr` hold the program headers;
    the caller's sections start at `payload_vaddr`."""

    vaddr: int
    offset: int
    phdr_size: int

    @property
    def payload_vaddr(self) -> int:
        return _align(self.vaddr + self.phdr_size, 16)

    def offset_of(self, vaddr: int) -> int:
        return self.offset + (vaddr - self.vaddr)


def plan_segment(image: ElfImage, anchor_vaddr: int | None) -> SegmentLayout:
    """Choose the new segment's place. `anchor_vaddr`: an address in the segment whose delta
    the new one must share (`.stapsdt.base`); None: the first executable PT_LOAD's."""
    if not image.is64 or not image.little_endian:
        raise UnsupportedError("rewriting needs a little-endian ELF64 file")
    loads = [s for s in image.segments if s.type == PT_LOAD]
    if not loads:
        raise UnsupportedError("the file has no PT_LOAD segment")
    anchor = None
    if anchor_vaddr is not None:
        anchor = next((s for s in loads if s.vaddr <= anchor_vaddr < s.vaddr + s.memsz), None)
    if anchor is None:
        anchor = next((s for s in loads if s.flags & PF_X), loads[0])
    delta = anchor.vaddr - anchor.offset
    if delta % PAGE:
        raise UnsupportedError(f"segment delta {delta:#x} is not a multiple of the page size")
    vend = max(s.vaddr + s.memsz for s in loads)
    vaddr = max(_align(vend, PAGE), _align(len(image.data), PAGE) + delta)
    phdr_size = (len(image.segments) + 1) * _PHDR.size
    return SegmentLayout(vaddr, vaddr - delta, phdr_size)


@dataclass(frozen=True, slots=True)
class AllocSection:
    """A section inside the new segment, at a vaddr from SegmentLayout."""

    name: str
    type: int
    flags: int
    vaddr: int
    data: bytes
    align: int = 16


@dataclass(frozen=True, slots=True)
class TailSection:
    """A non-allocated section appended after the segment. `link_name` names the section its
    sh_link points at (new or original)."""

    name: str
    type: int
    data: bytes
    align: int = 8
    entsize: int = 0
    link_name: str | None = None
    info: int = 0


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Everything a rewrite changes, as data."""

    layout: SegmentLayout
    patches: tuple[tuple[int, bytes], ...]  # (file offset, new bytes) inside the original file
    alloc: tuple[AllocSection, ...]
    tail: tuple[TailSection, ...]  # a tail section named like an original replaces it
    renames: dict[str, str] = field(default_factory=dict)  # original section -> new name
    eh_frame_hdr: int | None = None  # vaddr of the new .eh_frame_hdr (PT_GNU_EH_FRAME)


def write(image: ElfImage, rw: Rewrite) -> bytes:
    """The bytes of the rewritten file."""
    lay = rw.layout
    out = bytearray(image.data)
    for off, data in rw.patches:
        if off < 64 or off + len(data) > len(image.data):
            raise UnsupportedError(f"patch at file offset {off:#x} is outside the file's code")
        out[off : off + len(data)] = data
    out += b"\0" * (lay.offset - len(out))

    # the new segment
    seg = bytearray(lay.phdr_size)
    for piece in rw.alloc:
        start = piece.vaddr - lay.vaddr
        if start < len(seg):
            raise UnsupportedError(f"section {piece.name} at {piece.vaddr:#x} overlaps another")
        seg += b"\0" * (start - len(seg)) + piece.data
    seg_size = len(seg)

    phdrs = []
    for sg in image.segments:
        p = [sg.type, sg.flags, sg.offset, sg.vaddr, sg.paddr, sg.filesz, sg.memsz, sg.align]
        if sg.type == PT_PHDR:
            p[2:7] = [lay.offset, lay.vaddr, lay.vaddr, lay.phdr_size, lay.phdr_size]
            p[7] = 8
        elif sg.type == PT_GNU_EH_FRAME and rw.eh_frame_hdr is not None:
            hdr = next(a for a in rw.alloc if a.vaddr == rw.eh_frame_hdr)
            p[2:7] = [lay.offset_of(hdr.vaddr), hdr.vaddr, hdr.vaddr, len(hdr.data),
                      len(hdr.data)]
        phdrs.append(p)
    # the new PT_LOAD goes after the last PT_LOAD, keeping PT_LOADs sorted by vaddr
    last_load = max(i for i, sg in enumerate(image.segments) if sg.type == PT_LOAD)
    phdrs.insert(last_load + 1, [PT_LOAD, PF_R | PF_X, lay.offset, lay.vaddr, lay.vaddr,
                                 seg_size, seg_size, PAGE])
    seg[: lay.phdr_size] = b"".join(_PHDR.pack(*p) for p in phdrs)
    out += seg

    # non-allocated tail sections
    originals = {s.name: s for s in image.sections}
    replaced: dict[str, tuple[int, int]] = {}
    placed: list[tuple[TailSection, int]] = []
    for t in rw.tail:
        out += b"\0" * (_align(len(out), t.align) - len(out))
        placed.append((t, len(out)))
        out += t.data

    # section headers: originals (renamed / repointed), then the new ones
    names = [rw.renames.get(s.name, s.name) for s in image.sections]
    new_alloc = list(rw.alloc)
    new_tail = [(t, off) for t, off in placed if t.name not in originals]
    for t, off in placed:
        if t.name in originals:
            replaced[t.name] = (off, len(t.data))
    all_names = names + [a.name for a in new_alloc] + [t.name for t, _ in new_tail]
    shstr = bytearray(b"\0")
    name_off: dict[str, int] = {}
    for n in all_names:
        if n not in name_off:
            name_off[n] = len(shstr) if n else 0
            if n:
                shstr += n.encode() + b"\0"
    index_of: dict[str, int] = {}
    for i, n in enumerate(all_names):
        index_of.setdefault(n, i)
    shstrndx = _shstrndx(image)
    out += b"\0" * (_align(len(out), 8) - len(out))
    shstr_off = len(out)
    out += shstr

    headers: list[bytes] = []
    for sec, n in zip(image.sections, names, strict=True):
        off, size, info = sec.offset, sec.size, sec.info
        if sec.name in replaced:
            off, size = replaced[sec.name]
            t = next(t for t, _ in placed if t.name == sec.name)
            info = t.info if t.info else sec.info
        if sec.index == shstrndx:
            off, size = shstr_off, len(shstr)
        headers.append(_SHDR.pack(name_off[n], sec.type, sec.flags, sec.addr, off, size,
                                  sec.link, info, sec.addralign, sec.entsize))
    for a in new_alloc:
        headers.append(_SHDR.pack(name_off[a.name], a.type, a.flags | SHF_ALLOC, a.vaddr,
                                  lay.offset_of(a.vaddr), len(a.data), 0, 0, a.align, 0))
    for t, off in new_tail:
        link = index_of.get(t.link_name, 0) if t.link_name else 0
        headers.append(_SHDR.pack(name_off[t.name], t.type, 0, 0, off, len(t.data), link,
                                  t.info, t.align, t.entsize))
    out += b"\0" * (_align(len(out), 8) - len(out))
    shoff = len(out)
    out += b"".join(headers)

    # the ELF header: program and section header tables moved, counts grown
    e_phnum = len(phdrs)
    e_shnum = len(headers)
    if e_phnum >= 0xFFFF or e_shnum >= 0xFF00:
        raise UnsupportedError("too many program or section headers for the ELF header")
    struct.pack_into("<Q", out, 0x20, lay.offset)  # e_phoff
    struct.pack_into("<Q", out, 0x28, shoff)  # e_shoff
    struct.pack_into("<H", out, 0x38, e_phnum)
    struct.pack_into("<H", out, 0x3C, e_shnum)
    struct.pack_into("<H", out, 0x3E, shstrndx)
    return bytes(out)


def _shstrndx(image: ElfImage) -> int:
    (ndx,) = struct.unpack_from("<H", image.data, 0x3E)
    if ndx == 0xFFFF or struct.unpack_from("<H", image.data, 0x3C)[0] == 0:
        raise UnsupportedError("extended section numbering is not supported by the writer")
    return int(ndx)

