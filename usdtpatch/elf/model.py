"""The model: one table of every ELF construct usdtpatch understands, and what each means.

A patch window is used only where everything that can reach or observe its bytes is modelled
(issue 30, "closed world"). This module is the one home of the facts: every relocation type
the loader applies, dynamic tag and flag bit, section type and flag, program header type,
note (owner, type), GNU property, CIE augmentation letter, call frame instruction, pointer
encoding and line-program opcode, each with its meaning:

- WAY_IN: a value that may land in code (a relocation whose value is an address, DT_INIT):
  usdtpatch.analysis.waysin reads it;
- FIXED_PLACE: said of every relocation the loader applies: where its place (r_offset and
  its width) lies in code, the loader writes those bytes, so they must not move or be copied
  (a text relocation; usdtpatch.analysis.windows refuses a window holding one);
- NEUTRAL: metadata, or a value that is never a code address (TLS offsets, sizes, version
  tables, hash tables, build ids);
- MODELLED: a construct another module of usdtpatch reads and acts on (named in the entry).

`unmodelled(image)` reports every construct a file uses that is not in the table, where it
is, and its scope: FILE_WIDE (no window anywhere in the file: its meaning could reach any
code) or LOCAL (only the windows of the function it describes). `loader_relocations(image)`
reads every relocation the loader applies, from every table (DT_RELA, DT_REL, DT_JMPREL,
DT_RELR and the allocated SHT_RELA/SHT_REL/SHT_RELR sections), once per file.

References: the System V gABI (ELF header, sections, segments, dynamic section, relocation;
SHT_RELR/DT_RELR, the gABI proposal adopted in 2022), the x86-64 psABI (relocation types,
program properties), the LSB Core specification (.eh_frame, DW_EH_PE_*, PT_GNU_*, notes),
glibc's elf/elf.h and sysdeps/x86_64/dl-machine.h (the relocation types ld.so applies),
DWARF 5 sections 6.2 (line programs) and 6.4 (call frame instructions).
"""

from __future__ import annotations

import struct
import sys
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import and_

from usdtpatch.elf.image import (
    PF_X,
    PT_DYNAMIC,
    PT_GNU_EH_FRAME,
    PT_GNU_RELRO,
    PT_GNU_STACK,
    PT_INTERP,
    PT_LOAD,
    PT_NOTE,
    PT_PHDR,
    SHF_ALLOC,
    SHF_COMPRESSED,
    SHF_EXECINSTR,
    SHF_WRITE,
    SHT_DYNSYM,
    SHT_NOBITS,
    SHT_NOTE,
    SHT_NULL,
    SHT_PROGBITS,
    SHT_REL,
    SHT_RELA,
    SHT_STRTAB,
    SHT_SYMTAB,
    ElfImage,
    Segment,
)

WAY_IN = "way-in"
FIXED_PLACE = "fixed-place"
NEUTRAL = "neutral"
MODELLED = "modelled"
FILE_WIDE = "file-wide"
LOCAL = "local"

# --- kinds of construct (usdtpatch.analysis.closed reports each under the finding code
# `unmodelled-<kind>`) ---------------------------------------------------------------------
RELOCATION = "relocation"
DYNAMIC = "dynamic-tag"
SECTION = "section-type"
SEGMENT = "segment-type"
NOTE = "note"
CFI = "cfi"
LSDA_ENCODING = "lsda-encoding"
LINE_OPCODE = "line-opcode"
KINDS = (RELOCATION, DYNAMIC, SECTION, SEGMENT, NOTE, CFI, LSDA_ENCODING, LINE_OPCODE)


@dataclass(frozen=True, slots=True)
class Construct:
    """One entry of the table: its name and what it means (WAY_IN, NEUTRAL, MODELLED...)."""

    name: str
    meaning: str
    note: str = ""


# --- relocation types (x86-64 psABI; those glibc's ld.so applies, dl-machine.h) ----------
# value: how the word stored at the place is computed ("relative": base + addend, a way in;
# "symbol": S + A, a way in when S is defined here; "ifunc": the resolver at base + addend
# is called, a way in; "tls", "size", "copy", "none": never a code address).


@dataclass(frozen=True, slots=True)
class RelocType:
    name: str
    width: int  # bytes the loader writes at the place
    value: str  # "relative", "symbol", "ifunc", "tls", "size", "copy", "none"

    @property
    def meaning(self) -> str:
        return WAY_IN if self.value in ("relative", "symbol", "ifunc") else NEUTRAL


R_X86_64_NONE = 0
R_X86_64_64 = 1
R_X86_64_PC32 = 2
R_X86_64_COPY = 5
R_X86_64_GLOB_DAT = 6
R_X86_64_JUMP_SLOT = 7
R_X86_64_RELATIVE = 8
R_X86_64_32 = 10
R_X86_64_DTPMOD64 = 16
R_X86_64_DTPOFF64 = 17
R_X86_64_TPOFF64 = 18
R_X86_64_SIZE32 = 32
R_X86_64_SIZE64 = 33
R_X86_64_TLSDESC = 36
R_X86_64_IRELATIVE = 37
RELOCATION_TYPES: dict[int, RelocType] = {
    R_X86_64_NONE: RelocType("R_X86_64_NONE", 0, "none"),
    R_X86_64_64: RelocType("R_X86_64_64", 8, "symbol"),
    R_X86_64_PC32: RelocType("R_X86_64_PC32", 4, "symbol"),
    R_X86_64_COPY: RelocType("R_X86_64_COPY", 0, "copy"),
    R_X86_64_GLOB_DAT: RelocType("R_X86_64_GLOB_DAT", 8, "symbol"),
    R_X86_64_JUMP_SLOT: RelocType("R_X86_64_JUMP_SLOT", 8, "symbol"),
    R_X86_64_RELATIVE: RelocType("R_X86_64_RELATIVE", 8, "relative"),
    R_X86_64_32: RelocType("R_X86_64_32", 4, "symbol"),
    R_X86_64_DTPMOD64: RelocType("R_X86_64_DTPMOD64", 8, "tls"),
    R_X86_64_DTPOFF64: RelocType("R_X86_64_DTPOFF64", 8, "tls"),
    R_X86_64_TPOFF64: RelocType("R_X86_64_TPOFF64", 8, "tls"),
    R_X86_64_SIZE32: RelocType("R_X86_64_SIZE32", 4, "size"),
    R_X86_64_SIZE64: RelocType("R_X86_64_SIZE64", 8, "size"),
    R_X86_64_TLSDESC: RelocType("R_X86_64_TLSDESC", 16, "tls"),
    R_X86_64_IRELATIVE: RelocType("R_X86_64_IRELATIVE", 8, "ifunc"),
}
# the types whose value is not S + A with a symbol (the symbol index is not read)
NO_SYMBOL_TYPES = frozenset({R_X86_64_NONE, R_X86_64_RELATIVE, R_X86_64_IRELATIVE})
RELR_NAME = "R_X86_64_RELATIVE (RELR)"  # a DT_RELR entry: base + the word at the place


