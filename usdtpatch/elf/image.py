"""ELF headers, program headers and section headers, parsed with `struct`.

Reference: the System V gABI, "Object Files" chapter (ELF header, section header table,
program header table), including extended numbering (e_shnum == 0 / e_shstrndx == SHN_XINDEX
take their real values from section header 0). Both ELFCLASS32 and ELFCLASS64 and both byte
orders are read; what later stages accept is their business.

Every read is bounds-checked: a malformed header raises ElfFormatError naming the field, the
value found and what was expected.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from usdtpatch.elf.notes import build_id
from usdtpatch.errors import ElfFormatError

ELFCLASS32 = 1
ELFCLASS64 = 2
ELFDATA2LSB = 1
ELFDATA2MSB = 2

ET_REL = 1
ET_EXEC = 2
ET_DYN = 3

PT_LOAD = 1
PT_DYNAMIC = 2
PT_INTERP = 3
PT_NOTE = 4
PT_PHDR = 6
PT_GNU_EH_FRAME = 0x6474E550
PT_GNU_STACK = 0x6474E551
PT_GNU_RELRO = 0x6474E552

PF_X = 1
PF_W = 2
PF_R = 4

SHT_NULL = 0
SHT_PROGBITS = 1
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_NOTE = 7
SHT_NOBITS = 8
SHT_REL = 9
SHT_RELA = 4
SHT_DYNSYM = 11

SHF_WRITE = 0x1
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4
SHF_COMPRESSED = 0x800

SHN_UNDEF = 0
SHN_XINDEX = 0xFFFF

EM_386 = 3
EM_X86_64 = 62

MACHINE_NAMES: dict[int, str] = {
    2: "sparc",
    3: "i386",
    8: "mips",
    20: "ppc",
    21: "ppc64",
    22: "s390",
    40: "arm",
    43: "sparcv9",
    62: "x86-64",
    183: "aarch64",
    243: "riscv",
    258: "loongarch",
}

_IDENT_SIZE = 16

# The bytes of a whole file: read into memory, or mapped read-only (usdtpatch.io.map_input).
# Both slice to bytes, search with find() and unpack with struct.
FileBytes = bytes | mmap.mmap


@dataclass(frozen=True, slots=True)
class Segment:
    """One program header (Elf{32,64}_Phdr)."""

    index: int
    type: int
    flags: int
    offset: int
    vaddr: int
    paddr: int
    filesz: int
    memsz: int
    align: int

    def contains_vaddr(self, vaddr: int) -> bool:
        """True when `vaddr` lies in the part of the segment backed by the file."""
        return self.vaddr <= vaddr < self.vaddr + self.filesz


@dataclass(frozen=True, slots=True)
class Section:
    """One section header (Elf{32,64}_Shdr) with its name resolved."""

    index: int
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int

    @property
    def allocated(self) -> bool:
        return bool(self.flags & SHF_ALLOC)


@dataclass(frozen=True, slots=True)
class ElfImage:
    """A parsed ELF file. `data` is the whole file; everything else is derived from it."""

    data: FileBytes = field(repr=False)
    elfclass: int
    byteorder: str  # struct prefix: "<" or ">"
    osabi: int
    type: int
    machine: int
    entry: int
    phoff: int
    shoff: int
    segments: tuple[Segment, ...]
    sections: tuple[Section, ...]
    _loads: tuple[Segment, ...] = field(repr=False, compare=False)
    # what a reader derived from the bytes and keeps for the next one to ask, by the reader's
    # name (elf/cfi.py's index: a rewrite's check, plan and build each ask for it)
    derived: dict[str, object] = field(default_factory=dict, init=False, repr=False,
                                       compare=False)

    @property
    def is64(self) -> bool:
        return self.elfclass == ELFCLASS64

    @property
    def little_endian(self) -> bool:
        return self.byteorder == "<"

    @property
    def machine_name(self) -> str:
        return MACHINE_NAMES.get(self.machine, f"machine-{self.machine}")

    @property
    def word_size(self) -> int:
        return 8 if self.is64 else 4

    def section(self, name: str) -> Section | None:
        """The first section called `name`, or None."""
        for sec in self.sections:
            if sec.name == name:
                return sec
        return None

    @property
    def debug_only(self) -> bool:
        """Whether this is a separate debug file (`objcopy --only-keep-debug`, a distribution's
        -dbg or dbgsym file): every allocated section of code is SHT_NOBITS, so the file keeps
        the headers, the notes and the debugging information of a binary but not its code."""
        code = [s for s in self.sections if s.allocated and s.flags & SHF_EXECINSTR]
        return bool(code) and all(s.type == SHT_NOBITS for s in code)

    @property
    def build_id(self) -> str | None:
        """The hex id of `.note.gnu.build-id`, or None."""
        sec = self.section(".note.gnu.build-id")
        return None if sec is None or sec.type == SHT_NOBITS else \
            build_id(self.section_data(sec), self.byteorder)

    def section_data(self, sec: Section) -> bytes:
        """The file bytes of a section (empty for SHT_NOBITS)."""
        if sec.type == SHT_NOBITS:
            return b""
        end = sec.offset + sec.size
        if end > len(self.data):
            raise ElfFormatError(
                f"section {sec.name or sec.index} at file offset {sec.offset:#x} size "
                f"{sec.size:#x} ends at {end:#x}, past the end of the file ({len(self.data):#x})"
            )
        return self.data[sec.offset : end]

    def load_segment_for(self, vaddr: int) -> Segment | None:
        """The PT_LOAD whose file-backed part holds `vaddr`, or None."""
        # A handful of PT_LOADs at most; a linear scan also copes with overlapping hostile ones.
        for seg in self._loads:
            if seg.contains_vaddr(vaddr):
                return seg
        return None

    def vaddr_to_offset(self, vaddr: int) -> int | None:
        """File offset of a link-time virtual address, through the PT_LOAD segments."""
        seg = self.load_segment_for(vaddr)
        if seg is None:
            return None
        return seg.offset + (vaddr - seg.vaddr)

    def read_vaddr(self, vaddr: int, size: int) -> bytes:
        """Up to `size` file bytes at `vaddr`, stopping at the end of its segment's file part."""
        seg = self.load_segment_for(vaddr)
        if seg is None:
            return b""
        off = seg.offset + (vaddr - seg.vaddr)
        end = min(off + size, seg.offset + seg.filesz, len(self.data))
        return self.data[off:end] if off < end else b""

    def section_for_vaddr(self, vaddr: int) -> Section | None:
        """The allocated section whose address range holds `vaddr`, or None."""
        for sec in self.sections:
            if sec.allocated and sec.size and sec.addr <= vaddr < sec.addr + sec.size:
                return sec
        return None


