"""Call frame information, read: the one reader of `.eh_frame`, `.eh_frame_hdr` and LSDAs.

References:
- LSB Core, "Exception Frames": the `.eh_frame` CIE/FDE layout (length, CIE id/pointer,
  augmentation string "zPLR", pointer encodings DW_EH_PE_*) and `.eh_frame_hdr` (version 1,
  eh_frame_ptr_enc, fde_count_enc, table_enc, then a table of (initial_location, fde_address)
  pairs sorted by initial_location for binary search).
- DWARF 4, section 6.4 (call frame instructions: kept as raw bytes here; usdtpatch/elf/ehframe.py
  runs them) and section 7.6 (LEB128).
- The Itanium C++ ABI exception handling tables as GCC emits them in `.gcc_except_table`:
  LPStart encoding and value, TType encoding and offset, call-site encoding, call-site table
  of (start, length, landing pad, action).

There is one LEB128 reader (`read_uleb`/`read_sleb`), one table of pointer encodings
(`read_encoded`) and one CIE parser (`parse_cie_at`), and they are positional: each reads at a
link-time address inside an `EhBytes` (a run of bytes and the address of its first byte), never
past the end of the entry it belongs to. The analysis reads entries in place (an `EhBytes` over
the PT_LOAD holding them); the rewriter's copy of `.eh_frame` (usdtpatch/elf/ehframe.py) walks
the section's bytes with the same parser and uses the field positions it records. Every
malformed field raises CfiError (an ElfFormatError) naming where, what and what was found.

Only the FDEs asked for are parsed: a lookup is a binary search in `.eh_frame_hdr`'s table (the
whole `.eh_frame` is walked only when a file has no usable `.eh_frame_hdr`).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import le

from usdtpatch.elf.image import PT_GNU_EH_FRAME, SHF_COMPRESSED, SHT_PROGBITS, ElfImage
from usdtpatch.elf.model import (
    EH_PE_APPLICATIONS,
    DW_EH_PE_absptr,
    DW_EH_PE_datarel,
    DW_EH_PE_funcrel,
    DW_EH_PE_indirect,
    DW_EH_PE_omit,
    DW_EH_PE_pcrel,
    DW_EH_PE_sdata2,
    DW_EH_PE_sdata4,
    DW_EH_PE_sdata8,
    DW_EH_PE_sleb128,
    DW_EH_PE_udata2,
    DW_EH_PE_udata4,
    DW_EH_PE_udata8,
    DW_EH_PE_uleb128,
)
from usdtpatch.errors import ElfFormatError

# The one pointer-encoding table: value format (low nibble) -> struct code of a fixed-size field.
# DW_EH_PE_absptr is the file's word; uleb128/sleb128 are variable-length.
FIXED_FORMATS: dict[int, str] = {
    DW_EH_PE_udata2: "H",
    DW_EH_PE_udata4: "I",
    DW_EH_PE_udata8: "Q",
    DW_EH_PE_sdata2: "h",
    DW_EH_PE_sdata4: "i",
    DW_EH_PE_sdata8: "q",
}
_APPLICATIONS = frozenset(EH_PE_APPLICATIONS)
MAX_LEB128 = 16  # bytes; longer is junk (no field of these tables needs more than 10)


class CfiError(ElfFormatError):
    """Malformed call frame information (the message names the address and the field)."""


def pointer_code(enc: int, word: int) -> str | None:
    """The struct code of a fixed-size pointer field (signed for absptr), None for LEB128."""
    fmt = enc & 0x0F
    if fmt == DW_EH_PE_absptr:
        return "q" if word == 8 else "i"
    if fmt in (DW_EH_PE_uleb128, DW_EH_PE_sleb128):
        return None
    code = FIXED_FORMATS.get(fmt)
    if code is None:
        raise CfiError(f"pointer encoding {enc:#04x}: unknown value format {fmt:#x}")
    return code


@dataclass(frozen=True, slots=True)
class EhBytes:
    """A run of file bytes and the link-time address of its first byte."""

    data: bytes | bytearray | memoryview = field(repr=False)
    address: int
    word: int = 8
    byteorder: str = "<"
    # reads a pointer at an address, for the DW_EH_PE_indirect bit (None: the bit is ignored)
    deref: Callable[[int, str], int] | None = field(default=None, repr=False, compare=False)

    @property
    def end(self) -> int:
        return self.address + len(self.data)

    def _need(self, at: int, size: int, limit: int, what: str) -> int:
        end = min(limit, self.end)
        if at < self.address or at + size > end:
            have = max(0, end - at) if at >= self.address else 0
            raise CfiError(f"{what} at {at:#x}: needs {size} bytes, the entry has {have} there")
        return at - self.address

    def byte(self, at: int, limit: int, what: str) -> int:
        return self.data[self._need(at, 1, limit, what)]

    def fixed(self, at: int, code: str, limit: int, what: str) -> int:
        size = struct.calcsize(code)
        i = self._need(at, size, limit, what)
        val: int = struct.unpack_from(self.byteorder + code, self.data, i)[0]
        return val

    def cstring(self, at: int, limit: int, what: str) -> tuple[bytes, int]:
        """(bytes before the NUL, address after the NUL)."""
        i = self._need(at, 0, limit, what)
        stop = min(limit, self.end) - self.address
        raw = bytes(self.data[i:stop])
        nul = raw.find(b"\0")
        if nul < 0:
            raise CfiError(f"{what} at {at:#x}: no terminating NUL before the end of the entry "
                           f"at {at + len(raw):#x}, found {raw[:16]!r}")
        return raw[:nul], at + nul + 1


def read_uleb(buf: EhBytes, at: int, limit: int, what: str) -> tuple[int, int]:
    """(value, address after it) of the ULEB128 at `at`, which must end before `limit`."""
    return _leb(buf, at, limit, what, False)


def read_sleb(buf: EhBytes, at: int, limit: int, what: str) -> tuple[int, int]:
    """(value, address after it) of the SLEB128 at `at`, which must end before `limit`."""
    return _leb(buf, at, limit, what, True)


def _leb(buf: EhBytes, at: int, limit: int, what: str, signed: bool) -> tuple[int, int]:
    i = buf._need(at, 0, limit, what)
    stop = min(limit, buf.end, at + MAX_LEB128) - buf.address
    data = buf.data
    result = shift = 0
    j = i
    while j < stop:
        byte = data[j]
        j += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if signed and byte & 0x40:
                result -= 1 << shift
            return result, buf.address + j
    kind = "SLEB128" if signed else "ULEB128"
    if j - i >= MAX_LEB128:
        raise CfiError(f"{what} at {at:#x}: {kind} longer than {MAX_LEB128} bytes, found "
                       f"{bytes(data[i:j]).hex(' ')}")
    raise CfiError(f"{what} at {at:#x}: {kind} runs past the end of the entry at "
                   f"{buf.address + j:#x}, found {bytes(data[i:j]).hex(' ') or 'no byte'}")


def leb_bytes(data: bytes | bytearray, pos: int, signed: bool,
              what: str = "call frame instruction operand") -> tuple[int, int]:
    """(value, index after it) of a LEB128 held as plain bytes: in a call frame program, or
    in DWARF (usdtpatch/elf/dwarf.py reads its LEB128s here)."""
    if 0 <= pos < len(data):  # one byte (most operands): what _leb reads, without its reader
        byte = data[pos]
        if not byte & 0x80:
            return (byte - 0x80 if signed and byte & 0x40 else byte), pos + 1
    return _leb(EhBytes(data, 0), pos, len(data), what, signed)


def read_encoded(buf: EhBytes, at: int, enc: int, limit: int, what: str, data_base: int = 0,
                 func_base: int = 0) -> tuple[int, int]:
    """(value, address after it) of a DW_EH_PE-encoded pointer at `at`, pc-relative and
    data-relative bases applied, read through `buf.deref` when the indirect bit is set, masked
    to the word. DW_EH_PE_omit reads nothing and gives 0."""
    if enc == DW_EH_PE_omit:
        return 0, at
    app = enc & 0x70
    if app not in _APPLICATIONS:
        raise CfiError(f"{what} at {at:#x}: pointer encoding {enc:#04x} has unknown "
                       f"application {app:#x}")
    fmt = enc & 0x0F
    try:
        code = pointer_code(enc, buf.word)
    except CfiError as exc:
        raise CfiError(f"{what} at {at:#x}: {exc}") from None
    if code is None:
        val, after = _leb(buf, at, limit, what, fmt == DW_EH_PE_sleb128)
    else:
        if fmt == DW_EH_PE_absptr:
            code = code.upper()
        val = buf.fixed(at, code, limit, what)
        after = at + struct.calcsize(code)
    if app == DW_EH_PE_pcrel:
        val += at
    elif app == DW_EH_PE_datarel:
        val += data_base
    elif app == DW_EH_PE_funcrel:
        val += func_base
    if enc & DW_EH_PE_indirect and buf.deref is not None:
        val = buf.deref(val & ((1 << (8 * buf.word)) - 1), f"{what} (indirect)")
    return val & ((1 << (8 * buf.word)) - 1), after


@dataclass(frozen=True, slots=True)
class Cie:
    """A Common Information Entry, with the positions of the fields a move must adjust."""

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
    personality_encoding: int = DW_EH_PE_omit
    personality_at: int | None = None  # address of the personality pointer field
    end: int = 0  # address after the entry
    understood: bool = True  # every augmentation letter is known (rows_at replays only these)

    @property
    def has_z(self) -> bool:
        return self.augmentation.startswith("z")


@dataclass(frozen=True, slots=True)
class Fde:
    """A Frame Description Entry: one function (or one part of one) with its CFI."""

    address: int  # link-time address of the FDE's length field
    cie: Cie
    pc_begin: int
    pc_end: int
    lsda: int | None  # link-time address of the LSDA in .gcc_except_table, if any
    instructions: bytes = field(repr=False)
    pc_begin_at: int = 0  # address of the pc_begin field
    lsda_at: int | None = None  # address of the LSDA pointer field
    end: int = 0  # address after the entry

    def contains(self, address: int) -> bool:
        return self.pc_begin <= address < self.pc_end


@dataclass(frozen=True, slots=True)
class EntryHead:
    """The common head of a CIE or an FDE."""

    address: int
    body: int  # address of the CIE id / CIE pointer
    end: int  # address after the entry
    cie_id: int  # 0 for a CIE, else the FDE's CIE pointer
    terminator: bool  # a zero length: the end of `.eh_frame`


def entry_head(buf: EhBytes, at: int, what: str = ".eh_frame entry") -> EntryHead:
    """Read the length and CIE id / pointer of the entry at `at`."""
    length = buf.fixed(at, "I", buf.end, f"{what} length")
    if length == 0:
        return EntryHead(address=at, body=at + 4, end=at + 4, cie_id=0, terminator=True)
    hl = 4
    if length == 0xFFFFFFFF:
        length = buf.fixed(at + 4, "Q", buf.end, f"{what} extended length")
        hl = 12
    end = at + hl + length
    if length < 4:
        raise CfiError(f"{what} at {at:#x}: length {length}, too short for its CIE id")
    cie_id = buf.fixed(at + hl, "I", end, f"{what} CIE id")
    return EntryHead(address=at, body=at + hl, end=end, cie_id=cie_id, terminator=False)


def parse_cie_at(buf: EhBytes, at: int) -> Cie:
    """The CIE whose length field is at `at`."""
    head = entry_head(buf, at, "CIE")
    if head.terminator:
        raise CfiError(f"CIE at {at:#x}: found the .eh_frame terminator (length 0)")
    if head.cie_id != 0:
        raise CfiError(f"CIE at {at:#x}: CIE id {head.cie_id:#x}, expected 0")
    end = head.end
    pos = head.body + 4
    version = buf.byte(pos, end, "CIE version")
    if version not in (1, 3):
        raise CfiError(f"CIE at {at:#x}: version {version}, expected 1 or 3")
    raw_aug, pos = buf.cstring(pos + 1, end, "CIE augmentation string")
    aug = raw_aug.decode("ascii", "replace")
    if "eh" in aug:
        pos += buf.word
    code_align, pos = read_uleb(buf, pos, end, "CIE code alignment")
    data_align, pos = read_sleb(buf, pos, end, "CIE data alignment")
    if version == 1:
        ra = buf.byte(pos, end, "CIE return register")
        pos += 1
    else:
        ra, pos = read_uleb(buf, pos, end, "CIE return register")
    fde_enc = DW_EH_PE_absptr
    lsda_enc = DW_EH_PE_omit
    pers_enc = DW_EH_PE_omit
    pers_at: int | None = None
    personality: int | None = None
    understood = True
    if aug.startswith("z"):
        aug_len, pos = read_uleb(buf, pos, end, "CIE augmentation length")
        aug_end = pos + aug_len
        if aug_end > end:
            raise CfiError(f"CIE at {at:#x}: augmentation data of {aug_len} bytes runs past "
                           f"the end of the entry at {end:#x}")
        for ch in aug[1:]:
            if ch == "L":
                lsda_enc = buf.byte(pos, aug_end, "CIE LSDA encoding")
                pos += 1
            elif ch == "R":
                fde_enc = buf.byte(pos, aug_end, "CIE FDE encoding")
                pos += 1
            elif ch == "P":
                pers_enc = buf.byte(pos, aug_end, "CIE personality encoding")
                pers_at = pos + 1
                personality, pos = read_encoded(buf, pers_at, pers_enc, aug_end,
                                                "CIE personality")
            elif ch in "SBG":
                continue
            else:
                understood = False
                break  # unknown letter: the 'z' length lets us skip the rest
        pos = aug_end
    elif aug not in ("", "eh"):
        understood = False  # without 'z' nothing says how long unknown data is
    instructions = bytes(buf.data[pos - buf.address : max(pos, min(end, buf.end)) - buf.address])
    return Cie(address=at, version=version, augmentation=aug, code_alignment=code_align,
               data_alignment=data_align, return_register=ra, fde_encoding=fde_enc,
               lsda_encoding=lsda_enc, personality=personality, instructions=instructions,
               personality_encoding=pers_enc, personality_at=pers_at, end=end,
               understood=understood)


def parse_fde_at(buf: EhBytes, at: int, cie_at: Callable[[int], Cie]) -> Fde:
    """The FDE whose length field is at `at`; `cie_at(address)` gives the CIE it points to."""
    head = entry_head(buf, at, "FDE")
    if head.terminator:
        raise CfiError(f"FDE at {at:#x}: found the .eh_frame terminator (length 0)")
    if head.cie_id == 0:
        raise CfiError(f"FDE at {at:#x}: is a CIE (CIE pointer 0)")
    end = head.end
    cie = cie_at(head.body - head.cie_id)
    pos = head.body + 4
    pc_at = pos
    pc_begin, pos = read_encoded(buf, pos, cie.fde_encoding, end, f"FDE at {at:#x} pc_begin")
    pc_range, pos = read_encoded(buf, pos, cie.fde_encoding & 0x0F, end,
                                 f"FDE at {at:#x} pc_range")
    lsda: int | None = None
    lsda_at: int | None = None
    if cie.has_z:
        aug_len, pos = read_uleb(buf, pos, end, "FDE augmentation length")
        if "L" in cie.augmentation and cie.lsda_encoding != DW_EH_PE_omit and aug_len:
            lsda_at = pos
            value, _after = read_encoded(buf, pos, cie.lsda_encoding, pos + aug_len,
                                         f"FDE at {at:#x} LSDA pointer")
            lsda = value or None
        pos += aug_len
    if pos > end:
        raise CfiError(f"FDE at {at:#x}: fields run past its end at {end:#x}")
    instructions = bytes(buf.data[pos - buf.address : min(end, buf.end) - buf.address])
    return Fde(address=at, cie=cie, pc_begin=pc_begin, pc_end=pc_begin + pc_range, lsda=lsda,
               instructions=instructions, pc_begin_at=pc_at, lsda_at=lsda_at, end=end)


def iter_entries(buf: EhBytes, cies: dict[int, Cie] | None = None
                 ) -> Iterator[Cie | Fde]:
    """Every CIE and FDE of a whole `.eh_frame` held in `buf`, in order, up to its terminator
    or its end. An FDE must point at a CIE seen before it."""
    known: dict[int, Cie] = {} if cies is None else cies

    def cie_at(address: int) -> Cie:
        got = known.get(address)
        if got is None:
            raise CfiError(f".eh_frame: an FDE points at {address:#x}, where no CIE was read "
                           f"before it")
        return got

    pos = buf.address
    while pos + 4 <= buf.end:
        head = entry_head(buf, pos)
        if head.terminator:
            return
        if head.end > buf.end:
            raise CfiError(f".eh_frame entry at {pos:#x}: length runs to {head.end:#x}, past "
                           f"the end of the section at {buf.end:#x}")
        if head.cie_id == 0:
            cie = parse_cie_at(buf, pos)
            known[pos] = cie
            yield cie
        else:
            yield parse_fde_at(buf, pos, cie_at)
        pos = head.end


# ---------------------------------------------------------------------------------------
# Entries read in place, through the image's loadable segments


def _segment_bytes(image: ElfImage, address: int, what: str) -> EhBytes:
    seg = image.load_segment_for(address)
    if seg is None:
        raise CfiError(f"{what} at {address:#x}: needs bytes, the address is in no loadable "
                       f"segment's file part")
    start = seg.offset
    end = min(seg.offset + seg.filesz, len(image.data))
    return EhBytes(data=memoryview(image.data)[start:end], address=seg.vaddr, word=image.word_size,
                   byteorder=image.byteorder, deref=lambda a, w: _read_pointer(image, a, w))


def _read_pointer(image: ElfImage, address: int, what: str) -> int:
    buf = _segment_bytes(image, address, what)
    return buf.fixed(address, "Q" if image.is64 else "I", buf.end, what)


def parse_cie(image: ElfImage, address: int, cache: dict[int, Cie] | None = None) -> Cie:
    """The CIE at link-time `address` (memoized in `cache` when given)."""
    if cache is not None:
        got = cache.get(address)
        if got is not None:
            return got
    cie = parse_cie_at(_segment_bytes(image, address, "CIE"), address)
    if cache is not None:
        cache[address] = cie
    return cie


def parse_fde(image: ElfImage, address: int, cache: dict[int, Cie] | None = None) -> Fde:
    """Parse the FDE whose length field is at link-time `address`, and its CIE."""
    return parse_fde_at(_segment_bytes(image, address, "FDE"), address,
                        lambda a: parse_cie(image, a, cache))


_RECENT_FDES = 64


@dataclass(frozen=True, slots=True)
class CfiIndex:
    """The sorted FDE table of `.eh_frame_hdr` (or of a walk of `.eh_frame` without one)."""

    image: ElfImage = field(repr=False)
    starts: tuple[int, ...]  # initial locations, sorted
    fde_addresses: tuple[int, ...]  # the FDE for starts[i]
    source: str  # "eh_frame_hdr", "eh_frame" (walked) or "none"
    _cies: dict[int, Cie] = field(default_factory=dict, repr=False, compare=False)
    # the latest FDEs parsed, by index (the analysis asks for a function's FDE several times
    # in a row: bounds, padding, unwind rows); the oldest is forgotten past _RECENT_FDES
    _fdes: OrderedDict[int, Fde] = field(default_factory=OrderedDict, repr=False,
                                         compare=False)
    # FDEs a caller keeps anyway (`keep`: the analysis' function bounds), by their address:
    # asked again after the recent ones forgot them, they are not parsed again
    _kept: dict[int, Fde] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.starts)

    def keep(self, fde: Fde) -> None:
        """Answer with `fde` (as parsed here) whenever its FDE is asked for again: for an
        FDE its caller holds for as long as this index lives (no copy is made)."""
        self._kept[fde.address] = fde

    def forget(self, fde: Fde) -> None:
        """No longer answer with `fde` (`keep`'s caller let it go); asked again, it is parsed
        again, to an equal Fde."""
        self._kept.pop(fde.address, None)

    def fde_at(self, i: int) -> Fde:
        got = self._fdes.get(i)
        if got is None:
            got = self._kept.get(self.fde_addresses[i])
        if got is None:
            got = parse_fde(self.image, self.fde_addresses[i], self._cies)
            self._fdes[i] = got
            if len(self._fdes) > _RECENT_FDES:
                self._fdes.popitem(last=False)
        return got

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
    """The index of `image`'s FDEs, read once per image (kept in `image.derived`: the rows,
    not the index, which refers to the image)."""
    rows = image.derived.get("cfi")
    if isinstance(rows, _CfiRows):
        return CfiIndex(image=image, starts=rows.starts, fde_addresses=rows.fde_addresses,
                        source=rows.source, _cies=rows.cies)
    index = _read_cfi(image)
    image.derived["cfi"] = _CfiRows(index.starts, index.fde_addresses, index.source,
                                    index._cies)
    return index


@dataclass(frozen=True, slots=True)
class _CfiRows:
    starts: tuple[int, ...]
    fde_addresses: tuple[int, ...]
    source: str
    cies: dict[int, Cie]


def eh_frame_unindexed(image: ElfImage) -> int | None:
    """The address of the file's `.eh_frame` when no PT_GNU_EH_FRAME header indexes it (every
    gcc static link), else None. The runtime unwinders find FDEs through that header: without
    it a detour's FDE cannot be added where they look (rewriter/plan's unwind tables; check's
    `detour-unwind-left-out`; a call is then never moved into a detour, analysis/calls)."""
    eh = image.section(".eh_frame")
    if eh is None or not eh.addr or any(s.type == PT_GNU_EH_FRAME for s in image.segments):
        return None
    return eh.addr


def _read_cfi(image: ElfImage) -> CfiIndex:
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
        table = read_hdr_table(image, hdr_addr)
        if table is not None:
            return table
    sec = image.section(".eh_frame")
    if sec is None or not sec.addr or not sec.size:
        return CfiIndex(image, (), (), "none")
    return _walk_eh_frame(image, sec.addr, sec.size)


def read_hdr_table(image: ElfImage, hdr: int) -> CfiIndex | None:
    buf = _segment_bytes(image, hdr, ".eh_frame_hdr header")
    lim = buf.end
    version = buf.byte(hdr, lim, ".eh_frame_hdr header")
    ptr_enc, count_enc, table_enc = (buf.byte(hdr + i, lim, ".eh_frame_hdr header")
                                     for i in (1, 2, 3))
    if version != 1:
        raise CfiError(f".eh_frame_hdr at {hdr:#x}: version {version}, expected 1")
    _eh_frame, pos = read_encoded(buf, hdr + 4, ptr_enc, lim, ".eh_frame_hdr eh_frame_ptr",
                                  data_base=hdr)
    if DW_EH_PE_omit in (count_enc, table_enc):
        return None  # no table: the caller walks .eh_frame
    count, pos = read_encoded(buf, pos, count_enc, lim, ".eh_frame_hdr fde_count",
                              data_base=hdr)
    if table_enc == (DW_EH_PE_datarel | DW_EH_PE_sdata4):  # 0x3b: what every linker emits
        have = max(0, lim - pos)
        if 8 * count > have:
            raise CfiError(f".eh_frame_hdr at {hdr:#x}: table of {count} entries needs "
                           f"{8 * count} bytes, the file has {have}")
        i = pos - buf.address
        vals = struct.unpack(f"{buf.byteorder}{2 * count}i", buf.data[i : i + 8 * count])
        starts = tuple(map(hdr.__add__, vals[0::2]))
        fdes = tuple(map(hdr.__add__, vals[1::2]))
    else:
        s_list: list[int] = []
        f_list: list[int] = []
        for i in range(count):
            a, pos = read_encoded(buf, pos, table_enc, lim, f".eh_frame_hdr table entry {i}",
                                  data_base=hdr)
            b, pos = read_encoded(buf, pos, table_enc, lim, f".eh_frame_hdr table entry {i}",
                                  data_base=hdr)
            s_list.append(a)
            f_list.append(b)
        starts, fdes = tuple(s_list), tuple(f_list)
    if not all(map(le, starts, starts[1:])):
        raise CfiError(f".eh_frame_hdr at {hdr:#x}: the search table is not sorted")
    return CfiIndex(image, starts, fdes, "eh_frame_hdr")


def _walk_eh_frame(image: ElfImage, start: int, size: int) -> CfiIndex:
    buf = _segment_bytes(image, start, ".eh_frame")
    region = EhBytes(data=buf.data[start - buf.address : min(start + size, buf.end) - buf.address],
                     address=start, word=buf.word, byteorder=buf.byteorder, deref=buf.deref)
    cies: dict[int, Cie] = {}
    pairs: list[tuple[int, int]] = []
    pos = start
    while pos + 4 <= region.end:
        head = entry_head(region, pos)
        if head.terminator:
            break
        if head.cie_id != 0:
            fde = parse_fde_at(region, pos, lambda a: parse_cie(image, a, cies))
            pairs.append((fde.pc_begin, pos))
        pos = head.end
    pairs.sort()
    return CfiIndex(image=image, starts=tuple(p[0] for p in pairs),
                    fde_addresses=tuple(p[1] for p in pairs), source="eh_frame", _cies=cies)


# ---------------------------------------------------------------------------------------
# LSDA


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
    ttype_encoding: int = DW_EH_PE_omit
    ttype_base: int | None = None  # address of the end of the type table (TType base)
    actions: int = 0  # address of the action table (right after the call-site table)

    @property
    def landing_pads(self) -> tuple[int, ...]:
        return tuple(sorted({c.landing_pad for c in self.call_sites if c.landing_pad is not None}))


MAX_CALL_SITES = 1_000_000


def parse_lsda(image: ElfImage, address: int, func_start: int) -> Lsda:
    """The call-site table of the LSDA at `address` for the function starting at `func_start`."""
    buf = _segment_bytes(image, address, "LSDA")
    lim = buf.end
    pos = address
    lp_enc = buf.byte(pos, lim, "LSDA LPStart encoding")
    pos += 1
    lp_start = func_start
    if lp_enc != DW_EH_PE_omit:
        lp_start, pos = read_encoded(buf, pos, lp_enc, lim, "LSDA LPStart")
    tt_enc = buf.byte(pos, lim, "LSDA TType encoding")
    pos += 1
    tt_base: int | None = None
    if tt_enc != DW_EH_PE_omit:
        tt_off, pos = read_uleb(buf, pos, lim, "LSDA TType offset")
        tt_base = pos + tt_off
    cs_enc = buf.byte(pos, lim, "LSDA call-site encoding")
    pos += 1
    cs_len, pos = read_uleb(buf, pos, lim, "LSDA call-site table length")
    table_end = pos + cs_len
    sites: list[CallSite] = []
    fmt = cs_enc & 0x0F
    while pos < table_end:
        start, pos = read_encoded(buf, pos, fmt, lim, "LSDA call-site start")
        length, pos = read_encoded(buf, pos, fmt, lim, "LSDA call-site length")
        lp, pos = read_encoded(buf, pos, fmt, lim, "LSDA landing pad")
        action, pos = read_uleb(buf, pos, lim, "LSDA action")
        sites.append(CallSite(func_start + start, func_start + start + length,
                              lp_start + lp if lp else None, action))
        if len(sites) > MAX_CALL_SITES:
            raise CfiError(f"LSDA at {address:#x}: call-site table does not end")
    return Lsda(address=address, lp_start=lp_start, call_sites=tuple(sites), ttype_encoding=tt_enc,
                ttype_base=tt_base, actions=table_end)


# ---------------------------------------------------------------------------------------
# `.debug_frame` (DWARF 4, section 6.4), read for what `.eh_frame` does not cover


def debug_frame_fde(image: ElfImage, address: int) -> Fde | None:
    """The `.debug_frame` FDE covering `address`, or None (no such section, no such FDE, or
    one this reader does not read: 64-bit DWARF, a segment selector, an address size other
    than the file's word). A function compiled with -fno-asynchronous-unwind-tables has its
    rows there only; the detour of a window in it repeats them (rewriter/plan's rows).
    Addresses of entries are offsets in the section; pc_begin is an absolute address."""
    fdes = image.derived.get("debug_frame")
    if not isinstance(fdes, list):
        fdes = _walk_debug_frame(image)
        image.derived["debug_frame"] = fdes
    i = bisect_right([f.pc_begin for f in fdes], address) - 1
    return fdes[i] if i >= 0 and fdes[i].contains(address) else None


def _walk_debug_frame(image: ElfImage) -> list[Fde]:
    sec = image.section(".debug_frame")
    if sec is None or sec.flags & SHF_COMPRESSED or sec.type != SHT_PROGBITS:
        return []
    buf = EhBytes(image.section_data(sec), 0, image.word_size, image.byteorder)
    cies: dict[int, Cie] = {}
    out: list[Fde] = []
    pos = 0
    try:
        while pos + 4 <= buf.end:
            length = buf.fixed(pos, "I", buf.end, ".debug_frame length")
            if length == 0xFFFFFFFF or length < 4 or pos + 4 + length > buf.end:
                break  # 64-bit DWARF or a broken entry: what was read stays
            end = pos + 4 + length
            cie_id = buf.fixed(pos + 4, "I", end, ".debug_frame CIE id")
            if cie_id == 0xFFFFFFFF:
                cie = _debug_frame_cie(buf, pos, end)
                if cie is not None:
                    cies[pos] = cie
            elif cie_id in cies:
                cie = cies[cie_id]
                word = "Q" if image.is64 else "I"
                size = struct.calcsize(word)
                pc_begin = buf.fixed(pos + 8, word, end, ".debug_frame FDE pc_begin")
                pc_range = buf.fixed(pos + 8 + size, word, end, ".debug_frame FDE pc_range")
                body = pos + 8 + 2 * size
                out.append(Fde(address=pos, cie=cie, pc_begin=pc_begin, pc_end=pc_begin + pc_range,
                               lsda=None, instructions=bytes(buf.data[body:end]),
                               pc_begin_at=pos + 8, lsda_at=None, end=end))
            pos = end
    except CfiError:
        pass
    return sorted(out, key=lambda f: f.pc_begin)


def _debug_frame_cie(buf: EhBytes, at: int, end: int) -> Cie | None:
    """A `.debug_frame` CIE (version 1, 3 or 4), as an `.eh_frame` one without augmentation
    data (understood only when its augmentation string is empty)."""
    pos = at + 8
    version = buf.byte(pos, end, "CIE version")
    if version not in (1, 3, 4):
        return None
    raw_aug, pos = buf.cstring(pos + 1, end, "CIE augmentation string")
    if version == 4:
        if buf.byte(pos, end, "CIE address size") != buf.word or \
                buf.byte(pos + 1, end, "CIE segment selector size"):
            return None
        pos += 2
    code_align, pos = read_uleb(buf, pos, end, "CIE code alignment")
    data_align, pos = read_sleb(buf, pos, end, "CIE data alignment")
    if version == 1:
        ra = buf.byte(pos, end, "CIE return register")
        pos += 1
    else:
        ra, pos = read_uleb(buf, pos, end, "CIE return register")
    aug = raw_aug.decode("ascii", "replace")
    return Cie(address=at, version=version, augmentation=aug, code_alignment=code_align,
               data_alignment=data_align, return_register=ra, fde_encoding=DW_EH_PE_absptr,
               lsda_encoding=DW_EH_PE_omit, personality=None, instructions=bytes(buf.data[pos:end]),
               end=end, understood=aug == "")