def reloc_name(rtype: int) -> str:
    known = RELOCATION_TYPES.get(rtype)
    return known.name if known is not None else f"type {rtype}"


# --- dynamic tags (gABI; GNU and x86-64 extensions, glibc's elf.h) -----------------------
DT_NULL = 0
DT_NEEDED = 1
DT_PLTRELSZ = 2
DT_PLTGOT = 3
DT_HASH = 4
DT_STRTAB = 5
DT_SYMTAB = 6
DT_RELA = 7
DT_RELASZ = 8
DT_RELAENT = 9
DT_STRSZ = 10
DT_SYMENT = 11
DT_INIT = 12
DT_FINI = 13
DT_SONAME = 14
DT_RPATH = 15
DT_SYMBOLIC = 16
DT_REL = 17
DT_RELSZ = 18
DT_RELENT = 19
DT_PLTREL = 20
DT_DEBUG = 21
DT_TEXTREL = 22
DT_JMPREL = 23
DT_BIND_NOW = 24
DT_INIT_ARRAY = 25
DT_FINI_ARRAY = 26
DT_INIT_ARRAYSZ = 27
DT_FINI_ARRAYSZ = 28
DT_RUNPATH = 29
DT_FLAGS = 30
DT_PREINIT_ARRAY = 32
DT_PREINIT_ARRAYSZ = 33
DT_SYMTAB_SHNDX = 34
DT_RELRSZ = 35
DT_RELR = 36
DT_RELRENT = 37
DT_GNU_HASH = 0x6FFFFEF5
DT_VERSYM = 0x6FFFFFF0
DT_RELACOUNT = 0x6FFFFFF9
DT_RELCOUNT = 0x6FFFFFFA
DT_FLAGS_1 = 0x6FFFFFFB

_N, _M, _W = NEUTRAL, MODELLED, WAY_IN
DYNAMIC_TAGS: dict[int, Construct] = {
    DT_NULL: Construct("DT_NULL", _N),
    DT_NEEDED: Construct("DT_NEEDED", _M, "the fork guard's exposure (guardfile)"),
    DT_PLTRELSZ: Construct("DT_PLTRELSZ", _M, "DT_JMPREL's size"),
    DT_PLTGOT: Construct("DT_PLTGOT", _N),
    DT_HASH: Construct("DT_HASH", _M, "the writer keeps it"),
    DT_STRTAB: Construct("DT_STRTAB", _N),
    DT_SYMTAB: Construct("DT_SYMTAB", _N),
    DT_RELA: Construct("DT_RELA", _M, "a loader relocation table"),
    DT_RELASZ: Construct("DT_RELASZ", _M),
    DT_RELAENT: Construct("DT_RELAENT", _N),
    DT_STRSZ: Construct("DT_STRSZ", _N),
    DT_SYMENT: Construct("DT_SYMENT", _N),
    DT_INIT: Construct("DT_INIT", _W, "a function the loader calls"),
    DT_FINI: Construct("DT_FINI", _W, "a function the loader calls"),
    DT_SONAME: Construct("DT_SONAME", _N),
    DT_RPATH: Construct("DT_RPATH", _N),
    DT_SYMBOLIC: Construct("DT_SYMBOLIC", _N),
    DT_REL: Construct("DT_REL", _M, "a loader relocation table (implicit addends)"),
    DT_RELSZ: Construct("DT_RELSZ", _M),
    DT_RELENT: Construct("DT_RELENT", _N),
    DT_PLTREL: Construct("DT_PLTREL", _M, "DT_JMPREL's entry kind"),
    DT_DEBUG: Construct("DT_DEBUG", _N),
    DT_TEXTREL: Construct("DT_TEXTREL", _M, "relocations place in code: fixed places"),
    DT_JMPREL: Construct("DT_JMPREL", _M, "a loader relocation table"),
    DT_BIND_NOW: Construct("DT_BIND_NOW", _N),
    DT_INIT_ARRAY: Construct("DT_INIT_ARRAY", _N, "its words are relocations or data words"),
    DT_FINI_ARRAY: Construct("DT_FINI_ARRAY", _N, "its words are relocations or data words"),
    DT_INIT_ARRAYSZ: Construct("DT_INIT_ARRAYSZ", _N),
    DT_FINI_ARRAYSZ: Construct("DT_FINI_ARRAYSZ", _N),
    DT_RUNPATH: Construct("DT_RUNPATH", _N),
    DT_FLAGS: Construct("DT_FLAGS", _M, "its bits are in DF_FLAGS"),
    DT_PREINIT_ARRAY: Construct("DT_PREINIT_ARRAY", _N, "its words are relocations"),
    DT_PREINIT_ARRAYSZ: Construct("DT_PREINIT_ARRAYSZ", _N),
    DT_SYMTAB_SHNDX: Construct("DT_SYMTAB_SHNDX", _N),
    DT_RELRSZ: Construct("DT_RELRSZ", _M),
    DT_RELR: Construct("DT_RELR", _M, "a loader relocation table (packed relative)"),
    DT_RELRENT: Construct("DT_RELRENT", _N),
    0x6FFFFDF4: Construct("DT_GNU_FLAGS_1", _N, "DF_GNU_1_UNIQUE: how the loader shares it"),
    0x6FFFFDF5: Construct("DT_GNU_PRELINKED", _N),
    0x6FFFFDF6: Construct("DT_GNU_CONFLICTSZ", _N),
    0x6FFFFDF7: Construct("DT_GNU_LIBLISTSZ", _N),
    0x6FFFFDF8: Construct("DT_CHECKSUM", _N),
    0x6FFFFDF9: Construct("DT_PLTPADSZ", _N),
    0x6FFFFDFA: Construct("DT_MOVEENT", _N),
    0x6FFFFDFB: Construct("DT_MOVESZ", _N),
    0x6FFFFDFC: Construct("DT_FEATURE_1", _N),
    0x6FFFFDFD: Construct("DT_POSFLAG_1", _N),
    0x6FFFFDFE: Construct("DT_SYMINSZ", _N),
    0x6FFFFDFF: Construct("DT_SYMINENT", _N),
    DT_GNU_HASH: Construct("DT_GNU_HASH", _M, "the writer keeps it"),
    0x6FFFFEF6: Construct("DT_TLSDESC_PLT", _N, "the PLT's TLS descriptor stub (a function)"),
    0x6FFFFEF7: Construct("DT_TLSDESC_GOT", _N),
    0x6FFFFEF8: Construct("DT_GNU_CONFLICT", _N),
    0x6FFFFEF9: Construct("DT_GNU_LIBLIST", _N),
    0x6FFFFEFA: Construct("DT_CONFIG", _N),
    0x6FFFFEFB: Construct("DT_DEPAUDIT", _N),
    0x6FFFFEFC: Construct("DT_AUDIT", _N),
    0x6FFFFEFD: Construct("DT_PLTPAD", _N),
    0x6FFFFEFE: Construct("DT_MOVETAB", _N),
    0x6FFFFEFF: Construct("DT_SYMINFO", _N),
    DT_VERSYM: Construct("DT_VERSYM", _N),
    DT_RELACOUNT: Construct("DT_RELACOUNT", _N),
    DT_RELCOUNT: Construct("DT_RELCOUNT", _N),
    DT_FLAGS_1: Construct("DT_FLAGS_1", _M, "its bits are in DF_1_FLAGS"),
    0x6FFFFFFC: Construct("DT_VERDEF", _N),
    0x6FFFFFFD: Construct("DT_VERDEFNUM", _N),
    0x6FFFFFFE: Construct("DT_VERNEED", _N),
    0x6FFFFFFF: Construct("DT_VERNEEDNUM", _N),
    0x70000000: Construct("DT_X86_64_PLT", _N, "where the PLT is (lld -z ibtplt)"),
    0x70000001: Construct("DT_X86_64_PLTSZ", _N),
    0x70000003: Construct("DT_X86_64_PLTENT", _N),
    0x7FFFFFFD: Construct("DT_AUXILIARY", _N),
    0x7FFFFFFE: Construct("DT_USED", _N),
    0x7FFFFFFF: Construct("DT_FILTER", _N),
}
# the tags whose value is a code address the loader calls
CODE_ADDRESS_TAGS = frozenset(t for t, c in DYNAMIC_TAGS.items() if c.meaning == WAY_IN)