def _unpack(fmt: str, data: FileBytes, offset: int, what: str) -> tuple[int, ...]:
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise ElfFormatError(
            f"{what} at file offset {offset:#x} needs {size} bytes but the file is "
            f"{len(data):#x} bytes long"
        )
    return struct.unpack_from(fmt, data, offset)


def parse_elf(data: FileBytes) -> ElfImage:
    """Parse the headers of an ELF file held in memory."""
    if len(data) < 4 or data[:4] != b"\x7fELF":
        if not data:
            raise ElfFormatError("not an ELF file: an empty file")
        raise ElfFormatError(f"not an ELF file: the magic is {data[:4].hex(' ')}, "
                             f"expected 7f 45 4c 46")
    if len(data) < _IDENT_SIZE:
        raise ElfFormatError(f"ELF identification truncated: {len(data)} of 16 bytes")
    elfclass, ei_data, ei_version, osabi = data[4], data[5], data[6], data[7]
    if elfclass not in (ELFCLASS32, ELFCLASS64):
        raise ElfFormatError(f"EI_CLASS is {elfclass}, expected 1 (ELF32) or 2 (ELF64)")
    if ei_data not in (ELFDATA2LSB, ELFDATA2MSB):
        raise ElfFormatError(f"EI_DATA is {ei_data}, expected 1 (LSB) or 2 (MSB)")
    if ei_version != 1:
        raise ElfFormatError(f"EI_VERSION is {ei_version}, expected 1")
    bo = "<" if ei_data == ELFDATA2LSB else ">"
    is64 = elfclass == ELFCLASS64
    ehdr_fmt = bo + ("HHIQQQIHHHHHH" if is64 else "HHIIIIIHHHHHH")
    (
        e_type,
        e_machine,
        _e_version,
        e_entry,
        e_phoff,
        e_shoff,
        _e_flags,
        _e_ehsize,
        e_phentsize,
        e_phnum,
        e_shentsize,
        e_shnum,
        e_shstrndx,
    ) = _unpack(ehdr_fmt, data, _IDENT_SIZE, "ELF header")

    segments = _parse_segments(data, bo, is64, e_phoff, e_phentsize, e_phnum)
    sections = _parse_sections(data, bo, is64, e_shoff, e_shentsize, e_shnum, e_shstrndx)
    loads = tuple(sorted((s for s in segments if s.type == PT_LOAD), key=lambda s: s.vaddr))
    return ElfImage(
        data=data,
        elfclass=elfclass,
        byteorder=bo,
        osabi=osabi,
        type=e_type,
        machine=e_machine,
        entry=e_entry,
        phoff=e_phoff,
        shoff=e_shoff,
        segments=segments,
        sections=sections,
        _loads=loads,
    )


def _parse_segments(
    data: FileBytes, bo: str, is64: bool, phoff: int, phentsize: int, phnum: int
) -> tuple[Segment, ...]:
    if phnum == 0:
        return ()
    fmt = bo + ("IIQQQQQQ" if is64 else "IIIIIIII")
    need = struct.calcsize(fmt)
    if phentsize < need:
        raise ElfFormatError(f"e_phentsize is {phentsize}, expected at least {need}")
    out: list[Segment] = []
    for i in range(phnum):
        vals = _unpack(fmt, data, phoff + i * phentsize, f"program header {i}")
        if is64:
            p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align = vals
        else:
            p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align = vals
        out.append(Segment(index=i, type=p_type, flags=p_flags, offset=p_offset, vaddr=p_vaddr,
                           paddr=p_paddr, filesz=p_filesz, memsz=p_memsz, align=p_align))
    return tuple(out)


