"""A small DWARF reader and writer: what a detour needs so that debuggers, profilers and
symbolizers name the original function and lines (docs/rewrite.md, "Debugging information").

Read: the line tables of `.debug_line` (versions 2 to 5, as gcc 12 and clang 14 write them:
v5 with entry formats, strings in `.debug_line_str` or `.debug_str`) and, from `.debug_info`
(versions 2 to 5), each compile unit's name, directory and language and each subprogram's
[low_pc, high_pc) (addresses as DW_FORM_addr or DW_FORM_addrx* through `.debug_addr`).
Written: one new compile unit for every detour (DWARF 4): a DW_TAG_subprogram per detour
whose DW_AT_abstract_origin is the original function's DIE (its name, type, parameters and
frame base come from there), a line program mapping each moved instruction to the original
instruction's file and line, and an address range set when the file has `.debug_aranges`.

Reference: DWARF Debugging Information Format, versions 4 (6.2 line number information,
7.5 unit headers and forms) and 5 (6.2.4 the line program header, 7.5.1 unit headers). Only
32-bit DWARF and 8-byte addresses are written; 64-bit DWARF units are read.
"""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from usdtpatch.elf.cfi import CfiError, leb_bytes
from usdtpatch.elf.ehframe import sleb, uleb
from usdtpatch.elf.image import SHF_COMPRESSED, ElfImage
from usdtpatch.elf.model import LINE_EXTENDED_OPCODES, LINE_STANDARD_OPCODES


class DwarfError(ValueError):
    """The DWARF data cannot be read (truncated, an unknown form)."""


# --- reading primitives -------------------------------------------------------------------