DF_TEXTREL = 0x4
DF_FLAGS: dict[int, str] = {0x1: "DF_ORIGIN", 0x2: "DF_SYMBOLIC", DF_TEXTREL: "DF_TEXTREL",
                            0x8: "DF_BIND_NOW", 0x10: "DF_STATIC_TLS"}
DF_1_PIE = 0x08000000
DF_1_FLAGS: dict[int, str] = {
    0x1: "DF_1_NOW", 0x2: "DF_1_GLOBAL", 0x4: "DF_1_GROUP", 0x8: "DF_1_NODELETE",
    0x10: "DF_1_LOADFLTR", 0x20: "DF_1_INITFIRST", 0x40: "DF_1_NOOPEN", 0x80: "DF_1_ORIGIN",
    0x100: "DF_1_DIRECT", 0x200: "DF_1_TRANS", 0x400: "DF_1_INTERPOSE",
    0x800: "DF_1_NODEFLIB", 0x1000: "DF_1_NODUMP", 0x2000: "DF_1_CONFALT",
    0x4000: "DF_1_ENDFILTEE", 0x8000: "DF_1_DISPRELDNE", 0x10000: "DF_1_DISPRELPND",
    0x20000: "DF_1_NODIRECT", 0x40000: "DF_1_IGNMULDEF", 0x80000: "DF_1_NOKSYMS",
    0x100000: "DF_1_NOHDR", 0x200000: "DF_1_EDITED", 0x400000: "DF_1_NORELOC",
    0x800000: "DF_1_SYMINTPOSE", 0x1000000: "DF_1_GLOBAUDIT", 0x2000000: "DF_1_SINGLETON",
    0x4000000: "DF_1_STUB", DF_1_PIE: "DF_1_PIE", 0x10000000: "DF_1_KMOD",
    0x20000000: "DF_1_WEAKFILTER", 0x40000000: "DF_1_NOCOMMON",
}
FLAG_BITS: dict[int, dict[int, str]] = {DT_FLAGS: DF_FLAGS, DT_FLAGS_1: DF_1_FLAGS}

