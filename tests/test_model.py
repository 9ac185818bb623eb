"""The model (usdtpatch/elf/model.py, issue 30 "one model of everything that can refer to
code"): every fixture and real binary the tests use needs nothing outside it, and a file
that uses a construct outside it is refused by name, by check and rewrite alike: one
hand-mutated copy of a fixture per kind of construct (an unknown relocation type in
.rela.dyn, dynamic tag, DT_FLAGS_1 bit, program header type, section type, allocated note,
GNU property, CIE augmentation letter; a call frame instruction of one FDE and an LSDA
encoding of one function, which refuse only that function's windows; a line-table version)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES, ROOT, fixture, fixture_files, run_cli
from usdtpatch.analysis.closed import file_unmodelled
from usdtpatch.elf.cfi import Cie, Fde, load_cfi
from usdtpatch.elf.ehframe import rows_at
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.elf.model import (
    CFA_OPERANDS,
    DYNAMIC_TAGS,
    RELOCATION_TYPES,
    SECTION_TYPES,
    SEGMENT_TYPES,
    cfa_program_unknown,
    dynamic_entries,
    loader_relocations,
)
from usdtpatch.errors import UnsupportedError

EM_X86_64 = 62


def _inputs() -> list[Path]:
    files = [p for p in fixture_files()]
    files += [p for p in REAL_BINARIES.values() if p.exists()]
    return files


@pytest.mark.parametrize("path", _inputs(), ids=lambda p: p.name)
def test_files_the_tests_use_need_nothing_outside_the_model(path: Path) -> None:
    data = path.read_bytes()
    if data[:4] != b"\x7fELF":
        pytest.skip("not an ELF file")
    image = parse_elf(data)
    if image.machine != EM_X86_64 or not image.is64:
        pytest.skip("not x86-64 ELF64")
    assert file_unmodelled(image) == ()


def test_the_tables_name_what_real_files_use() -> None:
    """The relocation types, tags, section and segment types libjvm.so uses are in the table
    by the names readelf gives them (an independent reader)."""
    path = REAL_BINARIES["libjvm"]
    if not path.exists():
        pytest.skip("needs OpenJDK 17's libjvm.so")
    image = parse_elf(path.read_bytes())
    rel = loader_relocations(image)
    text = subprocess.run(["readelf", "-rW", str(path)], capture_output=True, text=True,
                          check=True).stdout
    assert len(rel) == sum(1 for line in text.splitlines() if " R_X86_64_" in line)
    for t in set(rel.types):
        assert RELOCATION_TYPES[t].name in text
    for tag, _v, _o in dynamic_entries(image):
        assert tag in DYNAMIC_TAGS
    assert all(s.type in SECTION_TYPES for s in image.sections)
    assert all(p.type in SEGMENT_TYPES for p in image.segments)


def test_cfa_program_reader() -> None:
    assert cfa_program_unknown(bytes([0x0C, 0x07, 0x08, 0x90, 0x01, 0x41, 0x0E, 0x10])) is None
    assert cfa_program_unknown(bytes([0x2E, 0x10, 0x00])) is None
    got = cfa_program_unknown(bytes([0x41, 0x3F]))
    assert got is not None and "0x3f" in got
    # an unknown opcode inside an operand is not one: the block is skipped as a whole
    assert cfa_program_unknown(bytes([0x0F, 0x02, 0x3F, 0x3F, 0x00])) is None


# --- mutations ------------------------------------------------------------------------------


def _section(image: ElfImage, name: str) -> tuple[int, int]:
    sec = image.section(name)
    assert sec is not None, name
    return sec.offset, sec.size


def _shdr(image: ElfImage, name: str) -> int:
    sec = image.section(name)
    assert sec is not None
    return image.shoff + 64 * sec.index


def _put(data: bytearray, at: int, fmt: str, value: int) -> None:
    struct.pack_into("<" + fmt, data, at, value)


def _relocation(image: ElfImage, data: bytearray) -> None:
    off, _size = _section(image, ".rela.dyn")
    _put(data, off + 8, "I", 0x99)  # the first entry's type


def _dynamic_tag(image: ElfImage, data: bytearray) -> None:
    off = next(o for t, _v, o in dynamic_entries(image) if t == 21)  # DT_DEBUG
    _put(data, off, "q", 0x6FFFFEF0)


def _dynamic_flag(image: ElfImage, data: bytearray) -> None:
    off, val = next((o, v) for t, v, o in dynamic_entries(image) if t == 0x6FFFFFFB)
    _put(data, off + 8, "Q", val | 0x80000000)


def _segment(image: ElfImage, data: bytearray) -> None:
    seg = next(s for s in image.segments if s.type == 0x6474E551)  # PT_GNU_STACK
    _put(data, image.phoff + 56 * seg.index, "I", 0x6474E5FF)


def _section_type(image: ElfImage, data: bytearray) -> None:
    _put(data, _shdr(image, ".comment") + 4, "I", 0x6FFF1234)


def _note(image: ElfImage, data: bytearray) -> None:
    off, _size = _section(image, ".note.ABI-tag")
    _put(data, off + 8, "I", 0x77)


def _property(image: ElfImage, data: bytearray) -> None:
    off, _size = _section(image, ".note.gnu.property")
    _put(data, off + 16, "I", 0xC0001234)  # the first property's pr_type


def _augmentation(image: ElfImage, data: bytearray) -> None:
    off, size = _section(image, ".eh_frame")
    at = data.find(b"zR\0", off, off + size)
    assert at > 0
    data[at + 1] = ord("Q")


MUTATIONS: dict[str, tuple[Callable[[ElfImage, bytearray], None], str, str]] = {
    # name: (mutation, finding code, what the message names)
    "relocation": (_relocation, "unmodelled-relocation", "relocation type 153"),
    "dynamic-tag": (_dynamic_tag, "unmodelled-dynamic-tag", "DT 0x6ffffef0 at .dynamic+0x"),
    "dynamic-flag": (_dynamic_flag, "unmodelled-dynamic-tag", "DT_FLAGS_1 bits 0x80000000"),
    "segment-type": (_segment, "unmodelled-segment-type", "p_type 0x6474e5ff"),
    "section-type": (_section_type, "unmodelled-section-type", "section type 0x6fff1234"),
    "note": (_note, "unmodelled-note", "note owner 'GNU' type 0x77"),
    "gnu-property": (_property, "unmodelled-note", "GNU property 0xc0001234"),
    "cie-augmentation": (_augmentation, "unmodelled-cfi", "CIE augmentation 'zQ'"),
}


def _mutated(src: Path, tmp: Path, mutate: Callable[[ElfImage, bytearray], None]) -> Path:
    data = bytearray(src.read_bytes())
    mutate(parse_elf(bytes(data)), data)
    out = tmp / src.name
    out.write_bytes(bytes(data))
    return out


def _check_sites(path: Path) -> list[dict[str, object]]:
    res = run_cli("check", "--json", path)
    doc = json.loads(res.out)
    sites: list[dict[str, object]] = doc["files"][0]["sites"]
    return sites


def _rewrite(path: Path, out: Path) -> dict[str, object]:
    res = run_cli("rewrite", "--json", path, "-o", out)
    doc: dict[str, object] = json.loads(res.out)["files"][0]
    return doc


def _refused_alike(path: Path, out: Path, code: str, names: str,
                   which: Callable[[dict[str, object]], bool] = lambda s: True) -> None:
    """check's JSON blocks every site `which` selects with `code`, a finding naming the
    construct; rewrite's report skips the same sites with the same code and reason."""
    sites = [s for s in _check_sites(path) if which(s)]
    assert sites
    for s in sites:
        blocked = s["blocked"]
        assert s["outcome"] == "blocked" and isinstance(blocked, dict), s
        assert blocked["code"] == code and names in blocked["reason"], s
        findings = s["findings"]
        assert isinstance(findings, list)
        assert any(f["code"] == code and names in f["message"] for f in findings), findings
    report = _rewrite(path, out)
    rsites = report["sites"]
    assert isinstance(rsites, list)
    by_addr = {s["address"]: s for s in rsites}
    for s in sites:
        r = by_addr[s["address"]]
        assert r["action"] == "skipped" and r["code"] == code, r
        assert names in str(r["reason"]), r


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_file_wide_construct_outside_the_model_is_refused(kind: str, tmp_path: Path) -> None:
    mutate, code, names = MUTATIONS[kind]
    path = _mutated(fixture("pie"), tmp_path, mutate)
    assert [u.kind for u in file_unmodelled(parse_elf(path.read_bytes()))]
    out = tmp_path / "out"
    _refused_alike(path, out, code, names)
    report = _rewrite(path, out)
    assert report["changed"] is False
    assert not out.exists() or out.read_bytes() == path.read_bytes()


