"""The size rule (issue 22): a rewritten file grows by at most its detours, its tables and 1%
of the input (one page for a file under 400 KiB, where the first page past `.bss` can lie a
page past the file's content while the `.stapsdt.base` delta is kept for perf).

"Detours and tables" are the bytes the rewrite adds on purpose: the new PT_LOAD's file bytes
(detours, unwind tables, the sections moved out of the program headers' way), every
non-allocated section that is new or rewritten (a section grown in place counts by its
growth), and the program and section header tables. What is left over is padding: the zeros
before the new segment that keep perf's vaddr - offset delta, and alignment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import FIXTURES, REAL_BINARIES, run_cli
from usdtpatch.elf.image import (
    PT_LOAD,
    SHF_ALLOC,
    SHT_NOBITS,
    SHT_STRTAB,
    SHT_SYMTAB,
    ElfImage,
    Section,
    parse_elf,
)

PAGE = 4096
# foreign files are refused; a file without probes is not written (issue 34, item 7)
REWRITABLE = sorted(p.name for p in FIXTURES.iterdir()
                    if p.name not in ("aarch64", "bigendian", "i386", "noprobes"))


def added_on_purpose(before: ElfImage, after: ElfImage) -> int:
    """The bytes of detours and tables in `after` (see the module's docstring)."""
    old_vaddrs = {sg.vaddr for sg in before.segments if sg.type == PT_LOAD}
    total = sum(sg.filesz for sg in after.segments
                if sg.type == PT_LOAD and sg.vaddr not in old_vaddrs)
    total += 64 * len(after.sections) + 56 * (len(after.segments) - len(before.segments))
    old: dict[str, Section] = {}
    for sec in before.sections:
        old.setdefault(sec.name, sec)
    for sec in after.sections:
        if sec.type == SHT_NOBITS or not sec.size or sec.flags & SHF_ALLOC:
            continue
        was = old.get(sec.name)
        data = after.section_data(sec)
        if was is None:
            total += sec.size
            continue
        kept = before.section_data(was)
        if data == kept:
            continue
        skip = 24 if sec.type == SHT_SYMTAB else 0  # grown before its entry 1
        grown = data.startswith(kept) or (skip and data.endswith(kept[skip:]))
        total += sec.size - was.size if sec.size > was.size and grown else sec.size
    return total


def keeps_perf_delta(before: ElfImage, after: ElfImage) -> bool:
    """Whether the new segment has the (vaddr - offset) delta of the segment holding
    `.stapsdt.base` (perf's file offsets of the moved probes are then right)."""
    base = before.section(".stapsdt.base")
    old = {sg.vaddr for sg in before.segments if sg.type == PT_LOAD}
    new = [sg for sg in after.segments if sg.type == PT_LOAD and sg.vaddr not in old]
    if base is None or len(new) != 1:
        return False
    anchor = [sg for sg in before.segments if sg.type == PT_LOAD
              and sg.vaddr <= base.addr < sg.vaddr + sg.memsz]
    return bool(anchor) and new[0].vaddr - new[0].offset == anchor[0].vaddr - anchor[0].offset


def padding(src: Path, out: Path) -> tuple[int, int]:
    """(the bytes the file grew by beyond its detours and tables, what the rule allows): 1%
    of the input (a page for a small file), or, where that much cannot keep perf's delta
    and the output keeps it, a tenth (usdtpatch.elf.writer.zero_fill_limit)."""
    data, new = src.read_bytes(), out.read_bytes()
    before, after = parse_elf(data), parse_elf(new)
    extra = len(new) - len(data) - added_on_purpose(before, after)
    allowed = max(len(data) // 100, PAGE)
    if extra > allowed and keeps_perf_delta(before, after):
        allowed = max(len(data) // 10, PAGE)
    return extra, allowed


def _rewritten(src: Path, tmp: Path) -> Path:
    out = tmp / (src.name + ".rw")
    res = run_cli("rewrite", "--no-verify", src, "-o", out)
    assert res.rc in (0, 1), res.err
    if not out.exists():
        pytest.skip(f"{src.name}: nothing rewritten")
    return out


@pytest.mark.parametrize("name", REWRITABLE)
def test_fixture_grows_by_its_detours_and_tables(name: str, tmp_path: Path) -> None:
    src = FIXTURES / name
    extra, allowed = padding(src, _rewritten(src, tmp_path))
    assert extra <= allowed, f"{name}: {extra} bytes of padding, at most {allowed}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_BINARIES))
def test_real_binary_grows_by_its_detours_and_tables(name: str, tmp_path: Path) -> None:
    src = REAL_BINARIES[name]
    if not src.exists():
        pytest.skip(f"{src} not installed")
    out = _rewritten(src, tmp_path)
    extra, allowed = padding(src, out)
    assert extra <= allowed, f"{name}: {extra} bytes of padding, at most {allowed}"
    if name == "libjvm":  # both rules hold: perf's delta kept, strip gives the offset back
        image, new = parse_elf(src.read_bytes()), parse_elf(out.read_bytes())
        loads_end = max(sg.offset + sg.filesz for sg in image.segments if sg.type == PT_LOAD)
        old = {sg.vaddr for sg in image.segments if sg.type == PT_LOAD}
        (seg,) = [sg for sg in new.segments if sg.type == PT_LOAD and sg.vaddr not in old]
        assert seg.vaddr - seg.offset == 0  # libjvm's .stapsdt.base segment's delta
        assert seg.offset - loads_end < seg.align <= 1 << 21


def test_the_measure_counts_padding(tmp_path: Path) -> None:
    """The measure must see zeros added before the tables: a page of them is counted."""
    src = FIXTURES / "demo"
    out = _rewritten(src, tmp_path)
    extra, _allowed = padding(src, out)
    image = parse_elf(out.read_bytes())
    padded = bytearray(out.read_bytes()) + bytes(PAGE)  # zeros past every section
    (tmp_path / "padded").write_bytes(padded)
    more, _ = padding(src, tmp_path / "padded")
    assert more == extra + PAGE and image.sections


@pytest.mark.parametrize("name", ["demo", "nopie", "libprobes.so"])  # a gap the delta forces
def test_the_room_before_the_segment_holds_tables(name: str, tmp_path: Path) -> None:
    """The zeros a kept delta needs are filled with tables first: some new non-allocated
    section (or the section header table) lies between the input's end and the new segment;
    the segment's page is past the memory image and congruent with its offset."""
    src = FIXTURES / name
    image, new = parse_elf(src.read_bytes()), parse_elf(_rewritten(src, tmp_path).read_bytes())
    old = {sg.vaddr for sg in image.segments if sg.type == PT_LOAD}
    (seg,) = [sg for sg in new.segments if sg.type == PT_LOAD and sg.vaddr not in old]
    vend = max(sg.vaddr + sg.memsz for sg in image.segments if sg.type == PT_LOAD)
    assert seg.offset % PAGE == seg.vaddr % PAGE
    assert seg.vaddr // PAGE * PAGE >= -(-vend // PAGE) * PAGE  # no data page mapped over
    loads_end = max(sg.offset + sg.filesz for sg in image.segments if sg.type == PT_LOAD)
    kept = {(t.name, t.offset) for t in image.sections}
    before = [s for s in new.sections if not s.flags & SHF_ALLOC and s.size
              and loads_end <= s.offset < seg.offset and (s.name, s.offset) not in kept
              and s.type not in (SHT_SYMTAB, SHT_STRTAB)]  # not a table grown in place
    assert before or loads_end <= new.shoff < seg.offset, name


def test_cut_points_keep_the_symbol_table_whole() -> None:
    """A cut never splits a section, nor the room `.symtab` grows into in place, nor lies
    past its string table's start (its new names go into the copy)."""
    from usdtpatch.elf.symbols import symtab_region
    from usdtpatch.elf.writer import cut_points

    image = parse_elf((FIXTURES / "static").read_bytes())
    loads_end = max(sg.offset + sg.filesz for sg in image.segments if sg.type == PT_LOAD)
    points = cut_points(image, loads_end)
    region = symtab_region(image)
    assert region is not None and points
    sym, strs, floor, _moved = region
    for c in points:
        assert loads_end <= c <= strs.offset
        assert not floor < c < sym.offset + 24
        assert not any(s.offset < c < s.offset + s.size for s in image.sections
                       if s.size and s.type != SHT_NOBITS)
    assert strs.offset in points  # the cut libjvm takes: only .strtab is copied