# --- section types and flags --------------------------------------------------------------
# (the section and segment types every reader needs are elf/image.py's; the others here)
SHT_HASH = 5
SHT_DYNAMIC = 6
SHT_RELR = 19
SHT_GNU_HASH = 0x6FFFFFF6
SECTION_TYPES: dict[int, Construct] = {
    SHT_NULL: Construct("SHT_NULL", _N),
    SHT_PROGBITS: Construct("SHT_PROGBITS", _M, "code (SHF_EXECINSTR) or data words"),
    SHT_SYMTAB: Construct("SHT_SYMTAB", _M, "function symbols"),
    SHT_STRTAB: Construct("SHT_STRTAB", _N),
    SHT_RELA: Construct("SHT_RELA", _M, "a relocation table (the loader's when allocated)"),
    SHT_HASH: Construct("SHT_HASH", _N),
    SHT_DYNAMIC: Construct("SHT_DYNAMIC", _M, "the dynamic tags"),
    SHT_NOTE: Construct("SHT_NOTE", _M, "its notes are in NOTES"),
    SHT_NOBITS: Construct("SHT_NOBITS", _N),
    SHT_REL: Construct("SHT_REL", _M, "a relocation table (implicit addends)"),
    10: Construct("SHT_SHLIB", _N),
    SHT_DYNSYM: Construct("SHT_DYNSYM", _M, "function symbols"),
    14: Construct("SHT_INIT_ARRAY", _N, "its words are relocations or data words"),
    15: Construct("SHT_FINI_ARRAY", _N, "its words are relocations or data words"),
    16: Construct("SHT_PREINIT_ARRAY", _N, "its words are relocations or data words"),
    17: Construct("SHT_GROUP", _N),
    18: Construct("SHT_SYMTAB_SHNDX", _N),
    SHT_RELR: Construct("SHT_RELR", _M, "a packed relative relocation table"),
    0x6FFF4C00: Construct("SHT_LLVM_ODRTAB", _N),
    0x6FFF4C01: Construct("SHT_LLVM_LINKER_OPTIONS", _N),
    0x6FFF4C03: Construct("SHT_LLVM_ADDRSIG", _N),
    0x6FFF4C04: Construct("SHT_LLVM_DEPENDENT_LIBRARIES", _N),
    0x6FFF4C09: Construct("SHT_LLVM_CALL_GRAPH_PROFILE", _N),
    0x6FFFFFF5: Construct("SHT_GNU_ATTRIBUTES", _N),
    SHT_GNU_HASH: Construct("SHT_GNU_HASH", _N),
    0x6FFFFFF7: Construct("SHT_GNU_LIBLIST", _N),
    0x6FFFFFF8: Construct("SHT_CHECKSUM", _N),
    0x6FFFFFFD: Construct("SHT_GNU_verdef", _N),
    0x6FFFFFFE: Construct("SHT_GNU_verneed", _N),
    0x6FFFFFFF: Construct("SHT_GNU_versym", _N),
    0x70000001: Construct("SHT_X86_64_UNWIND", _N, "not read by the x86-64 Linux unwinders"),
}
SECTION_FLAGS: dict[int, str] = {
    SHF_WRITE: "SHF_WRITE", SHF_ALLOC: "SHF_ALLOC", SHF_EXECINSTR: "SHF_EXECINSTR",
    0x10: "SHF_MERGE", 0x20: "SHF_STRINGS", 0x40: "SHF_INFO_LINK", 0x80: "SHF_LINK_ORDER",
    0x100: "SHF_OS_NONCONFORMING", 0x200: "SHF_GROUP", 0x400: "SHF_TLS",
    SHF_COMPRESSED: "SHF_COMPRESSED", 0x200000: "SHF_GNU_RETAIN", 0x10000000: "SHF_X86_64_LARGE",
    0x80000000: "SHF_EXCLUDE",
}

# --- program header types -----------------------------------------------------------------
PT_TLS = 7
PT_GNU_PROPERTY = 0x6474E553
SEGMENT_TYPES: dict[int, Construct] = {
    0: Construct("PT_NULL", _N),
    PT_LOAD: Construct("PT_LOAD", _M, "the file's mapping"),
    PT_DYNAMIC: Construct("PT_DYNAMIC", _M, "the dynamic tags"),
    PT_INTERP: Construct("PT_INTERP", _N),
    PT_NOTE: Construct("PT_NOTE", _M, "its notes are in NOTES"),
    5: Construct("PT_SHLIB", _N),
    PT_PHDR: Construct("PT_PHDR", _N),
    PT_TLS: Construct("PT_TLS", _N),
    PT_GNU_EH_FRAME: Construct("PT_GNU_EH_FRAME", _M, "the unwinder's index (elf/cfi.py)"),
    PT_GNU_STACK: Construct("PT_GNU_STACK", _N),
    PT_GNU_RELRO: Construct("PT_GNU_RELRO", _N),
    PT_GNU_PROPERTY: Construct("PT_GNU_PROPERTY", _M, "its properties are in GNU_PROPERTIES"),
}

# --- notes, by (owner, type) --------------------------------------------------------------
NT_GNU_PROPERTY_TYPE_0 = 5
NOTES: dict[tuple[bytes, int], Construct] = {
    (b"GNU", 1): Construct("NT_GNU_ABI_TAG", _N),
    (b"GNU", 2): Construct("NT_GNU_HWCAP", _N),
    (b"GNU", 3): Construct("NT_GNU_BUILD_ID", _N),
    (b"GNU", 4): Construct("NT_GNU_GOLD_VERSION", _N),
    (b"GNU", NT_GNU_PROPERTY_TYPE_0): Construct("NT_GNU_PROPERTY_TYPE_0", _M,
                                                "its properties are in GNU_PROPERTIES"),
    (b"stapsdt", 3): Construct("NT_STAPSDT", _M, "a probe (elf/notes.py)"),
    (b"FDO", 0xCAFE1A7E): Construct("NT_FDO_PACKAGING_METADATA", _N),
    (b"Go", 1): Construct("NT_GO_PKGLIST", _N),
    (b"Go", 2): Construct("NT_GO_ABIHASH", _N),
    (b"Go", 3): Construct("NT_GO_DEPS", _N),
    (b"Go", 4): Construct("NT_GO_BUILDID", _N),
    (b"usdtpatch", 1): Construct("usdtpatch's restore marker", _M,
                                 "elf/marker.py: SHT_NOTE in files rewritten before issue 33, "
                                 "SHT_PROGBITS since (out of readelf -n)"),
}
# annobin's build notes (.gnu.build.attributes): owner "GA$<version>...", types OPEN, FUNC
ANNOBIN_OWNER = b"GA"  # then "$", "*", "+" or "!" and the attribute
ANNOBIN_TYPES = frozenset({0x100, 0x101})

GNU_PROPERTY_X86_FEATURE_1_AND = 0xC0000002
GNU_PROPERTY_X86_FEATURE_1_IBT = 0x1
GNU_PROPERTY_X86_FEATURE_1_SHSTK = 0x2
GNU_PROPERTIES: dict[int, Construct] = {
    1: Construct("GNU_PROPERTY_STACK_SIZE", _N),
    2: Construct("GNU_PROPERTY_NO_COPY_ON_PROTECTED", _N),
    0xB0008000: Construct("GNU_PROPERTY_1_NEEDED", _N),
    GNU_PROPERTY_X86_FEATURE_1_AND: Construct(
        "GNU_PROPERTY_X86_FEATURE_1_AND", _M, "SHSTK: no emulated call (analysis/calls.py); "
        "IBT: not enforced for user space by Linux"),
    0xC0008001: Construct("GNU_PROPERTY_X86_FEATURE_2_NEEDED", _N),
    0xC0008002: Construct("GNU_PROPERTY_X86_ISA_1_NEEDED", _N),
    0xC0010001: Construct("GNU_PROPERTY_X86_FEATURE_2_USED", _N),
    0xC0010002: Construct("GNU_PROPERTY_X86_ISA_1_USED", _N),
}
X86_FEATURE_1: dict[int, str] = {GNU_PROPERTY_X86_FEATURE_1_IBT: "IBT",
                                 GNU_PROPERTY_X86_FEATURE_1_SHSTK: "SHSTK",
                                 0x4: "LAM_U48", 0x8: "LAM_U57"}

