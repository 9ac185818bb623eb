"""Every tracer and debugger finds a moved probe of a rewritten file after the packager's strip
(issue 24, item 1): perf, bpftrace, bcc's tplist and gdb, on the rewritten file and after
`strip`, `strip --strip-debug`, the debug split (`objcopy --only-keep-debug` + a debug link
on the `--strip-debug`ged file) and `eu-strip -f`.

perf turns a note pc into a file offset as `pc + sh_offset(.stapsdt.base) - base`: the new
segment must keep the (vaddr - offset) delta of the segment holding `.stapsdt.base` in every
one of those files. strip lays each PT_LOAD out again from the end of the previous one, so the
writer puts the new segment right after the memory image (the input's non-loaded sections
copied after it: the program is built with -g3 so that they are in the way) and gives it a
p_align that makes strip put it back at the same offset. The old layout (segment past the
end of the input) passed for the unstripped file and put perf's event on the wrong bytes after
strip (perf stat: `<not supported>`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_cli
from usdtpatch.elf.image import PT_LOAD, parse_elf
from usdtpatch.elf.marker import marker_of
from usdtpatch.elf.notes import parse_notes
from usdtpatch.x86.nops import NOP5

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("strip") is None,
                                 reason="needs gcc and binutils")]

HITS = 300
PROG_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>
volatile unsigned long counter;
__attribute__((noinline)) void parse(unsigned long x)
{
    STAP_PROBE1(stripdemo, parse, x);
    counter += x;
}
int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    for (int i = 0; i < n; i++)
        parse(i);
    printf("%lu\n", counter);
    return 0;
}
"""

HOW = ["rewritten", "strip", "strip-debug", "debug-split", "eu-strip"]


def _shipped(how: str, rw: Path, dst: Path) -> Path:
    """The file a packager ships after `how` (rw itself for 'rewritten')."""
    def run(*argv: str | Path) -> None:
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0 and done.stderr == "", (argv, done.stderr)

    if how == "rewritten":
        return rw
    if how == "strip":
        run("strip", rw, "-o", dst)
    elif how == "strip-debug":
        run("strip", "--strip-debug", rw, "-o", dst)
    elif how == "debug-split":
        debug = dst.with_name(dst.name + ".debug")
        run("objcopy", "--only-keep-debug", rw, debug)
        run("strip", "--strip-debug", rw, "-o", dst)
        run("objcopy", f"--add-gnu-debuglink={debug}", dst)
    else:
        if shutil.which("eu-strip") is None:
            pytest.skip("needs eu-strip (elfutils)")
        run("eu-strip", "-f", dst.with_name(dst.name + ".debug"), rw, "-o", dst)
    dst.chmod(0o755)
    return dst


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """(the program, its rewritten copy, the moved probe's new pc)."""
    d = tmp_path_factory.mktemp("strip_tracers")
    (d / "prog.c").write_text(PROG_C)
    exe, rw = d / "prog", d / "prog.rw"
    subprocess.run(["gcc", "-O2", "-g3", "-o", str(exe), str(d / "prog.c")], check=True,
                   timeout=120)
    res = run_cli("rewrite", exe, "-o", rw, "--json")
    assert res.rc == 0, res.err
    (site,) = json.loads(res.out)["files"][0]["sites"]
    assert site["action"] == "detour", site
    return exe, rw, int(site["new_pc"])


def _perf_offset(path: Path) -> int:
    """The file offset perf's SDT support computes for the probe (tools/perf/util/
    symbol-elf.c: pc + sh_offset(.stapsdt.base) - base)."""
    image = parse_elf(path.read_bytes())
    base = image.section(".stapsdt.base")
    notes = image.section(".note.stapsdt")
    assert base is not None and notes is not None
    (note,) = parse_notes(image.section_data(notes), 8, "<").sdt_notes
    return note.pc + base.offset - note.base


@pytest.mark.parametrize("how", HOW)
def test_perfs_offset_is_the_moved_probe_after_strip(how: str, built: tuple[Path, Path, int],
                                                      tmp_path: Path) -> None:
    _exe, rw, new_pc = built
    f = _shipped(how, rw, tmp_path / f"prog.{how}")
    data = f.read_bytes()
    off = _perf_offset(f)
    assert data[off : off + 5] == NOP5, (how, hex(off))
    image = parse_elf(data)
    assert image.vaddr_to_offset(new_pc) == off  # the loader's view agrees with perf's
    new = max((s for s in image.segments if s.type == PT_LOAD), key=lambda s: s.vaddr)
    assert (new.vaddr - new.offset) % new.align == 0  # the loader's congruence
    run = subprocess.run([str(f), "3"], capture_output=True, text=True, timeout=30,
                         check=False)
    assert (run.returncode, run.stdout) == (0, "3\n")


def test_the_cut_rewrite_restores_and_stays_lean(built: tuple[Path, Path, int],
                                                 tmp_path: Path) -> None:
    """The input's non-loaded end lies under the new segment: it is copied once (not kept in
    the marker), and restore gives the original back."""
    exe, rw, _pc = built
    out = parse_elf(rw.read_bytes())
    marker = out.section(".note.usdtpatch")
    doc = marker_of(out)
    assert marker is not None and doc is not None
    assert doc.get("cut") is not None  # the layout this module is about was chosen
    text = out.section(".usdtpatch.text")
    assert text is not None and text.offset < exe.stat().st_size  # under the input's end
    assert marker.size < 3 * 4096  # the copied end is not in the marker
    back = tmp_path / "back"
    assert run_cli("restore", rw, "-o", back).rc == 0
    assert back.read_bytes() == exe.read_bytes()
    listed = run_cli("list", "--json", rw)
    assert listed.rc == 0 and "stripdemo" in listed.out