class DwarfReader:
    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise DwarfError(f"truncated at {self.pos:#x} (want {n} bytes)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def s8(self) -> int:
        return int.from_bytes(self.take(1), "little", signed=True)

    def uleb(self) -> int:
        return self._leb(False)

    def sleb(self) -> int:
        return self._leb(True)

    def _leb(self, signed: bool) -> int:
        try:
            value, self.pos = leb_bytes(self.data, self.pos, signed, "DWARF LEB128")
        except CfiError as exc:
            raise DwarfError(str(exc)) from None
        return value

    def cstr(self) -> bytes:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise DwarfError(f"unterminated string at {self.pos:#x}")
        out = self.data[self.pos : end]
        self.pos = end + 1
        return out

    def unit_length(self) -> tuple[int, int]:
        """(length, offset size 4 or 8)."""
        n = self.u(4)
        if n == 0xFFFFFFFF:
            return self.u(8), 8
        if n >= 0xFFFFFFF0:
            raise DwarfError(f"reserved unit length {n:#x} at {self.pos - 4:#x}")
        return n, 4


def _units(data: bytes, section: str) -> Iterator[tuple[int, DwarfReader, int, int, int]]:
    """(offset, reader after the version field, offset size 4 or 8, end, version) of each unit
    of a `.debug_line` or `.debug_info` section, in order."""
    pos = 0
    while pos + 4 <= len(data):
        start = pos
        r = DwarfReader(data, pos)
        length, osize = r.unit_length()
        end = r.pos + length
        if end > len(data):
            raise DwarfError(f"{section} unit at {start:#x} runs past the section")
        pos = end
        yield start, r, osize, end, r.u(2)


def _cstring(data: bytes, at: int) -> bytes:
    end = data.find(b"\0", at)
    if at < 0 or at >= len(data) or end < 0:
        raise DwarfError(f"string offset {at:#x} outside its section")
    return data[at:end]


# --- forms --------------------------------------------------------------------------------

DW_FORM_addr = 0x01
DW_FORM_block2 = 0x03
DW_FORM_block4 = 0x04
DW_FORM_data2 = 0x05
DW_FORM_data4 = 0x06
DW_FORM_data8 = 0x07
DW_FORM_string = 0x08
DW_FORM_block = 0x09
DW_FORM_block1 = 0x0A
DW_FORM_data1 = 0x0B
DW_FORM_flag = 0x0C
DW_FORM_sdata = 0x0D
DW_FORM_strp = 0x0E
DW_FORM_udata = 0x0F
DW_FORM_ref_addr = 0x10
DW_FORM_ref1 = 0x11
DW_FORM_ref2 = 0x12
DW_FORM_ref4 = 0x13
DW_FORM_ref8 = 0x14
DW_FORM_ref_udata = 0x15
DW_FORM_indirect = 0x16
DW_FORM_sec_offset = 0x17
DW_FORM_exprloc = 0x18
DW_FORM_flag_present = 0x19
DW_FORM_strx = 0x1A
DW_FORM_addrx = 0x1B
DW_FORM_ref_sup4 = 0x1C
DW_FORM_strp_sup = 0x1D
DW_FORM_data16 = 0x1E
DW_FORM_line_strp = 0x1F
DW_FORM_ref_sig8 = 0x20
DW_FORM_implicit_const = 0x21
DW_FORM_loclistx = 0x22
DW_FORM_rnglistx = 0x23
DW_FORM_ref_sup8 = 0x24
DW_FORM_strx1, DW_FORM_strx2, DW_FORM_strx3, DW_FORM_strx4 = 0x25, 0x26, 0x27, 0x28
DW_FORM_addrx1, DW_FORM_addrx2, DW_FORM_addrx3, DW_FORM_addrx4 = 0x29, 0x2A, 0x2B, 0x2C
DW_FORM_GNU_addr_index, DW_FORM_GNU_str_index = 0x1F01, 0x1F02
DW_FORM_GNU_ref_alt, DW_FORM_GNU_strp_alt = 0x1F20, 0x1F21

_FIXED = {DW_FORM_data1: 1, DW_FORM_ref1: 1, DW_FORM_flag: 1, DW_FORM_strx1: 1,
          DW_FORM_addrx1: 1, DW_FORM_data2: 2, DW_FORM_ref2: 2, DW_FORM_strx2: 2,
          DW_FORM_addrx2: 2, DW_FORM_strx3: 3, DW_FORM_addrx3: 3, DW_FORM_data4: 4,
          DW_FORM_ref4: 4, DW_FORM_ref_sup4: 4, DW_FORM_strx4: 4, DW_FORM_addrx4: 4,
          DW_FORM_data8: 8, DW_FORM_ref8: 8, DW_FORM_ref_sig8: 8, DW_FORM_ref_sup8: 8,
          DW_FORM_data16: 16, DW_FORM_flag_present: 0, DW_FORM_implicit_const: 0}
_OFFSET_SIZED = (DW_FORM_strp, DW_FORM_sec_offset, DW_FORM_line_strp, DW_FORM_strp_sup,
                 DW_FORM_GNU_ref_alt, DW_FORM_GNU_strp_alt)
_ULEB = (DW_FORM_udata, DW_FORM_ref_udata, DW_FORM_strx, DW_FORM_addrx, DW_FORM_loclistx,
         DW_FORM_rnglistx, DW_FORM_GNU_addr_index, DW_FORM_GNU_str_index)
_ADDRX = (DW_FORM_addrx, DW_FORM_addrx1, DW_FORM_addrx2, DW_FORM_addrx3, DW_FORM_addrx4,
          DW_FORM_GNU_addr_index)
_STRX = (DW_FORM_strx, DW_FORM_strx1, DW_FORM_strx2, DW_FORM_strx3, DW_FORM_strx4,
         DW_FORM_GNU_str_index)


@dataclass(frozen=True, slots=True)
class _Unit:
    version: int
    offset_size: int
    address_size: int


def _form_value(r: DwarfReader, form: int, unit: _Unit, implicit: int) -> int | bytes:
    """An attribute's raw value: an int (constants, offsets, references, indices) or bytes
    (inline strings and blocks)."""
    if form == DW_FORM_indirect:
        return _form_value(r, r.uleb(), unit, implicit)
    if form == DW_FORM_implicit_const:
        return implicit
    if form == DW_FORM_addr:
        return r.u(unit.address_size)
    if form in _FIXED:
        return r.u(_FIXED[form]) if _FIXED[form] <= 8 else r.take(_FIXED[form])
    if form in _OFFSET_SIZED:
        return r.u(unit.offset_size)
    if form == DW_FORM_ref_addr:
        return r.u(unit.address_size if unit.version == 2 else unit.offset_size)
    if form in _ULEB:
        return r.uleb()
    if form == DW_FORM_sdata:
        return r.sleb()
    if form == DW_FORM_string:
        return r.cstr()
    if form in (DW_FORM_block, DW_FORM_exprloc):
        return r.take(r.uleb())
    if form == DW_FORM_block1:
        return r.take(r.u(1))
    if form == DW_FORM_block2:
        return r.take(r.u(2))
    if form == DW_FORM_block4:
        return r.take(r.u(4))
    raise DwarfError(f"unknown attribute form {form:#x}")


# --- sections -----------------------------------------------------------------------------


ELFCOMPRESS_ZLIB = 1


def debug_section(image: ElfImage, name: str) -> bytes | None:
    """A debug section's bytes: as they are, or inflated when SHF_COMPRESSED with zlib (ELF
    gABI, Elf64_Chdr: gcc -gz); None when absent, empty, compressed another way (zstd) or
    damaged. An inflated section is kept for the next reader; a rewritten one is written
    uncompressed (rewriter/build.py)."""
    sec = image.section(name)
    if sec is None or not sec.size:
        return None
    if not sec.flags & SHF_COMPRESSED:
        return bytes(image.section_data(sec))
    key = f"inflated {name}"
    got = image.derived.get(key)
    if isinstance(got, tuple):
        kept = got[0]
        assert kept is None or isinstance(kept, bytes)
        return kept
    raw = bytes(image.section_data(sec))
    out: bytes | None = None
    if len(raw) >= 24 and int.from_bytes(raw[:4], "little") == ELFCOMPRESS_ZLIB:
        size = int.from_bytes(raw[8:16], "little")
        try:
            out = zlib.decompressobj().decompress(raw[24:], size + 1)
        except zlib.error:
            out = None
        if out is not None and len(out) != size:
            out = None
    image.derived[key] = (out,)
    return out


_section = debug_section


def compressed(image: ElfImage, name: str) -> bool:
    """Whether the section is there and SHF_COMPRESSED (written again, it is not)."""
    sec = image.section(name)
    return sec is not None and bool(sec.flags & SHF_COMPRESSED)


def has_dwarf(image: ElfImage) -> bool:
    """Whether the file carries line tables and compile units this module can extend
    (`.debug_info`, `.debug_abbrev` and `.debug_line`, uncompressed or zlib-compressed)."""
    return all(_section(image, n) is not None for n in (".debug_info", ".debug_abbrev",
                                                         ".debug_line"))


# --- line tables --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LineRow:
    address: int
    file: str
    line: int
    column: int
    end: bool  # end_sequence: the address just past the sequence
    is_stmt: bool = True
    unit: int = 0  # its program: an index into LineTable.units


@dataclass(frozen=True, slots=True)
class LineState:
    """One row of a line program as its state machine makes it (DWARF 5, 6.2.2), the file
    by its number in the unit's table: what re-encoding the program needs."""

    address: int
    file: int
    line: int
    column: int
    is_stmt: bool
    end: bool = False
    basic_block: bool = False
    prologue_end: bool = False
    epilogue_begin: bool = False
    isa: int = 0
    discriminator: int = 0


@dataclass(frozen=True, slots=True)
class LineUnit:
    """One line program of `.debug_line`: where it lies, the header fields its opcodes
    depend on, and its rows in program order. `program` is where the opcodes start; the
    bytes from the unit's version field to `program` are its header, copied as they are when
    the program is written again."""

    offset: int
    end: int
    offset_size: int
    version: int
    program: int
    address_size: int
    min_inst: int
    max_ops: int
    default_is_stmt: bool
    opcode_base: int
    rows: tuple[LineState, ...]
    files: tuple[str, ...]  # the file table's names, by number
    # why the program cannot be written again from its rows (DW_LNE_define_file, VLIW), or ""
    unwritable: str = ""


@dataclass
class LineTable:
    """Every row of every line program, sorted by address; `lookup` is addr2line's answer.
    `units` keeps each program's rows for rewriting it (`edit_line_programs`)."""

    rows: list[LineRow] = field(default_factory=list)
    _addresses: list[int] = field(default_factory=list)
    # each opcode (or unit version) outside usdtpatch.elf.model's tables, with where it is
    unknown: list[str] = field(default_factory=list)
    units: list[LineUnit] = field(default_factory=list)

    def finish(self) -> None:
        # an end row before a start at the same address, so that lookups take the start
        self.rows.sort(key=lambda r: (r.address, not r.end))
        self._addresses = [r.address for r in self.rows]

    def lookup(self, address: int) -> LineRow | None:
        """The row in force at `address`: the last one at or before it, unless that one
        ends a sequence."""
        i = bisect_right(self._addresses, address) - 1
        while i >= 0 and self.rows[i].address == address and self.rows[i].end:
            i -= 1  # several rows at one address: an end row never answers
        if i < 0 or self.rows[i].end:
            return None
        return self.rows[i]

    def at(self, address: int) -> list[LineRow]:
        """The rows (not ends of sequences) that start at `address`, in program order."""
        lo, hi = bisect_left(self._addresses, address), bisect_right(self._addresses, address)
        return [r for r in self.rows[lo:hi] if not r.end]

    def inside(self, start: int, end: int) -> list[LineRow]:
        """The rows (not ends of sequences) at an address strictly inside (start, end): where a
        debugger would put a breakpoint inside a window."""
        lo, hi = bisect_right(self._addresses, start), bisect_left(self._addresses, end)
        return [r for r in self.rows[lo:hi] if not r.end]


_DW_LNCT_path, _DW_LNCT_directory_index = 1, 2


def _entry_formats(r: DwarfReader) -> list[tuple[int, int]]:
    return [(r.uleb(), r.uleb()) for _ in range(r.u(1))]


def _string_form(value: int | bytes, form: int, strs: dict[int, bytes | None]) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    data = strs.get(form)
    if data is None:
        raise DwarfError(f"a string of form {form:#x} and no section to read it from")
    return _cstring(data, value).decode("utf-8", "surrogateescape")


def _v5_entries(r: DwarfReader, unit: _Unit, strs: dict[int, bytes | None]
                ) -> list[tuple[str, int]]:
    """(path, directory index) of each entry of a v5 directory or file name table."""
    formats = _entry_formats(r)
    out = []
    for _ in range(r.uleb()):
        path, index = "", 0
        for content, form in formats:
            value = _form_value(r, form, unit, 0)
            if content == _DW_LNCT_path:
                path = _string_form(value, form, strs)
            elif content == _DW_LNCT_directory_index and isinstance(value, int):
                index = value
        out.append((path, index))
    return out


def _join(directory: str, name: str) -> str:
    if name.startswith("/") or not directory:
        return name
    return directory.rstrip("/") + "/" + name


def read_line_table(image: ElfImage, comp_dirs: dict[int, str] | None = None,
                    data: bytes | None = None) -> LineTable:
    """The rows of every line program in `.debug_line` (file names joined with their
    directory; a v2-4 directory 0 is the unit's DW_AT_comp_dir, from `comp_dirs` keyed by
    the program's offset). `data`: the section's bytes where the caller has them (a
    compressed section inflated: `debug_section`)."""
    if data is None:
        data = _section(image, ".debug_line")
    table = LineTable()
    if data is None:
        return table
    strs = {DW_FORM_strp: debug_section(image, ".debug_str"),
            DW_FORM_line_strp: debug_section(image, ".debug_line_str")}
    for start, r, osize, end, version in _units(data, ".debug_line"):
        if not 2 <= version <= 5:
            table.unknown.append(f"line table version {version} at .debug_line+{start:#x}")
            continue  # a version this reader does not know: its rows are left out
        address_size = 8
        if version >= 5:
            address_size = r.u(1)
            r.u(1)  # segment selector size
        header_length = r.u(osize)
        program = r.pos + header_length
        min_inst = r.u(1)
        max_ops = r.u(1) if version >= 4 else 1
        default_is_stmt = bool(r.u(1))
        line_base, line_range, opcode_base = r.s8(), r.u(1), r.u(1)
        if not line_range:
            raise DwarfError(f".debug_line unit at {start:#x}: line_range 0")
        lengths = [r.u(1) for _ in range(opcode_base - 1)]
        unit = _Unit(version, osize, address_size)
        comp_dir = (comp_dirs or {}).get(start, "")
        if version >= 5:
            dirs = [p for p, _ in _v5_entries(r, unit, strs)]
            files = [_join(dirs[d] if d < len(dirs) else "", p)
                     for p, d in _v5_entries(r, unit, strs)]
        else:
            dirs = [comp_dir]
            while (dname := r.cstr()):
                dirs.append(_join(comp_dir, dname.decode("utf-8", "surrogateescape")))
            files = [""]  # v2-4 file numbers start at 1
            while (fname := r.cstr()):
                di = r.uleb()
                r.uleb()
                r.uleb()
                files.append(_join(dirs[di] if di < len(dirs) else "",
                                   fname.decode("utf-8", "surrogateescape")))
        rows, unwritable = _run_program(
            DwarfReader(data[:end], program), _Params(min_inst=min_inst, max_ops=max_ops,
                                                      default_is_stmt=default_is_stmt,
                                                      line_base=line_base, line_range=line_range,
                                                      opcode_base=opcode_base,
                                                      lengths=tuple(lengths),
                                                      address_size=address_size),
            table.unknown)
        if max_ops != 1:
            unwritable = "a VLIW line program (maximum_operations_per_instruction > 1)"
        for st in rows:
            name = files[st.file] if 0 <= st.file < len(files) else ""  # as _file_name
            table.rows.append(LineRow(address=st.address, file=name, line=st.line, column=st.column,
                                      end=st.end, is_stmt=st.is_stmt, unit=len(table.units)))
        table.units.append(LineUnit(offset=start, end=end, offset_size=osize, version=version,
                                    program=program, address_size=address_size, min_inst=min_inst,
                                    max_ops=max_ops, default_is_stmt=default_is_stmt,
                                    opcode_base=opcode_base, rows=tuple(rows), files=tuple(files),
                                    unwritable=unwritable))
    table.finish()
    return table


@dataclass(frozen=True, slots=True)
class _Params:
    min_inst: int
    max_ops: int
    default_is_stmt: bool
    line_base: int
    line_range: int
    opcode_base: int
    lengths: tuple[int, ...]
    address_size: int


def _run_program(r: DwarfReader, p: _Params, unknown: list[str]
                 ) -> tuple[list[LineState], str]:
    """The rows of one line program (DWARF 5, 6.2.5), and why it cannot be written again
    from them ("" when it can); each opcode outside usdtpatch.elf.model's tables is added to
    `unknown` with where it is. The registers are locals (this runs once per opcode of every
    program of the file: check reads them)."""
    rows: list[LineState] = []
    unwritable = ""
    data, base, line_range, min_inst = r.data, p.opcode_base, p.line_range, p.min_inst
    address, file, line, column, is_stmt, isa = 0, 1, 1, 0, p.default_is_stmt, 0
    basic_block = prologue_end = epilogue_begin = False
    discriminator = 0
    const_add = ((255 - base) // line_range) * min_inst
    while r.pos < len(data):
        op = data[r.pos]
        r.pos += 1
        if op >= base or op == 1 or (op == 0 and r.pos < len(data) and data[r.pos] == 1
                                     and r.pos + 1 < len(data) and data[r.pos + 1] == 1):
            end = False
            if op >= base:
                adj = op - base
                address += (adj // line_range) * min_inst
                line += p.line_base + adj % line_range
            elif op == 0:  # end_sequence (length 1)
                r.pos += 2
                end = True
            rows.append(LineState(address=address, file=file, line=line, column=column,
                                  is_stmt=is_stmt, end=end, basic_block=basic_block,
                                  prologue_end=prologue_end, epilogue_begin=epilogue_begin, isa=isa,
                                  discriminator=discriminator))
            basic_block = prologue_end = epilogue_begin = False
            discriminator = 0
            if end:
                address, file, line, column, is_stmt, isa = 0, 1, 1, 0, p.default_is_stmt, 0
        elif op == 0:
            n = r.uleb()
            sub_end = r.pos + n
            sub = r.u(1) if n else 0
            if sub not in LINE_EXTENDED_OPCODES and not 0x80 <= sub <= 0xFF:
                unknown.append(f"extended opcode {sub:#x} at .debug_line+{sub_end - n:#x}")
            if sub == 1:  # end_sequence, written with a longer length
                rows.append(LineState(address=address, file=file, line=line, column=column,
                                      is_stmt=is_stmt, end=True, basic_block=basic_block,
                                      prologue_end=prologue_end, epilogue_begin=epilogue_begin,
                                      isa=isa, discriminator=discriminator))
                address, file, line, column, is_stmt, isa = 0, 1, 1, 0, p.default_is_stmt, 0
                basic_block = prologue_end = epilogue_begin = False
                discriminator = 0
            elif sub == 2:  # set_address
                address = r.u(p.address_size)
            elif sub == 3:  # define_file (v2-4)
                unwritable = "DW_LNE_define_file"
            elif sub == 4:  # set_discriminator
                discriminator = r.uleb()
            r.pos = sub_end
        elif op == 2:
            address += r.uleb() * min_inst
        elif op == 3:
            line += r.sleb()
        elif op == 4:
            file = r.uleb()
        elif op == 5:
            column = r.uleb()
        elif op == 6:
            is_stmt = not is_stmt
        elif op == 7:
            basic_block = True
        elif op == 8:  # const_add_pc
            address += const_add
        elif op == 9:
            address += r.u(2)
        elif op == 10:
            prologue_end = True
        elif op == 11:
            epilogue_begin = True
        elif op == 12:
            isa = r.uleb()
        else:  # an opcode this reader does not know: skip its arguments
            if op not in LINE_STANDARD_OPCODES:
                unknown.append(f"standard opcode {op} at .debug_line+{r.pos - 1:#x}")
            for _ in range(p.lengths[op - 1] if op - 1 < len(p.lengths) else 0):
                r.uleb()
    return rows, unwritable


def _encode_rows(unit: LineUnit, rows: Sequence[LineState]) -> bytes:
    """A line program making `rows` (each sequence ended by an end row) with the unit's
    header: DW_LNE_set_address at each sequence's start (and where an address would go
    back), standard opcodes for the rest."""
    out = bytearray()
    st: LineState | None = None
    for row in rows:
        if st is None:
            st = LineState(address=row.address, file=1, line=1, column=0,
                           is_stmt=unit.default_is_stmt)
            out += b"\0" + uleb(1 + unit.address_size) + b"\x02" + \
                row.address.to_bytes(unit.address_size, "little")
        delta = row.address - st.address
        if delta < 0 or (delta and (unit.min_inst != 1)):
            out += b"\0" + uleb(1 + unit.address_size) + b"\x02" + \
                row.address.to_bytes(unit.address_size, "little")
        elif delta:
            out += b"\x02" + uleb(delta)
        if row.file != st.file:
            out += b"\x04" + uleb(row.file)
        if row.line != st.line:
            out += b"\x03" + sleb(row.line - st.line)
        if row.column != st.column:
            out += b"\x05" + uleb(row.column)
        if row.is_stmt != st.is_stmt:
            out += b"\x06"
        if row.isa != st.isa and unit.opcode_base > 12:
            out += b"\x0c" + uleb(row.isa)
        if row.discriminator:
            out += b"\0" + uleb(1 + len(uleb(row.discriminator))) + b"\x04" + \
                uleb(row.discriminator)
        if row.basic_block:
            out += b"\x07"
        if row.prologue_end and unit.opcode_base > 10:
            out += b"\x0a"
        if row.epilogue_begin and unit.opcode_base > 11:
            out += b"\x0b"
        if row.end:
            out += b"\0\x01\x01"
            st = None
        else:
            out += b"\x01"
            st = replace(row, basic_block=False, prologue_end=False, epilogue_begin=False,
                         discriminator=0)
    return bytes(out)


def _no_op_program(length: int) -> bytes:
    """`length` (>= 2) bytes of DW_LNS_advance_pc 0 that make no row: an old program's place
    once its unit has been written again elsewhere (its header stays for whatever else reads
    its file table)."""
    out = bytearray()
    while length:
        n = min(length, 8)
        if length - n == 1:
            n -= 1
        out += b"\x02" + b"\x80" * (n - 2) + b"\x00"
        length -= n
    return bytes(out)


@dataclass(frozen=True, slots=True)
class LineMove:
    """What a rewritten window does to the line rows in it: a window whose instructions left
    for a detour (or were written over in place) drops every row strictly inside (start,
    end) (the detour's unit has them), and a row in force past the window's end is started
    again at `end`; a re-laid window (`moved`: original address -> new address of each
    instruction) moves each row to its instruction's new address."""

    start: int
    end: int
    moved: tuple[tuple[int, int], ...] | None = None
    # the [low, high) of the window's function (its subprogram, else its FDE or symbol):
    # where a debugger's `break FILE:LINE` picks one statement row per line
    scope: tuple[int, int] | None = None
    # whether the window's instructions have copies in a detour (whose unit has the rows);
    # False for a NOP run written over in place: its rows go, nothing else changes
    detour: bool = True
    # the [low, high) of the lexical blocks and inlined subroutines in `scope`
    # (DebugInfo.blocks): gdb picks one statement row per line and innermost block
    blocks: tuple[tuple[int, int], ...] = ()

    def block_of(self, address: int) -> tuple[int, int] | None:
        """The innermost block (of `blocks`, else `scope`) holding `address`."""
        best = self.scope if self.scope is not None and \
            self.scope[0] <= address < self.scope[1] else None
        for lo, hi in self.blocks:
            if lo <= address < hi and (best is None or hi - lo < best[1] - best[0]):
                best = (lo, hi)
        return best


def picked_statements(table: LineTable, mv: LineMove) -> list[LineRow]:
    """The statement rows strictly inside a window left for a detour that a debugger's
    `break FILE:LINE` picks: gdb takes, per line and innermost block (a lexical block, an
    inlined subroutine, else the function), the first statement row of the line
    (linespec.c filters the others of the same block); a row inside the window is that
    first one when no statement row of its file and line lies in its block before it (the
    window's start included: its row stays, at the `jmp`). Their copies in the detour are
    statements; the later statement rows of their lines in the block are no more
    (`edit_line_programs`), so that the breakpoint is hit once, as before."""
    lo = mv.scope[0] if mv.scope is not None else mv.start
    before = [r for r in table.rows[bisect_left(table._addresses, lo):
                                    bisect_right(table._addresses, mv.start)]
              if r.is_stmt and not r.end]
    out: list[LineRow] = []
    for row in table.inside(mv.start, mv.end):
        block = mv.block_of(row.address)
        key = (row.unit, row.file, row.line)
        if not row.is_stmt or any((o.unit, o.file, o.line) == key and
                                  mv.block_of(o.address) == block for o in out):
            continue
        if any((r.unit, r.file, r.line) == key and mv.block_of(r.address) == block
               for r in before):
            continue
        out.append(row)
    return out


def _file_name(unit: LineUnit, number: int) -> str:
    return unit.files[number] if 0 <= number < len(unit.files) else ""


def _moved_rows(unit: LineUnit, moves: Sequence[LineMove],
                picked: dict[LineMove, set[tuple[str, int, tuple[int, int] | None]]]
                ) -> list[LineState]:
    """The unit's rows with every move applied; `picked`: per move, the (file, line, block)
    of its picked statements (picked_statements)."""
    rows = unit.rows
    out = list(rows)
    for mv in moves:
        new: list[LineState] = []
        mapping = dict(mv.moved) if mv.moved is not None else None
        keys = picked.get(mv, set())
        hi = mv.scope[1] if mv.scope is not None else mv.end
        for i, row in enumerate(out):
            if keys and mv.end <= row.address < hi and row.is_stmt and not row.end and \
                    (_file_name(unit, row.file), row.line, mv.block_of(row.address)) in keys:
                new.append(replace(row, is_stmt=False))  # the detour's copy is the statement
            elif not (mv.start < row.address < mv.end and not row.end):
                new.append(row)
            elif mapping is not None:
                if row.address in mapping:  # else not an instruction's start: it goes
                    new.append(replace(row, address=mapping[row.address]))
            elif i + 1 < len(out) and out[i + 1].address > mv.end:
                # in force past the window's end: started again there, not as a statement
                # (no breakpoint goes there: the detour's unit has the statement)
                new.append(replace(row, address=mv.end, is_stmt=False, basic_block=False,
                                   prologue_end=False, epilogue_begin=False))
        out = new
    return out


def edit_line_programs(data: bytes, table: LineTable, moves: Sequence[LineMove]
                       ) -> tuple[bytes, dict[int, int]]:
    """`.debug_line` (`data`) with each program that has a row inside a moved window written
    again (`LineMove`) at the section's end, its header copied as it is; the old program's
    opcodes become no-ops (its header stays, for a type unit or `.debug_macro` that names
    its file table). Returns the section and {old unit offset: new offset} for the compile
    units' DW_AT_stmt_list. DwarfError when a program that must change cannot be written
    again."""
    out = bytearray(data)
    moved: dict[int, int] = {}
    for index, unit in enumerate(table.units):
        mine = [mv for mv in moves if any(mv.start < r.address < mv.end and not r.end
                                          for r in unit.rows)]
        if not mine:
            continue
        if unit.unwritable:
            raise DwarfError(f"the line program at {unit.offset:#x} cannot be written "
                             f"again: {unit.unwritable}")
        picked = {mv: {(r.file, r.line, mv.block_of(r.address))
                       for r in picked_statements(table, mv) if r.unit == index}
                  for mv in mine if mv.moved is None and mv.detour}
        program = _encode_rows(unit, _moved_rows(unit, mine, picked))
        header = data[unit.offset + (4 if unit.offset_size == 4 else 12) : unit.program]
        body = header + program
        at = len(out)
        if at + len(body) + 12 >= 1 << (8 * unit.offset_size):
            raise DwarfError("the rewritten .debug_line would pass its offsets' reach")
        out += (struct.pack("<I", len(body)) if unit.offset_size == 4 else
                b"\xff\xff\xff\xff" + struct.pack("<Q", len(body))) + body
        if unit.end - unit.program < 2:
            raise DwarfError(f"the line program at {unit.offset:#x} is too short to clear")
        out[unit.program : unit.end] = _no_op_program(unit.end - unit.program)
        moved[unit.offset] = at
    return bytes(out), moved


# --- compile units and subprograms --------------------------------------------------------

DW_TAG_compile_unit = 0x11
DW_TAG_partial_unit = 0x3C
DW_TAG_subprogram = 0x2E
DW_AT_name, DW_AT_stmt_list, DW_AT_low_pc, DW_AT_high_pc = 0x03, 0x10, 0x11, 0x12
DW_AT_language, DW_AT_comp_dir, DW_AT_producer = 0x13, 0x1B, 0x25
DW_AT_abstract_origin, DW_AT_str_offsets_base, DW_AT_addr_base = 0x31, 0x72, 0x73
DW_AT_external = 0x3F


@dataclass(frozen=True, slots=True)
class Subprogram:
    """A DW_TAG_subprogram with a [low, high) code range: its DIE's offset in .debug_info."""

    low: int
    high: int
    die: int
    unit: int  # index into DebugInfo.units


@dataclass(frozen=True, slots=True)
class CompileUnit:
    offset: int
    name: str
    comp_dir: str
    language: int
    stmt_list: int | None
    # where DW_AT_stmt_list's value lies in .debug_info and its size (a fixed-size form), or
    # None: what repointing the unit at a line program written again edits
    stmt_list_at: tuple[int, int] | None = None


# the DIEs whose address a debugger makes a breakpoint of (`break inlined_fn`, `break label`)
DW_TAG_label, DW_TAG_lexical_block, DW_TAG_inlined_subroutine = 0x0A, 0x0B, 0x1D
DW_AT_entry_pc = 0x52
_BREAKPOINT_TAGS = {DW_TAG_label: "DW_TAG_label", DW_TAG_inlined_subroutine:
                    "DW_TAG_inlined_subroutine"}


@dataclass
class DebugInfo:
    units: list[CompileUnit] = field(default_factory=list)
    subprograms: list[Subprogram] = field(default_factory=list)
    # (address, what) of each DIE a debugger sets a breakpoint at: an inlined subroutine's
    # DW_AT_entry_pc or DW_AT_low_pc, a label's DW_AT_low_pc (DW_FORM_addr or addrx)
    breakpoints: list[tuple[int, str]] = field(default_factory=list)
    # [low, high) of each DW_TAG_lexical_block and DW_TAG_inlined_subroutine given by
    # DW_AT_low_pc and DW_AT_high_pc (not DW_AT_ranges): gdb's blocks inside a function
    blocks: list[tuple[int, int]] = field(default_factory=list)

    def blocks_in(self, low: int, high: int) -> tuple[tuple[int, int], ...]:
        return tuple(b for b in self.blocks if low <= b[0] and b[1] <= high)

    def subprogram_at(self, address: int) -> Subprogram | None:
        """The innermost (smallest) subprogram whose range holds `address`."""
        best = None
        for sp in self.subprograms:
            if sp.low <= address < sp.high and (best is None or
                                                sp.high - sp.low < best.high - best.low):
                best = sp
        return best


def _abbrevs(data: bytes, offset: int
             ) -> dict[int, tuple[int, bool, list[tuple[int, int, int]]]]:
    r = DwarfReader(data, offset)
    out: dict[int, tuple[int, bool, list[tuple[int, int, int]]]] = {}
    while (code := r.uleb()):
        tag, children = r.uleb(), bool(r.u(1))
        attrs = []
        while True:
            name, form = r.uleb(), r.uleb()
            if not name and not form:
                break
            attrs.append((name, form, r.sleb() if form == DW_FORM_implicit_const else 0))
        out[code] = (tag, children, attrs)
    return out


_Attrs = dict[int, tuple[int, int | bytes]]  # attribute -> (form, raw value)


@dataclass(frozen=True, slots=True)
class _CuStrings:
    """What reading a DIE's strings and addresses needs of its unit."""

    cu_attrs: _Attrs
    offset_size: int
    address_size: int
    debug_str: bytes | None
    line_str: bytes | None
    str_offsets: bytes | None
    debug_addr: bytes | None

    def string(self, attr: int) -> str:
        """The unit DIE's string attribute `attr` ("" when absent or unreadable)."""
        if attr not in self.cu_attrs:
            return ""
        form, value = self.cu_attrs[attr]
        if form in _STRX:
            base = self.cu_attrs.get(DW_AT_str_offsets_base, (0, 8))[1]
            if self.str_offsets is None or not isinstance(base, int) or \
                    not isinstance(value, int):
                return ""
            at = base + value * self.offset_size
            value = int.from_bytes(self.str_offsets[at : at + self.offset_size], "little")
            form = DW_FORM_strp
        return _string_form(value, form, {DW_FORM_strp: self.debug_str,
                                          DW_FORM_line_strp: self.line_str})

    def address(self, values: _Attrs, attr: int = DW_AT_low_pc) -> int | None:
        """DW_AT_low_pc (or `attr`, an address) of a DIE (through `.debug_addr` for
        DW_FORM_addrx*); None for a constant (DWARF 5's DW_AT_entry_pc offset)."""
        form, value = values[attr]
        if not isinstance(value, int) or (form != DW_FORM_addr and form not in _ADDRX):
            return None
        if form in _ADDRX:
            base = self.cu_attrs.get(DW_AT_addr_base, (0, 8))[1]
            if self.debug_addr is None or not isinstance(base, int):
                return None
            at = base + value * self.address_size
            return int.from_bytes(self.debug_addr[at : at + self.address_size], "little")
        return value


def read_debug_info(image: ElfImage) -> DebugInfo:
    """Every compile unit of `.debug_info` and every subprogram with a code range."""
    info, abbrev = _section(image, ".debug_info"), _section(image, ".debug_abbrev")
    out = DebugInfo()
    if info is None or abbrev is None:
        return out
    debug_str, line_str = _section(image, ".debug_str"), _section(image, ".debug_line_str")
    str_offsets, debug_addr = _section(image, ".debug_str_offsets"), _section(image,
                                                                             ".debug_addr")
    for start, r, osize, end, version in _units(info, ".debug_info"):
        if version >= 5:
            unit_type, address_size, abbrev_offset = r.u(1), r.u(1), r.u(osize)
            if unit_type not in (1, 3):  # compile and partial units only
                continue
        elif 2 <= version <= 4:
            abbrev_offset, address_size = r.u(osize), r.u(1)
        else:
            continue
        unit = _Unit(version, osize, address_size)
        table = _abbrevs(abbrev, abbrev_offset)
        cu_attrs: _Attrs = {}
        pending: list[tuple[int, _Attrs]] = []
        marks: list[tuple[int, int, _Attrs]] = []
        stmt_at: tuple[int, int] | None = None
        depth = 0
        while r.pos < end:
            die = r.pos
            code = r.uleb()
            if not code:
                depth -= 1
                continue
            if code not in table:
                raise DwarfError(f".debug_info DIE at {die:#x}: abbreviation {code} unknown")
            tag, children, attrs = table[code]
            values: _Attrs = {}
            for name, form, implicit in attrs:
                at = r.pos
                values[name] = (form, _form_value(r, form, unit, implicit))
                # where the unit's line program offset is stored, when it has a fixed size:
                # a rewrite that edits .debug_line moves the programs and repoints them there
                if name == DW_AT_stmt_list and depth == 0 and r.pos - at in (4, 8) and \
                        form in (DW_FORM_sec_offset, DW_FORM_data4, DW_FORM_data8):
                    stmt_at = (at, r.pos - at)
            # The addresses and names are read after the unit: DWARF 5's addrx and strx forms
            # index .debug_addr and .debug_str_offsets from the bases the unit's DIE gives.
            if depth == 0 and tag in (DW_TAG_compile_unit, DW_TAG_partial_unit):
                cu_attrs = values
            elif tag == DW_TAG_subprogram and DW_AT_low_pc in values:
                pending.append((die, values))
            elif (tag in _BREAKPOINT_TAGS and (DW_AT_low_pc in values or
                                              DW_AT_entry_pc in values)) or \
                    (tag == DW_TAG_lexical_block and DW_AT_low_pc in values):
                marks.append((die, tag, values))
            if children:
                depth += 1
        unit_index = len(out.units)
        cu = _CuStrings(cu_attrs=cu_attrs, offset_size=osize, address_size=address_size,
                        debug_str=debug_str, line_str=line_str, str_offsets=str_offsets,
                        debug_addr=debug_addr)
        stmt = cu_attrs.get(DW_AT_stmt_list, (0, None))[1]
        lang = cu_attrs.get(DW_AT_language, (0, 0))[1]
        out.units.append(CompileUnit(offset=start, name=cu.string(DW_AT_name),
                                     comp_dir=cu.string(DW_AT_comp_dir),
                                     language=lang if isinstance(lang, int) else 0,
                                     stmt_list=stmt if isinstance(stmt, int) else None,
                                     stmt_list_at=stmt_at))
        # Lexical blocks and inlined subroutines bound the scopes gdb picks a line's row in;
        # labels and inlined subroutines are also breakpoint addresses (their entry pc first).
        for die, tag, values in marks:
            low = cu.address(values) if DW_AT_low_pc in values else None
            if low is not None and DW_AT_high_pc in values and \
                    isinstance(high := values[DW_AT_high_pc][1], int):
                out.blocks.append((low, high if values[DW_AT_high_pc][0] == DW_FORM_addr
                                   else low + high))
            if tag == DW_TAG_lexical_block:
                continue
            for attr in (DW_AT_entry_pc, DW_AT_low_pc):
                got = cu.address(values, attr) if attr in values else None
                if got is not None:
                    what = "DW_AT_entry_pc" if attr == DW_AT_entry_pc else "DW_AT_low_pc"
                    out.breakpoints.append((got, f"the {what} of the {_BREAKPOINT_TAGS[tag]} "
                                                 f"at .debug_info {die:#x}"))
                    break
        for die, values in pending:
            low = cu.address(values)
            if low is None or DW_AT_high_pc not in values:
                continue
            form, high = values[DW_AT_high_pc]
            if not isinstance(high, int):
                continue
            if form != DW_FORM_addr:  # a constant: the length (DWARF 4+)
                high = low + high
            out.subprograms.append(Subprogram(low, high, die, unit_index))
    return out


# --- writing: one compile unit for the detours --------------------------------------------


@dataclass(frozen=True, slots=True)
class DetourLines:
    """One detour: its [start, end), the original function's DIE (or None, then `name`
    names it), and (detour address, file, line, column, is_stmt) per row of a moved
    instruction."""

    start: int
    end: int
    origin: int | None
    name: str
    rows: tuple[tuple[int, str, int, int, bool], ...]


@dataclass(frozen=True, slots=True)
class DetourDwarf:
    """The grown sections: each the original's bytes with the new unit appended."""

    debug_info: bytes
    debug_abbrev: bytes
    debug_line: bytes
    debug_aranges: bytes | None


PRODUCER = b"usdtpatch (detours of moved USDT probe windows)"


def _abbrev_table() -> bytes:
    def entry(code: int, tag: int, children: bool, attrs: Sequence[tuple[int, int]]) -> bytes:
        return uleb(code) + uleb(tag) + bytes([children]) + b"".join(
            uleb(a) + uleb(f) for a, f in attrs) + b"\0\0"

    return b"".join([
        entry(1, DW_TAG_compile_unit, True,
              [(DW_AT_producer, DW_FORM_string), (DW_AT_name, DW_FORM_string),
               (DW_AT_comp_dir, DW_FORM_string), (DW_AT_language, DW_FORM_data2),
               (DW_AT_low_pc, DW_FORM_addr), (DW_AT_high_pc, DW_FORM_data8),
               (DW_AT_stmt_list, DW_FORM_sec_offset)]),
        entry(2, DW_TAG_subprogram, False,
              [(DW_AT_abstract_origin, DW_FORM_ref_addr), (DW_AT_low_pc, DW_FORM_addr),
               (DW_AT_high_pc, DW_FORM_data8)]),
        entry(3, DW_TAG_subprogram, False,
              [(DW_AT_name, DW_FORM_string), (DW_AT_external, DW_FORM_flag_present),
               (DW_AT_low_pc, DW_FORM_addr), (DW_AT_high_pc, DW_FORM_data8)]),
    ]) + b"\0"


def _line_program(detours: Sequence[DetourLines]) -> bytes:
    """A DWARF 4 line program: one sequence per detour, absolute file names."""
    names = sorted({f for d in detours for _a, f, _l, _c, _s in d.rows})
    dirs = sorted({n.rsplit("/", 1)[0] for n in names if "/" in n})
    dir_index = {dn: i + 1 for i, dn in enumerate(dirs)}
    file_index = {n: i + 1 for i, n in enumerate(names)}
    line_base, line_range, opcode_base = -5, 14, 13
    header = bytearray([1, 1, 1, line_base & 0xFF, line_range, opcode_base])
    header += bytes([0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1])  # standard opcode lengths
    for dn in dirs:
        header += dn.encode("utf-8", "surrogateescape") + b"\0"
    header += b"\0"
    for n in names:
        dn, base = n.rsplit("/", 1) if "/" in n else ("", n)
        header += base.encode("utf-8", "surrogateescape") + b"\0" + uleb(dir_index.get(dn, 0))
        header += b"\0\0"
    header += b"\0"
    program = bytearray()
    for d in detours:
        program += b"\0" + uleb(9) + b"\x02" + struct.pack("<Q", d.start)
        address, file, line, column, stmt = d.start, 1, 1, 0, True
        for at, name, ln, col, is_stmt in d.rows:
            if at > address:
                program += b"\x02" + uleb(at - address)
                address = at
            if file_index[name] != file:
                file = file_index[name]
                program += b"\x04" + uleb(file)
            if ln != line:
                program += b"\x03" + sleb(ln - line)
                line = ln
            if col != column:
                program += b"\x05" + uleb(col)
                column = col
            if is_stmt != stmt:
                program += b"\x06"
                stmt = is_stmt
            program += b"\x01"
        program += b"\x02" + uleb(d.end - address) + b"\0\x01\x01"
    body = struct.pack("<H", 4) + struct.pack("<I", len(header)) + bytes(header) + program
    return struct.pack("<I", len(body)) + body


@dataclass(frozen=True, slots=True)
class DwarfToExtend:
    """The input's compile units and line table, as build_detour_dwarf's caller reads them
    (read_for_detours)."""

    info: DebugInfo
    lines: LineTable

    def unmovable(self, row: LineRow) -> str | None:
        """Why `row`'s program cannot be written again with the row moved, or None."""
        unit = self.lines.units[row.unit]
        if unit.unwritable:
            return unit.unwritable
        if any(u.stmt_list == unit.offset and u.stmt_list_at is None for u in self.info.units):
            return "a compile unit names it by a DW_AT_stmt_list of variable size"
        return None


def read_for_detours(image: ElfImage) -> DwarfToExtend | str | None:
    """The file's DWARF for the detours' compile unit and the line programs written again;
    None where it has none (no `.debug_info`), or why it cannot be extended: compressed,
    past 4 GiB, or unreadable (the reader's error). Read once per image."""
    got = image.derived.get("dwarf")
    if got is None:
        got = (_read_for_detours(image),)
        image.derived["dwarf"] = got
    assert isinstance(got, tuple)
    out = got[0]
    assert out is None or isinstance(out, (DwarfToExtend, str))
    return out


def _read_for_detours(image: ElfImage) -> DwarfToExtend | str | None:
    sec = image.section(".debug_info")
    if sec is None or not sec.size:
        return None
    if not has_dwarf(image):
        return ("its .debug_info, .debug_abbrev or .debug_line is missing, damaged or "
                "compressed other than with zlib")
    if any(len(d) >= 1 << 32 for n in (".debug_info", ".debug_abbrev", ".debug_line")
           if (d := debug_section(image, n)) is not None):
        return "a debug section is past 4 GiB: 32-bit DWARF offsets cannot reach it"
    try:
        info = read_debug_info(image)
        lines = read_line_table(image, {u.stmt_list: u.comp_dir for u in info.units
                                        if u.stmt_list is not None})
    except DwarfError as exc:
        return f"its DWARF cannot be read: {exc}"
    return DwarfToExtend(info, lines)


def build_detour_dwarf(image: ElfImage, detours: Sequence[DetourLines], low: int, high: int,
                       name: str, comp_dir: str, language: int,
                       read: DwarfToExtend | None = None,
                       moves: Sequence[LineMove] = ()) -> DetourDwarf:
    """The file's `.debug_info`, `.debug_abbrev`, `.debug_line` (and `.debug_aranges`, when
    it has one) with one compile unit appended that covers [low, high) (the new text), when
    there are `detours`; and with every line program that has a row inside a moved window
    (`moves`, read from `read`) written again at `.debug_line`'s end, its compile units'
    DW_AT_stmt_list repointed in place (edit_line_programs)."""
    info, abbrev, line = (_section(image, n) for n in (".debug_info", ".debug_abbrev",
                                                          ".debug_line"))
    if info is None or abbrev is None or line is None:
        raise DwarfError("the file has no readable .debug_info, .debug_abbrev and "
                         ".debug_line to extend")
    if read is not None and moves:
        line, repoint = edit_line_programs(line, read.lines, moves)
        edited = bytearray(info)
        for u in read.info.units:
            if u.stmt_list in repoint:
                if u.stmt_list_at is None:
                    raise DwarfError(f"the unit at {u.offset:#x} names its line program by a "
                                     f"DW_AT_stmt_list of variable size")
                at, size = u.stmt_list_at
                edited[at : at + size] = repoint[u.stmt_list].to_bytes(size, "little")
        info = bytes(edited)
    if not detours:
        return DetourDwarf(info, abbrev, line, None)
    abbrev_at, line_at, unit_at = len(abbrev), len(line), len(info)
    if max(abbrev_at, line_at, unit_at) >= 1 << 32:
        raise DwarfError("a debug section past 4 GiB: 32-bit DWARF offsets cannot reach it")
    dies = bytearray(uleb(1))
    for text in (PRODUCER, name.encode("utf-8", "surrogateescape"),
                 comp_dir.encode("utf-8", "surrogateescape")):
        dies += text + b"\0"
    dies += struct.pack("<HQQI", language, low, high - low, line_at)
    for d in detours:
        if d.origin is not None:
            dies += uleb(2) + struct.pack("<IQQ", d.origin, d.start, d.end - d.start)
        else:
            dies += uleb(3) + d.name.encode("utf-8", "surrogateescape") + b"\0"
            dies += struct.pack("<QQ", d.start, d.end - d.start)
    dies += b"\0"  # the end of the unit's children
    body = struct.pack("<HIB", 4, abbrev_at, 8) + bytes(dies)
    new_info = info + struct.pack("<I", len(body)) + body
    aranges = _section(image, ".debug_aranges")
    new_aranges = None
    if aranges is not None:
        tuples = b"".join(struct.pack("<QQ", d.start, d.end - d.start) for d in detours)
        body = struct.pack("<HIBB", 2, unit_at, 8, 0) + b"\0" * 4 + tuples + b"\0" * 16
        new_aranges = aranges + struct.pack("<I", len(body)) + body
    return DetourDwarf(new_info, abbrev + _abbrev_table(), line + _line_program(detours),
                       new_aranges)


__all__ = ["CompileUnit", "DebugInfo", "DetourDwarf", "DetourLines", "DwarfError",
           "LineMove", "LineRow", "LineState", "LineTable", "LineUnit", "Subprogram",
           "build_detour_dwarf", "compressed", "debug_section", "edit_line_programs", "has_dwarf",
           "read_debug_info", "read_line_table", "sleb", "uleb"]