# --- call frame information ---------------------------------------------------------------
# CIE augmentation letters (LSB Core; "S" a signal frame, "B"/"G" AArch64's, harmless here)
CIE_AUGMENTATIONS: dict[str, str] = {
    "z": "augmentation data length", "P": "personality routine", "L": "LSDA encoding",
    "R": "FDE pointer encoding", "S": "signal frame", "B": "AArch64 BTI keys",
    "G": "MTE tagged frame",
}
# call frame instructions by opcode (the low 6 bits of 0x40/0x80/0xc0 are operands)
CFA_OPCODES: dict[int, str] = {
    0x00: "DW_CFA_nop", 0x01: "DW_CFA_set_loc", 0x02: "DW_CFA_advance_loc1",
    0x03: "DW_CFA_advance_loc2", 0x04: "DW_CFA_advance_loc4",
    0x05: "DW_CFA_offset_extended", 0x06: "DW_CFA_restore_extended",
    0x07: "DW_CFA_undefined", 0x08: "DW_CFA_same_value", 0x09: "DW_CFA_register",
    0x0A: "DW_CFA_remember_state", 0x0B: "DW_CFA_restore_state", 0x0C: "DW_CFA_def_cfa",
    0x0D: "DW_CFA_def_cfa_register", 0x0E: "DW_CFA_def_cfa_offset",
    0x0F: "DW_CFA_def_cfa_expression", 0x10: "DW_CFA_expression",
    0x11: "DW_CFA_offset_extended_sf", 0x12: "DW_CFA_def_cfa_sf",
    0x13: "DW_CFA_def_cfa_offset_sf", 0x14: "DW_CFA_val_offset",
    0x15: "DW_CFA_val_offset_sf", 0x16: "DW_CFA_val_expression",
    0x2E: "DW_CFA_GNU_args_size", 0x2F: "DW_CFA_GNU_negative_offset_extended",
    0x40: "DW_CFA_advance_loc", 0x80: "DW_CFA_offset", 0xC0: "DW_CFA_restore",
}
# operands of each: "u" uleb128, "s" sleb128, "1"/"2"/"4"/"8" fixed bytes, "b" a block
# (uleb128 length then bytes), "a" a target address (the file's word)
CFA_OPERANDS: dict[int, str] = {
    0x00: "", 0x01: "a", 0x02: "1", 0x03: "2", 0x04: "4", 0x05: "uu", 0x06: "u",
    0x07: "u", 0x08: "u", 0x09: "uu", 0x0A: "", 0x0B: "", 0x0C: "uu", 0x0D: "u",
    0x0E: "u", 0x0F: "b", 0x10: "ub", 0x11: "us", 0x12: "us", 0x13: "s", 0x14: "uu",
    0x15: "us", 0x16: "ub", 0x2E: "u", 0x2F: "uu", 0x40: "", 0x80: "u", 0xC0: "",
}

# DW_EH_PE_* pointer encodings (LSB Core, tables 10-5 and 10-6): value formats, applications
# (elf/cfi.py reads them, elf/ehframe.py writes them)
DW_EH_PE_absptr = 0x00
DW_EH_PE_uleb128 = 0x01
DW_EH_PE_udata2 = 0x02
DW_EH_PE_udata4 = 0x03
DW_EH_PE_udata8 = 0x04
DW_EH_PE_sleb128 = 0x09
DW_EH_PE_sdata2 = 0x0A
DW_EH_PE_sdata4 = 0x0B
DW_EH_PE_sdata8 = 0x0C
DW_EH_PE_pcrel = 0x10
DW_EH_PE_textrel = 0x20
DW_EH_PE_datarel = 0x30
DW_EH_PE_funcrel = 0x40
DW_EH_PE_indirect = 0x80
DW_EH_PE_omit = 0xFF
EH_PE_FORMATS: dict[int, str] = {
    DW_EH_PE_absptr: "absptr", DW_EH_PE_uleb128: "uleb128", DW_EH_PE_udata2: "udata2",
    DW_EH_PE_udata4: "udata4", DW_EH_PE_udata8: "udata8", DW_EH_PE_sleb128: "sleb128",
    DW_EH_PE_sdata2: "sdata2", DW_EH_PE_sdata4: "sdata4", DW_EH_PE_sdata8: "sdata8"}
EH_PE_APPLICATIONS: dict[int, str] = {0x00: "", DW_EH_PE_pcrel: "pcrel",
                                      DW_EH_PE_textrel: "textrel",
                                      DW_EH_PE_datarel: "datarel",
                                      DW_EH_PE_funcrel: "funcrel"}
FIXED_SIZES = {0x00: 8, 0x02: 2, 0x03: 4, 0x04: 8, 0x0A: 2, 0x0B: 4, 0x0C: 8}


def encoding_known(enc: int) -> bool:
    """Whether a DW_EH_PE_* byte is modelled: omit, or a known format and application (the
    indirect bit allowed)."""
    return enc == DW_EH_PE_omit or (enc & 0x0F in EH_PE_FORMATS
                                    and enc & 0x70 in EH_PE_APPLICATIONS)


# --- DWARF line-program opcodes (DWARF 5, 6.2.5) -------------------------------------------
LINE_STANDARD_OPCODES: dict[int, str] = {
    1: "DW_LNS_copy", 2: "DW_LNS_advance_pc", 3: "DW_LNS_advance_line",
    4: "DW_LNS_set_file", 5: "DW_LNS_set_column", 6: "DW_LNS_negate_stmt",
    7: "DW_LNS_set_basic_block", 8: "DW_LNS_const_add_pc", 9: "DW_LNS_fixed_advance_pc",
    10: "DW_LNS_set_prologue_end", 11: "DW_LNS_set_epilogue_begin", 12: "DW_LNS_set_isa",
}
LINE_EXTENDED_OPCODES: dict[int, str] = {
    1: "DW_LNE_end_sequence", 2: "DW_LNE_set_address", 3: "DW_LNE_define_file",
    4: "DW_LNE_set_discriminator",
}


