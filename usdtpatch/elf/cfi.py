"""Call frame information: FDE lookup through `.eh_frame_hdr`, CIE/FDE parsing, LSDA landing pads.

References:
- LSB Core, "Exception Frames": the `.eh_frame` CIE/FDE layout (length, CIE id/pointer,
  augmentation string "zPLR", pointer encodings DW_EH_PE_*) and `.eh_frame_hdr` (version 1,
  eh_frame_ptr_enc, fde_count_enc, table_enc, then a table of (initial_location, fde_address)
  pairs sorted by initial_location for binary search).
- DWARF 4, section 6.4 (call frame instructions: kept as raw bytes here).
- The Itanium C++ ABI exception handling tables as GCC emits them in `.gcc_except_table`:
  LPStart encoding and value, TType encoding and offset, call-site encoding, call-site table
  of (start, length, landing pad, action).

Only the FDEs asked for are parsed: a lookup is a binary search in `.eh_frame_hdr`'s table
(the whole `.eh_frame` is walked only when a file has no usable `.eh_frame_hdr`). Everything is
parsed with `struct` from the image's bytes; pyelftools is not needed for this.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from dataclasses import dataclass, field

from usdtpatch.elf.image import PT_GNU_EH_FRAME, ElfImage
from usdtpatch.errors import ElfFormatError

# DW_EH_PE_* pointer encodings (LSB Core, table 10-5 and 10-6).
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

_FIXED = {
    DW_EH_PE_udata2: "H",
    DW_EH_PE_udata4: "I",
    DW_EH_PE_udata8: "Q",
    DW_EH_PE_sdata2: "h",
    DW_EH_PE_sdata4: "i",
    DW_EH_PE_sdata8: "q",
}


class CfiError(ElfFormatError):
    """Malformed call frame information (the message names the address and the field)."""


@dataclass(frozen=True, slots=True)
class Cie:
    """A Common Information Entry."""

    address: int  # link-time address of the CIE's length field
    version: int
    augmentation: str
    code_alignment: int
    data_alignment: int
    return_register: int
    fde_encoding: int
    lsda_encoding: int
    personality: int | None
    instructions: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Fde:
    """A Frame Description Entry: one function (or one part of one) with its CFI."""

    address: int  # link-time address of the FDE's length field
    cie: Cie
    pc_begin: int
    pc_end: int
    lsda: int | None  # link-time address of the LSDA in .gcc_except_table, if any
    instructions: bytes = field(repr=False)

    def contains(self, address: int) -> bool:
        return self.pc_begin <= address < self.pc_end


@dataclass(frozen=True, slots=True)
class CallSite:
    """One row of an LSDA call-site table, with absolute addresses."""

    start: int
    end: int
    landing_pad: int | None  # None: no landing pad (unwinding continues)
    action: int


@dataclass(frozen=True, slots=True)
class Lsda:
    address: int
    lp_start: int
    call_sites: tuple[CallSite, ...]

    @property
    def landing_pads(self) -> tuple[int, ...]:
        return tuple(sorted({c.landing_pad for c in self.call_sites if c.landing_pad is not None}))


class _Reader:
    """Reads little-endian DWARF-style fields at link-time addresses of one image."""

    def __init__(self, image: ElfImage) -> None:
        self.image = image
        self.bo = image.byteorder
        self.ptr = image.word_size

    def bytes_at(self, address: int, size: int, what: str) -> bytes:
        got = self.image.read_vaddr(address, size)
        if len(got) < size:
            raise CfiError(f"{what} at {address:#x}: needs {size} bytes, the file has "
                           f"{len(got)} there")
        return got

    def fixed(self, address: int, fmt: str, what: str) -> int:
        size = struct.calcsize(fmt)
        val: int = struct.unpack(self.bo + fmt, self.bytes_at(address, size, what))[0]
        return val

    def leb(self, address: int, signed: bool, what: str) -> tuple[int, int]:
        """(value, bytes used) of a ULEB128/SLEB128 at `address`."""
        result = 0
        shift = 0
        pos = address
        chunk = self.image.read_vaddr(address, 16)
        for i, byte in enumerate(chunk):
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                if signed and byte & 0x40:
                    result -= 1 << shift
                return result, i + 1
        raise CfiError(f"{what} at {pos:#x}: LEB128 longer than 16 bytes or truncated")

    def encoded(self, address: int, enc: int, what: str, data_base: int = 0,
                func_base: int = 0) -> tuple[int, int]:
        """(value, bytes used) of a DW_EH_PE-encoded pointer stored at `address`."""
        if enc == DW_EH_PE_omit:
            return 0, 0
        fmt = enc & 0x0F
        if fmt == DW_EH_PE_absptr:
            size = self.ptr
            val = self.fixed(address, "Q" if size == 8 else "I", what)
        elif fmt in (DW_EH_PE_uleb128, DW_EH_PE_sleb128):
            val, size = self.leb(address, fmt == DW_EH_PE_sleb128, what)
        elif fmt in _FIXED:
            size = struct.calcsize(_FIXED[fmt])
            val = self.fixed(address, _FIXED[fmt], what)
        else:
            raise CfiError(f"{what} at {address:#x}: pointer encoding {enc:#04x} has unknown "
                           f"format {fmt:#x}")
        app = enc & 0x70
        if app == DW_EH_PE_pcrel:
            val += address
        elif app == DW_EH_PE_datarel:
            val += data_base
        elif app == DW_EH_PE_funcrel:
            val += func_base
        elif app not in (0, DW_EH_PE_textrel):
            raise CfiError(f"{what} at {address:#x}: pointer encoding {enc:#04x} has unknown "
                           f"application {app:#x}")
        if enc & DW_EH_PE_indirect:
            val = self.fixed(val, "Q" if self.ptr == 8 else "I", f"{what} (indirect)")
        return val & ((1 << (8 * self.ptr)) - 1), size


@dataclass(frozen=True, slots=True)
class CfiIndex:
    """The sorted FDE table of `.eh_frame_hdr` (or of a walk of `.eh_frame` without one)."""

    image: ElfImage = field(repr=False)
    starts: tuple[int, ...]  # initial locations, sorted
    fde_addresses: tuple[int, ...]  # the FDE for starts[i]
    source: str  # "eh_frame_hdr", "eh_frame" (walked) or "none"

    def __len__(self) -> int:
        return len(self.starts)

    def fde_at(self, i: int) -> Fde:
        return parse_fde(self.image, self.fde_addresses[i])

    def lookup(self, address: int) -> Fde | None:
        """The FDE covering `address`, or None (binary search, one FDE parsed)."""
        i = bisect_right(self.starts, address) - 1
        if i < 0:
            return None
        fde = self.fde_at(i)
        return fde if fde.contains(address) else None

    def next_start_after(self, address: int) -> int | None:
        i = bisect_right(self.starts, address)
        return self.starts[i] if i < len(self.starts) else None


def load_cfi(image: ElfImage) -> CfiIndex:
    """Read `.eh_frame_hdr`'s binary-search table; walk `.eh_frame` only when there is none."""
    hdr_addr = None
    for seg in image.segments:
        if seg.type == PT_GNU_EH_FRAME:
            hdr_addr = seg.vaddr
    if hdr_addr is None:
        sec = image.section(".eh_frame_hdr")
        if sec is not None:
            hdr_addr = sec.addr
    if hdr_addr is not None:
        table = _read_hdr_table(image, hdr_addr)
        if table is not None:
            return table
    sec = image.section(".eh_frame")
    if sec is None or not sec.addr or not sec.size:
        return CfiIndex(image, (), (), "none")
    return _walk_eh_frame(image, sec.addr, sec.size)