def _fde_of(image: ElfImage, address: int) -> tuple[int, int, int]:
    """(file offset of the FDE, file offset of its end, its first pc) for `address`."""
    fde = load_cfi(image).lookup(address)
    assert fde is not None
    off = image.vaddr_to_offset(fde.address)
    end = image.vaddr_to_offset(fde.end)
    assert off is not None and end is not None
    return off, end, fde.pc_begin


def test_call_frame_instruction_refuses_its_function_only(tmp_path: Path) -> None:
    """An unknown call frame instruction in one FDE (a DW_CFA_nop of its padding changed):
    the sites of that function are refused, the others are not."""
    src = fixture("pie")
    image = parse_elf(src.read_bytes())
    sites = _check_sites(src)
    target = next(s for s in sites if s["outcome"] in ("forward", "backward", "in-place"))
    address = target["address"]
    assert isinstance(address, int)
    _off, end, pc = _fde_of(image, address)
    data = bytearray(src.read_bytes())
    assert data[end - 1] == 0, "needs an FDE with DW_CFA_nop padding"
    data[end - 1] = 0x3F
    path = tmp_path / "pie"
    path.write_bytes(bytes(data))
    fde = load_cfi(parse_elf(bytes(data))).lookup(address)
    assert fde is not None
    same = {s["address"] for s in sites if fde.contains(int(str(s["address"])))}
    _refused_alike(path, tmp_path / "out", "unmodelled-cfi", "call frame instruction 0x3f",
                   lambda s: s["address"] in same)
    others = [s for s in _check_sites(path) if s["address"] not in same]
    assert others and all(not s["blocked"] for s in others)
    assert pc <= address