# --- reading ------------------------------------------------------------------------------


def dynamic_segment(image: ElfImage) -> Segment | None:
    """The PT_DYNAMIC segment, if any."""
    return next((s for s in image.segments if s.type == PT_DYNAMIC), None)


def dynamic_entries(image: ElfImage) -> list[tuple[int, int, int]]:
    """(tag, value, file offset of the entry) of PT_DYNAMIC (ELF64), up to DT_NULL."""
    seg = dynamic_segment(image)
    if seg is None or not image.is64:
        return []
    out = []
    fmt = image.byteorder + "qQ"
    end = min(seg.offset + seg.filesz, len(image.data))
    for off in range(seg.offset, end - 15, 16):
        tag, val = struct.unpack_from(fmt, image.data, off)
        if tag == DT_NULL:
            break
        out.append((tag, val, off))
    return out


def spare_dynamic_slots(image: ElfImage) -> tuple[int, int]:
    """(file offset of the first DT_NULL entry of PT_DYNAMIC, how many entries from it on may
    be given a tag with one DT_NULL still ending the section): room for added entries."""
    seg = dynamic_segment(image)
    if seg is None or not image.is64:
        return 0, 0
    first = seg.offset + 16 * len(dynamic_entries(image))
    end = min(seg.offset + seg.filesz, len(image.data))
    return first, max(0, (end - first) // 16 - 1)


@dataclass(frozen=True, slots=True)
class RelocTable:
    """A table the loader applies: "rela" (Elf64_Rela), "rel" (Elf64_Rel, the addend is
    the word at the place) or "relr" (packed relative: base + the word at the place)."""

    kind: str
    name: str  # the section's name, or the dynamic tag's
    offset: int  # file offset
    size: int
    symtab: int  # section index of its symbol table (0: none known)


_ENTRY = {"rela": 24, "rel": 16, "relr": 8}


def loader_tables(image: ElfImage) -> list[RelocTable]:
    """Every relocation table the loader (ld.so, or a static program's start-up code)
    applies: the allocated SHT_RELA, SHT_REL and SHT_RELR sections, and the DT_RELA, DT_REL,
    DT_JMPREL and DT_RELR tables the dynamic section names (a file without section headers
    has only these); each byte range once."""
    if not image.is64:
        return []
    got = image.derived.get("model_tables")
    if isinstance(got, list):
        return got
    dynsym = next((s.index for s in image.sections if s.type == SHT_DYNSYM), 0)
    cands: list[RelocTable] = []
    kinds = {SHT_RELA: "rela", SHT_REL: "rel", SHT_RELR: "relr"}
    for sec in image.sections:
        kind = kinds.get(sec.type)
        if kind is not None and sec.allocated and sec.size and \
                0 <= sec.offset <= sec.offset + sec.size <= len(image.data):
            cands.append(RelocTable(kind=kind, name=sec.name or f"section {sec.index}",
                                    offset=sec.offset, size=sec.size, symtab=sec.link))
    dyn = {t: v for t, v, _o in dynamic_entries(image)}
    pltrel = "rel" if dyn.get(DT_PLTREL) == DT_REL else "rela"
    for at, size, kind, name in ((DT_RELA, DT_RELASZ, "rela", "DT_RELA"),
                                 (DT_REL, DT_RELSZ, "rel", "DT_REL"),
                                 (DT_JMPREL, DT_PLTRELSZ, pltrel, "DT_JMPREL"),
                                 (DT_RELR, DT_RELRSZ, "relr", "DT_RELR")):
        if at not in dyn or not dyn.get(size):
            continue
        off = image.vaddr_to_offset(dyn[at])
        if off is None:
            continue
        n = max(0, min(dyn[size], len(image.data) - off))
        cands.append(RelocTable(kind=kind, name=name, offset=off, size=n, symtab=dynsym))
    out: list[RelocTable] = []
    for t in sorted(cands, key=lambda t: (t.offset, -t.size)):
        prev = out[-1] if out else None
        if prev is not None and prev.kind == t.kind and t.offset < prev.offset + prev.size:
            if t.offset + t.size > prev.offset + prev.size:  # overlapping: one range
                out[-1] = RelocTable(kind=prev.kind, name=prev.name, offset=prev.offset,
                                     size=t.offset + t.size - prev.offset,
                                     symtab=prev.symtab or t.symtab)
            continue
        out.append(t)
    image.derived["model_tables"] = out
    return out


@dataclass(slots=True)
class Relocations:
    """Every relocation the loader applies, by column (one list each, table order within a
    table): the place (link-time r_offset), the type, the addend (explicit, or the word at
    the place for REL and RELR), the symbol index and the table's index in `tables`."""

    tables: list[RelocTable]
    places: list[int] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    addends: list[int] = field(default_factory=list)
    symbols: list[int] = field(default_factory=list)
    table: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.places)

    def width(self, i: int) -> int:
        if self.types[i] < 0:  # RELR
            return 8
        known = RELOCATION_TYPES.get(self.types[i])
        return known.width if known is not None else 8

    def name(self, i: int) -> str:
        return RELR_NAME if self.types[i] < 0 else reloc_name(self.types[i])


RELR = -1  # the type column's value for a DT_RELR entry


def loader_relocations(image: ElfImage) -> Relocations:
    """Every relocation of `loader_tables` (read once per file)."""
    got = image.derived.get("model_relocations")
    if isinstance(got, Relocations):
        return got
    out = Relocations(loader_tables(image))
    native = image.little_endian and sys.byteorder == "little"
    for k, t in enumerate(out.tables):
        size = t.size - t.size % _ENTRY[t.kind]
        raw = memoryview(image.data)[t.offset:t.offset + size]
        if t.kind == "relr":
            places = _relr_places(raw, image.byteorder, _words_in_loads(image))
            out.places.extend(places)
            out.types.extend(repeat(RELR, len(places)))
            out.addends.extend(_words_at(image, places, 8))
            out.symbols.extend(repeat(0, len(places)))
            out.table.extend(repeat(k, len(places)))
            continue
        step = 3 if t.kind == "rela" else 2
        if native:
            words = raw.cast("Q")
            places = words[0::step].tolist()
            infos = words[1::step].tolist()
        else:
            rows = list(struct.iter_unpack(image.byteorder + "Q" * step, raw))
            places = [r[0] for r in rows]
            infos = [r[1] for r in rows]
        types = list(map(and_, infos, repeat(0xFFFFFFFF)))
        if t.kind == "rela":
            addends = raw.cast("q")[2::3].tolist() if native else \
                [r[2] - (1 << 64 if r[2] >> 63 else 0) for r in rows]
        else:
            addends = [_implicit(image, p, RELOCATION_TYPES.get(ty)) for p, ty
                       in zip(places, types, strict=True)]
        out.places.extend(places)
        out.types.extend(types)
        out.addends.extend(addends)
        out.symbols.extend(i >> 32 for i in infos)
        out.table.extend(repeat(k, len(places)))
    image.derived["model_relocations"] = out
    return out