def _read_hdr_table(image: ElfImage, hdr: int) -> CfiIndex | None:
    r = _Reader(image)
    head = r.bytes_at(hdr, 4, ".eh_frame_hdr header")
    version, _ptr_enc, count_enc, table_enc = head
    if version != 1:
        raise CfiError(f".eh_frame_hdr at {hdr:#x}: version {version}, expected 1")
    pos = hdr + 4
    _eh_frame, used = r.encoded(pos, head[1], ".eh_frame_hdr eh_frame_ptr", data_base=hdr)
    pos += used
    if DW_EH_PE_omit in (count_enc, table_enc):
        return None  # no table: the caller walks .eh_frame
    count, used = r.encoded(pos, count_enc, ".eh_frame_hdr fde_count", data_base=hdr)
    pos += used
    if table_enc == (DW_EH_PE_datarel | DW_EH_PE_sdata4):  # 0x3b: what every linker emits
        raw = image.read_vaddr(pos, 8 * count)
        if len(raw) < 8 * count:
            raise CfiError(f".eh_frame_hdr at {hdr:#x}: table of {count} entries needs "
                           f"{8 * count} bytes, the file has {len(raw)}")
        vals = struct.unpack(f"{r.bo}{2 * count}i", raw)
        starts = tuple(v + hdr for v in vals[0::2])
        fdes = tuple(v + hdr for v in vals[1::2])
    else:
        s_list: list[int] = []
        f_list: list[int] = []
        for i in range(count):
            a, used = r.encoded(pos, table_enc, f".eh_frame_hdr table entry {i}", data_base=hdr)
            pos += used
            b, used = r.encoded(pos, table_enc, f".eh_frame_hdr table entry {i}", data_base=hdr)
            pos += used
            s_list.append(a)
            f_list.append(b)
        starts, fdes = tuple(s_list), tuple(f_list)
    if any(starts[i] > starts[i + 1] for i in range(len(starts) - 1)):
        raise CfiError(f".eh_frame_hdr at {hdr:#x}: the search table is not sorted")
    return CfiIndex(image, starts, fdes, "eh_frame_hdr")