def test_lsda_encoding_refuses_its_function(tmp_path: Path) -> None:
    """An LSDA whose call-site encoding is no DW_EH_PE_* format: the sites of that
    function are refused."""
    src = fixture("cxx-callwin")
    image = parse_elf(src.read_bytes())
    cfi = load_cfi(image)
    sites = _check_sites(src)
    hit = None
    for s in sites:
        fde = cfi.lookup(int(str(s["address"])))
        if fde is not None and fde.lsda is not None and s["outcome"] != "blocked":
            hit = (s, fde)
            break
    assert hit is not None, "needs a site in a function with an LSDA"
    s, fde = hit
    assert fde.lsda is not None
    at = image.vaddr_to_offset(fde.lsda)
    assert at is not None
    data = bytearray(src.read_bytes())
    assert data[at] == 0xFF  # LPStart omitted
    pos = at + 2
    if data[at + 1] != 0xFF:  # TType: a uleb128 offset follows
        while data[pos] & 0x80:
            pos += 1
        pos += 1
    data[pos] = 0x0D  # the call-site encoding: no such value format
    path = tmp_path / "cxx-callwin"
    path.write_bytes(bytes(data))
    _refused_alike(path, tmp_path / "out", "unmodelled-lsda-encoding",
                   "call-site encoding 0x0d", lambda t: fde.contains(int(str(t["address"]))))


@pytest.mark.needs_cc
def test_line_table_version_outside_the_model(tmp_path: Path) -> None:
    """A .debug_line unit of a version the model does not know refuses the file."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    prog = tmp_path / "basic"
    subprocess.run(["gcc", "-O2", "-g", "-I", str(ROOT / "fixtures" / "src"),
                    str(ROOT / "fixtures" / "src" / "basic.c"), "-o", str(prog)], check=True)
    assert not _check_sites(prog)[0]["blocked"]
    data = bytearray(prog.read_bytes())
    off, _size = _section(parse_elf(bytes(data)), ".debug_line")
    _put(data, off + 4, "H", 9)  # the first unit's version
    path = tmp_path / "mutated"
    path.write_bytes(bytes(data))
    _refused_alike(path, tmp_path / "out", "unmodelled-line-opcode", "line table version 9")


def test_every_modelled_call_frame_instruction_is_run_by_the_unwind_replay() -> None:
    """The model's call frame instructions are those elf/ehframe.py's replay runs (the
    detours' rows repeat the original's): each, with operands of the shape the model
    gives, is read by the model's reader and run by rows_at; DW_CFA_set_loc, which
    the replay refuses, is the one exception, and an opcode outside the model is refused by
    both."""
    def operands(spec: str) -> bytes:
        out = b""
        for c in spec:
            out += {"u": b"\x07", "s": b"\x02", "b": b"\x01\x9c", "a": bytes(8),
                    "1": b"\x01", "2": b"\x01\x00", "4": b"\x01\x00\x00\x00"}[c]
        return out

    cie = Cie(0, 1, "zR", 1, -8, 16, 0x1B, 0xFF, None, b"\x0c\x07\x08\x90\x01")
    for op, spec in CFA_OPERANDS.items():
        prog = bytes([op | (1 if op in (0x40, 0x80, 0xC0) else 0)]) + operands(spec)
        if op == 0x0B:
            prog = b"\x0a" + prog  # restore_state after a remember_state
        if op in (0x0E, 0x13):
            prog = b"\x0c\x07\x08" + prog
        assert cfa_program_unknown(prog) is None, hex(op)
        fde = Fde(0x100, cie, 0x1000, 0x1100, None, prog)
        if op == 0x01:
            with pytest.raises(UnsupportedError):
                rows_at(fde, [0x1000, 0x1050])
            continue
        rows_at(fde, [0x1000, 0x1050])
    with pytest.raises(UnsupportedError):
        rows_at(Fde(0x100, cie, 0x1000, 0x1100, None, b"\x3f"), [0x1000])