def _words_in_loads(image: ElfImage) -> int:
    """How many 8-byte words the PT_LOADs span: no table names more distinct places."""
    return sum(s.memsz for s in image.segments if s.type == PT_LOAD) // 8 + 1


def _relr_places(raw: memoryview, byteorder: str, limit: int) -> list[int]:
    """The places a DT_RELR table encodes: an even entry is a place (the next base is 8
    bytes on); an odd one a bitmap of the 63 words from the base (bit i: base + 8 (i - 1)),
    the base then 63 words on. At most `limit` places (a damaged table names more)."""
    out: list[int] = []
    base = 0
    for (e,) in struct.iter_unpack(byteorder + "Q", raw):
        if len(out) > limit:
            break
        if not e & 1:
            out.append(e)
            base = e + 8
            continue
        bits = e >> 1
        i = 0
        while bits:
            if bits & 1:
                out.append(base + 8 * i)
            bits >>= 1
            i += 1
        base += 63 * 8
    return out


def _words_at(image: ElfImage, places: list[int], width: int) -> list[int]:
    """The `width`-byte word at each place (0 where the file holds none)."""
    fmt = struct.Struct(image.byteorder + ("Q" if width == 8 else "I"))
    data = image.data
    spans = sorted((s.vaddr, s.vaddr + min(s.filesz, len(data) - s.offset), s.offset)
                   for s in image.segments if s.type == PT_LOAD and s.offset < len(data))
    starts = [a for a, _b, _o in spans]
    out = []
    for p in places:
        k = bisect_left(starts, p + 1) - 1
        if k >= 0 and p + width <= spans[k][1]:
            out.append(fmt.unpack_from(data, spans[k][2] + p - spans[k][0])[0])
        else:
            out.append(0)
    return out


def _implicit(image: ElfImage, place: int, known: RelocType | None) -> int:
    width = known.width if known is not None and known.width in (4, 8) else 8
    raw = image.read_vaddr(place, width)
    if len(raw) != width:
        return 0
    return int.from_bytes(raw, "little" if image.little_endian else "big", signed=width == 4)


def code_ranges(image: ElfImage) -> list[tuple[int, int]]:
    """[start, end) of each executable PT_LOAD's memory, sorted."""
    return sorted((s.vaddr, s.vaddr + s.memsz) for s in image.segments
                  if s.type == PT_LOAD and s.flags & PF_X)


def fixed_places(image: ElfImage) -> list[tuple[int, int, str]]:
    """(start, end, description) of every loader relocation whose place lies in code (an
    executable PT_LOAD), sorted: the bytes the loader writes there (text relocations) must
    not move or be copied. Computed once per file."""
    got = image.derived.get("model_fixed")
    if isinstance(got, list):
        return got
    rel = loader_relocations(image)
    out: list[tuple[int, int, str]] = []
    ranges = code_ranges(image)
    if ranges and len(rel):
        lo, hi = ranges[0][0], ranges[-1][1]
        cand = compress(range(len(rel)), map(lo.__le__, rel.places))
        for i in cand:
            p = rel.places[i]
            if p >= hi or not any(a <= p < b for a, b in ranges):
                continue
            w = max(1, rel.width(i))
            out.append((p, p + w, f"{rel.name(i)} at {p:#x} ({rel.tables[rel.table[i]].name})"))
    out.sort()
    image.derived["model_fixed"] = out
    return out


def fixed_place_in(image: ElfImage, start: int, end: int) -> str | None:
    """The description of a fixed place that overlaps [start, end), or None."""
    return place_overlapping(fixed_places(image), start, end)


def place_overlapping(places: Sequence[tuple[int, int, str]], start: int, end: int
                      ) -> str | None:
    """The description of the place of `places` (fixed_places) overlapping [start, end)."""
    if not places:
        return None
    k = bisect_left(places, (start,))
    for j in (k - 1, k):  # a place starting before `start` may reach into it (width <= 16)
        if 0 <= j < len(places) and places[j][0] < end and places[j][1] > start:
            return places[j][2]
    return None


def text_relocations(image: ElfImage) -> bool:
    """Whether the dynamic section says relocations place in code (DT_TEXTREL, DF_TEXTREL)."""
    dyn = dynamic_entries(image)
    return any(t == DT_TEXTREL or (t == DT_FLAGS and v & DF_TEXTREL) for t, v, _o in dyn)


# --- what a file uses outside the table -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Unmodelled:
    """One construct a file uses that the table does not hold: its kind (KINDS),
    what it is, where, and its scope (FILE_WIDE, or LOCAL to [start, end) of code)."""

    kind: str
    what: str
    where: str
    scope: str = FILE_WIDE
    start: int = 0
    end: int = 0

    @property
    def message(self) -> str:
        return f"unmodelled-{self.kind}: {self.what} at {self.where}"


def unmodelled(image: ElfImage) -> tuple[Unmodelled, ...]:
    """Every construct `image` uses that is not in the table, with where it is and its
    scope (pure; computed once per file). File-wide: a relocation type in a loader table, a
    dynamic tag or flag bit, a section type or flag, a program header type, a note or GNU
    property. (The call frame information and the line programs are read by their own
    readers: usdtpatch.analysis.closed asks them.)"""
    got = image.derived.get("model_unmodelled")
    if isinstance(got, tuple):
        return got
    out: list[Unmodelled] = []
    out.extend(_sections(image))
    out.extend(_segments(image))
    out.extend(_dynamic(image))
    out.extend(_relocations(image))
    out.extend(_notes(image))
    result = tuple(out)
    image.derived["model_unmodelled"] = result
    return result