def _walk_eh_frame(image: ElfImage, start: int, size: int) -> CfiIndex:
    r = _Reader(image)
    pairs: list[tuple[int, int]] = []
    pos = start
    end = start + size
    while pos + 4 <= end:
        length = r.fixed(pos, "I", ".eh_frame length")
        if length == 0:
            break  # terminator
        hl = 4
        if length == 0xFFFFFFFF:
            length = r.fixed(pos + 4, "Q", ".eh_frame extended length")
            hl = 12
        cie_id = r.fixed(pos + hl, "I", ".eh_frame CIE id")
        if cie_id != 0:
            fde = parse_fde(image, pos)
            pairs.append((fde.pc_begin, pos))
        pos += hl + length
    pairs.sort()
    return CfiIndex(image, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs), "eh_frame")


def parse_cie(image: ElfImage, address: int) -> Cie:
    r = _Reader(image)
    length = r.fixed(address, "I", "CIE length")
    hl = 4
    if length == 0xFFFFFFFF:
        length = r.fixed(address + 4, "Q", "CIE extended length")
        hl = 12
    end = address + hl + length
    pos = address + hl
    cie_id = r.fixed(pos, "I", "CIE id")
    if cie_id != 0:
        raise CfiError(f"CIE at {address:#x}: CIE id {cie_id:#x}, expected 0")
    pos += 4
    version = r.bytes_at(pos, 1, "CIE version")[0]
    if version not in (1, 3):
        raise CfiError(f"CIE at {address:#x}: version {version}, expected 1 or 3")
    pos += 1
    raw = image.read_vaddr(pos, 32)
    nul = raw.find(b"\0")
    if nul < 0:
        raise CfiError(f"CIE at {address:#x}: augmentation string not terminated")
    aug = raw[:nul].decode("ascii", "replace")
    pos += nul + 1
    if "eh" in aug:
        pos += r.ptr
    code_align, n = r.leb(pos, False, "CIE code alignment")
    pos += n
    data_align, n = r.leb(pos, True, "CIE data alignment")
    pos += n
    if version == 1:
        ra = r.bytes_at(pos, 1, "CIE return register")[0]
        pos += 1
    else:
        ra, n = r.leb(pos, False, "CIE return register")
        pos += n
    fde_enc = DW_EH_PE_absptr
    lsda_enc = DW_EH_PE_omit
    personality: int | None = None
    if aug.startswith("z"):
        aug_len, n = r.leb(pos, False, "CIE augmentation length")
        pos += n
        aug_end = pos + aug_len
        for ch in aug[1:]:
            if ch == "L":
                lsda_enc = r.bytes_at(pos, 1, "CIE LSDA encoding")[0]
                pos += 1
            elif ch == "R":
                fde_enc = r.bytes_at(pos, 1, "CIE FDE encoding")[0]
                pos += 1
            elif ch == "P":
                penc = r.bytes_at(pos, 1, "CIE personality encoding")[0]
                personality, n = r.encoded(pos + 1, penc, "CIE personality")
                pos += 1 + n
            elif ch in "SBG":
                continue
            else:
                break  # unknown letter: the 'z' length lets us skip the rest
        pos = aug_end
    instructions = image.read_vaddr(pos, max(0, end - pos))
    return Cie(address, version, aug, code_align, data_align, ra, fde_enc, lsda_enc,
               personality, instructions)