def _parse_sections(
    data: FileBytes, bo: str, is64: bool, shoff: int, shentsize: int, shnum: int, shstrndx: int
) -> tuple[Section, ...]:
    if shoff == 0:
        return ()
    fmt = bo + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
    need = struct.calcsize(fmt)
    if shentsize < need:
        raise ElfFormatError(f"e_shentsize is {shentsize}, expected at least {need}")
    first = _unpack(fmt, data, shoff, "section header 0")
    if shnum == 0:  # extended numbering: the real count is in section 0's sh_size
        shnum = first[5]
    if shstrndx == SHN_XINDEX:
        shstrndx = first[6]
    if shoff + shnum * shentsize > len(data):
        raise ElfFormatError(
            f"section header table at {shoff:#x} with {shnum} entries of {shentsize} bytes "
            f"ends past the end of the file ({len(data):#x})"
        )
    raw = [struct.unpack_from(fmt, data, shoff + i * shentsize) for i in range(shnum)]
    names = b""
    if 0 < shstrndx < shnum:
        _n, s_type, _f, _a, s_off, s_size, *_rest = raw[shstrndx]
        if s_type != SHT_NOBITS:
            if s_off + s_size > len(data):
                raise ElfFormatError(
                    f"section name table (section {shstrndx}) at {s_off:#x} size {s_size:#x} "
                    f"ends past the end of the file ({len(data):#x})"
                )
            names = data[s_off : s_off + s_size]
    elif shstrndx >= shnum:
        raise ElfFormatError(f"e_shstrndx is {shstrndx}, but there are only {shnum} sections")
    out: list[Section] = []
    for i, (nm, typ, flags, addr, off, size, link, info, align, entsize) in enumerate(raw):
        out.append(Section(index=i, name=_cstr(names, nm), type=typ, flags=flags, addr=addr,
                           offset=off, size=size, link=link, info=info, addralign=align,
                           entsize=entsize))
    return tuple(out)


def _cstr(table: bytes, offset: int) -> str:
    """A NUL-terminated string from a string table; out-of-range offsets give ''."""
    if offset >= len(table):
        return ""
    end = table.find(b"\0", offset)
    if end < 0:
        end = len(table)
    return table[offset:end].decode("utf-8", "replace")


def named_extent(pread: Callable[[int, int], bytes], size: int) -> int:
    """How much of a file of `size` bytes its ELF structures name: the end of the last of
    the ELF header, the program and section header tables, each segment's file bytes and
    each section's (SHT_NOBITS aside), at most `size`. `pread(offset, length)` reads the
    file; only the header and the two tables are read here.

    For a large file (usdtpatch.io reads one of more than 256 MiB this way) the commands
    that only look at it read this much and no more: a small ELF followed by a 12 GB hole
    is read as the small ELF (issue 20, item 10). A file that is not ELF gives its first 64
    bytes, and a table that runs past the file's end is left out (parse_elf refuses both
    with its own sentence)."""
    head = pread(0, 64)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) \
            or head[5] not in (1, 2):
        return min(size, 64)
    bo = "<" if head[5] == ELFDATA2LSB else ">"
    is64 = head[4] == ELFCLASS64
    if is64 and len(head) < 64:
        return min(size, 64)
    fields = struct.unpack_from(bo + ("QQIHHHHHH" if is64 else "IIIHHHHHH"), head,
                                32 if is64 else 28)
    phoff, shoff, _flags, ehsize, phentsize, phnum, shentsize, shnum, _shstrndx = fields
    end = min(size, max(ehsize, 64 if is64 else 52))
    phdr = bo + ("IIQQQQQQ" if is64 else "IIIIIIII")
    shdr = bo + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
    if shoff and shentsize >= struct.calcsize(shdr) and shoff + shentsize <= size:
        first = struct.unpack_from(shdr, pread(shoff, struct.calcsize(shdr)))
        if shnum == 0:
            shnum = first[5]
        if phnum == 0xFFFF:
            phnum = first[7]
        table = shnum * shentsize
        if shoff + table <= size:
            end = max(end, shoff + table)
            raw = pread(shoff, table)
            for i in range(shnum):
                s = struct.unpack_from(shdr, raw, i * shentsize)
                if s[1] != SHT_NOBITS and s[4] + s[5] <= size:
                    end = max(end, s[4] + s[5])
    if phnum and phentsize >= struct.calcsize(phdr) and phoff + phnum * phentsize <= size:
        end = max(end, phoff + phnum * phentsize)
        raw = pread(phoff, phnum * phentsize)
        for i in range(phnum):
            p = struct.unpack_from(phdr, raw, i * phentsize)
            offset, filesz = (p[2], p[5]) if is64 else (p[1], p[4])
            if p[0] != 0 and offset + filesz <= size:
                end = max(end, offset + filesz)
    return int(end)