def _sec_where(image: ElfImage, off: int) -> str:
    for s in image.sections:
        if s.type != SHT_NOBITS and s.offset <= off < s.offset + s.size and s.name:
            return f"{s.name}+{off - s.offset:#x}"
    return f"file offset {off:#x}"


def _sections(image: ElfImage) -> Iterator[Unmodelled]:
    known_flags = sum(SECTION_FLAGS)
    for s in image.sections:
        if s.type not in SECTION_TYPES:
            yield Unmodelled(SECTION, f"section type {s.type:#x}",
                             f"section [{s.index}] {s.name or '?'}")
        extra = s.flags & ~known_flags & 0xFFFFFFFF
        if extra:
            yield Unmodelled(SECTION, f"section flags {extra:#x}",
                             f"section [{s.index}] {s.name or '?'}")


def _segments(image: ElfImage) -> Iterator[Unmodelled]:
    for s in image.segments:
        if s.type not in SEGMENT_TYPES:
            yield Unmodelled(SEGMENT, f"p_type {s.type:#x}", f"program header {s.index}")


def _dynamic(image: ElfImage) -> Iterator[Unmodelled]:
    dyn = dynamic_entries(image)
    sec = next((s for s in image.sections if s.type == SHT_DYNAMIC), None)
    for tag, val, off in dyn:
        where = (f".dynamic+{off - sec.offset:#x}" if sec is not None and
                 sec.offset <= off < sec.offset + sec.size else f"file offset {off:#x}")
        if tag not in DYNAMIC_TAGS:
            yield Unmodelled(DYNAMIC, f"DT {tag & 0xFFFFFFFFFFFFFFFF:#x}", where)
        bits = FLAG_BITS.get(tag)
        if bits is not None and val & ~sum(bits):
            yield Unmodelled(DYNAMIC, f"{DYNAMIC_TAGS[tag].name} bits "
                             f"{val & ~sum(bits):#x}", where)


def _relocations(image: ElfImage) -> Iterator[Unmodelled]:
    rel = loader_relocations(image)
    if not len(rel):
        return
    known = {*RELOCATION_TYPES, RELR}
    odd = set(rel.types) - known
    if not odd:
        return
    for rtype in sorted(odd):
        i = rel.types.index(rtype)
        t = rel.tables[rel.table[i]]
        size = _ENTRY[t.kind]
        first = next(k for k in range(len(rel)) if rel.table[k] == rel.table[i])
        at = t.offset + size * (i - first)
        yield Unmodelled(RELOCATION, f"relocation type {rtype} at place {rel.places[i]:#x}",
                         _sec_where(image, at))


def _notes(image: ElfImage) -> Iterator[Unmodelled]:
    seen: set[int] = set()
    # a note in a section that is not allocated is read by no loader or kernel, only by
    # tools (elf/notes.py keeps another owner's note in .note.stapsdt as it is): neutral
    spans = [(s.offset, s.size, s.name or f"section {s.index}") for s in image.sections
             if s.type == SHT_NOTE and s.allocated]
    spans += [(p.offset, p.filesz, f"PT_NOTE {p.index}") for p in image.segments
              if p.type == PT_NOTE]
    for off, size, name in spans:
        if off in seen or off + size > len(image.data):
            continue
        seen.add(off)
        yield from _note_run(image, bytes(image.data[off:off + size]), name)


def _note_run(image: ElfImage, data: bytes, name: str) -> Iterator[Unmodelled]:
    bo = image.byteorder
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(bo + "III", data, pos)
        owner = data[pos + 12:pos + 12 + namesz].rstrip(b"\0")
        desc_at = pos + 12 + ((namesz + 3) & ~3)
        end = desc_at + descsz
        if end > len(data):
            return  # a broken note run: elf/notes.py's readers say so
        where = f"{name}+{pos:#x}"
        if (owner, ntype) in NOTES:
            if owner == b"GNU" and ntype == NT_GNU_PROPERTY_TYPE_0:
                yield from _properties(image, data[desc_at:end], where)
        elif not (owner.startswith(ANNOBIN_OWNER) and ntype in ANNOBIN_TYPES):
            yield Unmodelled(NOTE, f"note owner {owner.decode('ascii', 'replace')!r} type "
                             f"{ntype:#x}", where)
        pos = (end + 3) & ~3
        if image.is64 and owner == b"GNU" and ntype == NT_GNU_PROPERTY_TYPE_0:
            pos = (end + 7) & ~7


def _properties(image: ElfImage, desc: bytes, where: str) -> Iterator[Unmodelled]:
    align = 8 if image.is64 else 4
    q = 0
    while q + 8 <= len(desc):
        pr_type, pr_size = struct.unpack_from(image.byteorder + "II", desc, q)
        if pr_type not in GNU_PROPERTIES:
            yield Unmodelled(NOTE, f"GNU property {pr_type:#x}", where)
        elif pr_type == GNU_PROPERTY_X86_FEATURE_1_AND and pr_size >= 4:
            bits = struct.unpack_from(image.byteorder + "I", desc, q + 8)[0]
            extra = bits & ~sum(X86_FEATURE_1)
            if extra:
                yield Unmodelled(NOTE, f"GNU_PROPERTY_X86_FEATURE_1_AND bits {extra:#x}", where)
        q += 8 + ((pr_size + align - 1) & ~(align - 1))


def cfa_program_unknown(prog: bytes, word: int = 8) -> str | None:
    """The first call frame instruction of `prog` not in CFA_OPCODES, described, or None."""
    p = 0
    while p < len(prog):
        op = prog[p]
        key = op & 0xC0 if op & 0xC0 else op
        spec = CFA_OPERANDS.get(key)
        if spec is None:
            return f"call frame instruction {op:#04x} at +{p:#x}"
        p += 1
        for c in spec:
            if c in "us":
                while p < len(prog) and prog[p] & 0x80:
                    p += 1
                p += 1
            elif c == "b":
                n, shift = 0, 0
                while p < len(prog):
                    n |= (prog[p] & 0x7F) << shift
                    shift += 7
                    p += 1
                    if not prog[p - 1] & 0x80:
                        break
                p += n
            elif c == "a":
                p += word
            else:
                p += int(c)
    return None