# --- the tracers themselves (root, the live kernel) ---------------------------------------


def _tool(name: str) -> None:
    if shutil.which(name) is None:
        pytest.skip(f"needs {name}")


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_perf_counts_every_hit(how: str, built: tuple[Path, Path, int], tmp_path: Path) -> None:
    _tool("perf")
    f = _shipped(how, built[1], tmp_path / f"prog.{how}")
    env = dict(os.environ, HOME=str(tmp_path))  # perf's build-id cache: $HOME/.debug

    def perf(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["perf", *argv], capture_output=True, text=True, env=env,
                              timeout=120, check=False, cwd=tmp_path)

    assert perf("buildid-cache", "--add", str(f)).returncode == 0
    added = perf("probe", "-x", str(f), "sdt_stripdemo:parse")
    try:
        assert added.returncode == 0, added.stderr
        stat = perf("stat", "-x,", "-e", "sdt_stripdemo:parse", str(f), str(HITS))
        assert stat.returncode == 0, stat.stderr
        counts = [ln.split(",")[0] for ln in stat.stderr.splitlines()
                  if "sdt_stripdemo:parse" in ln]
        assert counts == [str(HITS)], stat.stderr
    finally:
        perf("probe", "-d", "sdt_stripdemo:*")


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_bpftrace_counts_every_hit(how: str, built: tuple[Path, Path, int],
                                   tmp_path: Path) -> None:
    _tool("bpftrace")
    f = _shipped(how, built[1], tmp_path / f"prog.{how}")
    done = subprocess.run(["bpftrace", "-q", "-e",
                           f"usdt:{f}:stripdemo:parse {{ @n = count(); }}",
                           "-c", f"{f} {HITS}"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert re.search(rf"@n: {HITS}\b", done.stdout), done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_tplist_and_gdb_list_the_moved_probe(how: str, built: tuple[Path, Path, int],
                                             tmp_path: Path) -> None:
    f = _shipped(how, built[1], tmp_path / f"prog.{how}")
    new_pc = built[2]
    if shutil.which("tplist-bpfcc"):
        out = subprocess.run(["tplist-bpfcc", "-vv", "-l", str(f)], capture_output=True,
                             text=True, timeout=60, check=False).stdout
        assert re.search(rf"location #1 \S+ {new_pc:#x}\n", out), out
    if shutil.which("gdb") is None:
        pytest.skip("needs gdb")
    gdb = subprocess.run(["gdb", "-nx", "-batch", "-ex", "info probes stap stripdemo",
                          str(f)], capture_output=True, text=True, timeout=60, check=False)
    assert re.search(rf"stripdemo\s+parse\s+0x0*{new_pc:x}\s", gdb.stdout), gdb.stdout


@pytest.mark.slow
@pytest.mark.parametrize("how", ["strip", "debug-split"])
def test_gdb_stops_at_the_moved_probe(how: str, built: tuple[Path, Path, int],
                                      tmp_path: Path) -> None:
    """gdb's `break -probe-stap` on the stripped program: one stop per hit."""
    _tool("gdb")
    f = _shipped(how, built[1], tmp_path / f"prog.{how}")
    script = tmp_path / "count.gdb"
    script.write_text("break -probe-stap stripdemo:parse\ncommands 1\nsilent\ncontinue\nend\n"
                      "run\ninfo breakpoints\n")
    done = subprocess.run(["gdb", "-nx", "-batch", "-x", str(script), "--args", str(f), "5"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert "breakpoint already hit 5 times" in done.stdout, done.stdout + done.stderr


# --- the layout rules, without a tracer ---------------------------------------------------


def test_strip_align_is_the_smallest_power_of_two_above_the_gap() -> None:
    from usdtpatch.elf.writer import MAX_STRIP_ALIGN, strip_align
    from usdtpatch.kernelfacts import PAGE

    assert strip_align(0, 0x5018, 0x3020) == 0x2000  # gap 0x1ff8
    assert strip_align(0, 0x6018, 0x3020) == 0x4000  # gap 0x2ff8: 0x2000 is not above it
    assert strip_align(0, 0x3800, 0x3020) == PAGE
    assert strip_align(0x400000, 0x5000, 0x3020) == 0x2000  # a non-PIE's delta divides it
    # refused: a delta the alignment does not divide, a gap past MAX_STRIP_ALIGN
    assert strip_align(0x1000, 0x5000, 0x3020) == PAGE
    assert strip_align(0, 0x3020 + MAX_STRIP_ALIGN, 0x3020) == PAGE


def test_no_cut_where_a_loaded_section_lies_past_the_segments(tmp_path: Path) -> None:
    """An allocated section or a segment whose file bytes lie past the point (a damaged or
    odd file): the input is not cut there."""
    from usdtpatch.elf.writer import cut_points

    image = parse_elf((Path(__file__).parent.parent / "fixtures" / "bin" / "pie").read_bytes())
    loads = [s for s in image.segments if s.type == PT_LOAD]
    end = max(s.offset + s.filesz for s in loads)
    assert end in cut_points(image, end)
    assert cut_points(image, end - 1) == []  # a segment's bytes past the cut
    points = cut_points(image, end)
    assert all(not s.offset < c < s.offset + s.size for c in points for s in image.sections
               if s.size and s.type != 8)
