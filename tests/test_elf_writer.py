"""The file writer (usdtpatch/elf/writer.py): where the new segment goes, and the inputs it must
refuse with one line instead of an internal error or a damaged output.

Regressions (issue 10): a PT_LOAD with p_memsz = 2^64-1 made `rewrite` fail with OverflowError
(exit 3); a second section named .note.stapsdt gave an output nm and objdump no longer read
(every section of that name was repointed at the new notes); a program with a 1 GiB .bss was
rewritten into a 1 GiB file (the new segment kept the .bss segment's vaddr-offset delta)."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, fixture, run_cli
from usdtpatch.elf.image import PT_LOAD, parse_elf
from usdtpatch.elf.writer import plan_segment, tables_bound, zero_fill_limit
from usdtpatch.errors import ElfFormatError
from usdtpatch.kernelfacts import PAGE


def _one_line_exit_2(res_rc: int, err: str, path: Path) -> str:
    assert res_rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], err
    assert "internal error" not in err
    return lines[0]


def test_huge_memsz_is_refused_with_one_line(tmp_path: Path) -> None:
    data = bytearray(fixture("demo").read_bytes())
    image = parse_elf(bytes(data))
    last = max((s for s in image.segments if s.type == PT_LOAD), key=lambda s: s.vaddr)
    struct.pack_into("<Q", data, image.phoff + last.index * 56 + 40, (1 << 64) - 1)
    src = tmp_path / "memsz"
    src.write_bytes(bytes(data))
    with pytest.raises(ElfFormatError, match="past the end of the 64-bit address space"):
        plan_segment(parse_elf(bytes(data)), None)
    for verify in ((), ("--no-verify",)):
        out = tmp_path / "memsz.out"
        res = run_cli("rewrite", *verify, src, "-o", out)
        line = _one_line_exit_2(res.rc, res.err, src)
        assert "p_memsz 0xffffffffffffffff" in line
        assert not out.exists()


def test_second_note_section_is_refused_with_one_line(tmp_path: Path) -> None:
    data = bytearray(fixture("demo").read_bytes())
    image = parse_elf(bytes(data))
    note = image.section(".note.stapsdt")
    symtab = image.section(".symtab")
    assert note is not None and symtab is not None and symtab.index > note.index
    # .symtab takes the name .note.stapsdt: the notes still come from the first one
    (name_off,) = struct.unpack_from("<I", data, image.shoff + note.index * 64)
    struct.pack_into("<I", data, image.shoff + symtab.index * 64, name_off)
    src = tmp_path / "twonotes"
    src.write_bytes(bytes(data))
    assert run_cli("list", src).rc == 0
    out = tmp_path / "twonotes.out"
    res = run_cli("rewrite", "--no-verify", src, "-o", out)
    line = _one_line_exit_2(res.rc, res.err, src)
    assert f"2 sections are named .note.stapsdt (sections {note.index}, {symtab.index})" in line
    assert not out.exists()


def test_ordinary_files_keep_the_stapsdt_base_delta() -> None:
    """perf maps a note pc to a file offset with .stapsdt.base's segment delta: kept where it
    costs little (every fixture)."""
    for name in ("demo", "pie", "nopie", "libprobes.so"):
        image = parse_elf(fixture(name).read_bytes())
        base = image.section(".stapsdt.base")
        assert base is not None
        lay = plan_segment(image, base.addr)
        seg = image.load_segment_for(base.addr)
        assert seg is not None
        assert lay.keeps_delta, name
        assert lay.vaddr - lay.offset == seg.vaddr - seg.offset
        room = zero_fill_limit(len(image.data)) + tables_bound(image)
        assert lay.offset - len(image.data) <= room
        vend = max(s.vaddr + s.memsz for s in image.segments if s.type == PT_LOAD)
        assert lay.vaddr >= vend and lay.offset >= len(image.data)


BIG_BSS_C = r"""
#include <stdio.h>
#include <sys/sdt.h>
static char big[1L << 30];
__attribute__((noinline)) long work(long i)
{
    big[i * 4096] = (char)(i + 1);
    long r = big[i * 4096] * 3 + i;
    DTRACE_PROBE2(bigbss, work, i, r);
    r = r * 5 + big[(i + 1) * 4096];
    return r + 1;
}
int main(void)
{
    long s = 0;
    for (long i = 0; i < 64; i++)
        s += work(i);
    printf("sum %ld\n", s);
    return 0;
}
"""


@pytest.mark.needs_cc
def test_large_bss_grows_the_file_by_the_detours_only(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed")
    src = tmp_path / "bigbss.c"
    src.write_text(BIG_BSS_C)
    prog = tmp_path / "bigbss"
    subprocess.run([gcc, "-O2", "-fPIE", "-pie", "-g0", "-I", str(ROOT / "sdt_headers"),
                    "-DUSDTPATCH_SITE_FORM=nop1", "-DUSDTPATCH_FORK_GUARD=0", "-o", str(prog),
                    str(src)], check=True)
    image = parse_elf(prog.read_bytes())
    vend = max(s.vaddr + s.memsz for s in image.segments if s.type == PT_LOAD)
    assert vend > 1 << 30
    assert "nop1" in run_cli("list", prog).out
    out = tmp_path / "bigbss.rw"
    res = run_cli("rewrite", prog, "-o", out)
    assert res.rc == 0, res.err
    size = out.stat().st_size
    assert size < len(image.data) + 256 * 1024, f"{size} bytes"
    rw = parse_elf(out.read_bytes())
    new = [s for s in rw.segments if s.type == PT_LOAD and s.vaddr >= vend]
    assert len(new) == 1
    seg = new[0]
    assert seg.offset % PAGE == seg.vaddr % PAGE
    assert seg.offset >= len(image.data)
    before = subprocess.run([str(prog)], check=False, capture_output=True, text=True, timeout=60)
    after = subprocess.run([str(out)], check=False, capture_output=True, text=True, timeout=60)
    assert before.returncode == after.returncode == 0, after.stderr
    assert after.stdout == before.stdout and before.stdout.startswith("sum ")
    # the probe moved into the new segment, and restore gives the original back byte for byte
    listed = run_cli("list", out)
    assert listed.rc == 0 and "bigbss:work" in listed.out
    back = tmp_path / "bigbss.back"
    assert run_cli("restore", out, "-o", back).rc == 0
    assert back.read_bytes() == prog.read_bytes()


def test_a_section_past_the_end_of_the_file_is_refused(tmp_path: Path) -> None:
    """Its header is copied unchanged: in the output it would cover the appended data."""
    data = bytearray(fixture("demo").read_bytes())
    image = parse_elf(bytes(data))
    comment = image.section(".comment")
    assert comment is not None
    struct.pack_into("<Q", data, image.shoff + comment.index * 64 + 32,
                     len(data) - comment.offset + 0x100)
    src = tmp_path / "longcomment"
    src.write_bytes(bytes(data))
    assert run_cli("list", src).rc == 0
    out = tmp_path / "longcomment.out"
    res = run_cli("rewrite", "--no-verify", src, "-o", out)
    line = _one_line_exit_2(res.rc, res.err, src)
    assert f"section {comment.index} (.comment)" in line and "past the end of the file" in line
    assert not out.exists()


def test_a_moved_sections_patch_lands_where_its_header_points() -> None:
    """Rewrite.moved_patches (the moved build-id's new id, usdtpatch.rewriter.build): written
    over the sections moved into the new segment, at their new place, which is where the
    output's section header points (build_rewrite parsed and copied the whole output to
    find it); a patch outside the moved bytes, or with nothing moved, is refused."""
    from dataclasses import replace

    from usdtpatch import api
    from usdtpatch.elf.image import SHF_ALLOC, SHF_EXECINSTR, SHT_PROGBITS
    from usdtpatch.elf.writer import AllocSection, Rewrite, write
    from usdtpatch.errors import UnsupportedError

    plan = api.rewrite_plan(fixture("demo"), verify=False)
    lay, image = plan.layout, plan.image
    assert lay is not None and lay.moved is not None
    mv = lay.moved
    sec = next(s for s in image.sections if s.size and mv.lo <= s.offset < mv.hi)
    text = AllocSection(".usdtpatch.text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR,
                        plan.text_addr, plan.text)
    rw = Rewrite(layout=lay, patches=(), alloc=(text,), tail=(),
                 moved_patches=((sec.offset + 1, b"\xaa\xbb"),))
    out = parse_elf(write(image, rw))
    moved = out.section(sec.name)
    assert moved is not None and moved.offset != sec.offset
    data = out.section_data(moved)
    assert data == image.section_data(sec)[:1] + b"\xaa\xbb" + image.section_data(sec)[3:]
    assert out.data[sec.offset : sec.offset + sec.size] != data  # the old place: headers
    for bad in ((mv.hi - 1, b"\0\0"), (mv.lo - 1, b"\0")):
        with pytest.raises(UnsupportedError, match="outside the sections moved"):
            write(image, replace(rw, moved_patches=(bad,)))
    with pytest.raises(UnsupportedError, match="no section moves"):
        write(image, replace(rw, layout=replace(lay, moved=None, in_place=False)))