def parse_fde(image: ElfImage, address: int) -> Fde:
    """Parse the FDE whose length field is at link-time `address`, and its CIE."""
    r = _Reader(image)
    length = r.fixed(address, "I", "FDE length")
    hl = 4
    if length == 0xFFFFFFFF:
        length = r.fixed(address + 4, "Q", "FDE extended length")
        hl = 12
    end = address + hl + length
    pos = address + hl
    cie_ptr = r.fixed(pos, "I", "FDE CIE pointer")
    if cie_ptr == 0:
        raise CfiError(f"FDE at {address:#x}: is a CIE (CIE pointer 0)")
    cie = parse_cie(image, pos - cie_ptr)
    pos += 4
    pc_begin, n = r.encoded(pos, cie.fde_encoding, f"FDE at {address:#x} pc_begin")
    pos += n
    pc_range, n = r.encoded(pos, cie.fde_encoding & 0x0F, f"FDE at {address:#x} pc_range")
    pos += n
    lsda: int | None = None
    if cie.augmentation.startswith("z"):
        aug_len, n = r.leb(pos, False, "FDE augmentation length")
        pos += n
        if "L" in cie.augmentation and cie.lsda_encoding != DW_EH_PE_omit and aug_len:
            value, _n = r.encoded(pos, cie.lsda_encoding, f"FDE at {address:#x} LSDA pointer")
            lsda = value or None
        pos += aug_len
    if pos > end:
        raise CfiError(f"FDE at {address:#x}: fields run past its length ({length})")
    instructions = image.read_vaddr(pos, end - pos)
    return Fde(address, cie, pc_begin, pc_begin + pc_range, lsda, instructions)


def parse_lsda(image: ElfImage, address: int, func_start: int) -> Lsda:
    """The call-site table of the LSDA at `address` for the function starting at `func_start`."""
    r = _Reader(image)
    pos = address
    lp_enc = r.bytes_at(pos, 1, "LSDA LPStart encoding")[0]
    pos += 1
    lp_start = func_start
    if lp_enc != DW_EH_PE_omit:
        lp_start, n = r.encoded(pos, lp_enc, "LSDA LPStart")
        pos += n
    tt_enc = r.bytes_at(pos, 1, "LSDA TType encoding")[0]
    pos += 1
    if tt_enc != DW_EH_PE_omit:
        _tt, n = r.leb(pos, False, "LSDA TType offset")
        pos += n
    cs_enc = r.bytes_at(pos, 1, "LSDA call-site encoding")[0]
    pos += 1
    cs_len, n = r.leb(pos, False, "LSDA call-site table length")
    pos += n
    table_end = pos + cs_len
    sites: list[CallSite] = []
    while pos < table_end:
        start, n = r.encoded(pos, cs_enc & 0x0F, "LSDA call-site start")
        pos += n
        length, n = r.encoded(pos, cs_enc & 0x0F, "LSDA call-site length")
        pos += n
        lp, n = r.encoded(pos, cs_enc & 0x0F, "LSDA landing pad")
        pos += n
        action, n = r.leb(pos, False, "LSDA action")
        pos += n
        sites.append(CallSite(func_start + start, func_start + start + length,
                              lp_start + lp if lp else None, action))
        if len(sites) > 1_000_000:
            raise CfiError(f"LSDA at {address:#x}: call-site table does not end")
    return Lsda(address, lp_start, tuple(sites))
