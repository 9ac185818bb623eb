"""A rewritten file survives what distribution packagers do after a build: binutils `strip`,
`strip --strip-debug`, and the debug split (`objcopy --only-keep-debug` + a debug link), and
elfutils' `eu-strip` where it is installed.

The writer keeps the program header table where strip and objcopy put it (right after the ELF
header, in the first PT_LOAD, one entry longer; the few sections in its way move to the new
segment) and starts the new PT_LOAD at its first section, so they lay the file out again
without "adjusting" any section. Each stripped program prints what the original prints, and
on this kernel (root, uprobe syscall) its rewritten sites fire and are optimized.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import cpu0_reason, live_kernel_reason, runtime_address, started
from tests.helpers import fixture, run_cli
from usdtpatch.elf.image import PT_LOAD, parse_elf
from usdtpatch.live.perf import open_uprobe
from usdtpatch.live.procfs import read_maps, read_mem
from usdtpatch.sequences.trampoline import TRAMPOLINE_NAME
from usdtpatch.x86.nops import NOP5

pytestmark = pytest.mark.skipif(shutil.which("strip") is None or
                                shutil.which("objcopy") is None, reason="needs binutils")

RUNNABLE = ["pie", "nopie", "static", "args-O2", "cxx-throw", "redzone-leaf"]
STRIPS = {"strip": ["strip"], "strip-debug": ["strip", "--strip-debug"]}
if shutil.which("eu-strip"):  # elfutils' (RPM's find-debuginfo), with the debug split
    STRIPS["eu-strip"] = ["eu-strip"]  # (_tool adds -f OUT.debug)


def _run(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(path)], capture_output=True, timeout=30, check=False)


def _rewritten(name: str, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    out = tmp_path / f"{name}.rw"
    res = run_cli("rewrite", fixture(name), "-o", out, "--json")
    assert res.rc == 0, res.err
    doc = json.loads(res.out)["files"][0]
    assert doc["changed"], name
    return out, doc


def _tool(argv: list[str], src: Path, dst: Path) -> None:
    if argv[0] == "eu-strip":
        argv = [*argv, "-f", f"{dst}.debug"]  # a file of its own (eu-strip replaces it)
    done = subprocess.run([*argv, str(src), "-o", str(dst)] if argv[0].endswith("strip") else
                          [*argv, str(src), str(dst)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # no "section ... lma ... adjusted"


@pytest.mark.parametrize("how", list(STRIPS))
@pytest.mark.parametrize("name", RUNNABLE)
def test_stripped_rewrite_runs_like_the_original(name: str, how: str, tmp_path: Path) -> None:
    out, _doc = _rewritten(name, tmp_path)
    stripped = tmp_path / f"{name}.{how}"
    _tool(STRIPS[how], out, stripped)
    want, got = _run(fixture(name)), _run(stripped)
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout)
    # the notes (and the marker) are kept: the moved probes are still listed
    listed = run_cli("list", "--json", stripped)
    assert listed.rc == 0, listed.err


@pytest.mark.parametrize("name", ["pie", "nopie", "cxx-throw"])
def test_debug_split_of_a_rewrite(name: str, tmp_path: Path) -> None:
    out, _doc = _rewritten(name, tmp_path)
    debug = tmp_path / f"{name}.debug"
    _tool(["objcopy", "--only-keep-debug"], out, debug)
    assert parse_elf(debug.read_bytes()).section(".symtab") is not None
    shipped = tmp_path / name
    _tool(["strip", "--strip-debug"], out, shipped)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(shipped)], check=True,
                   timeout=60)
    want, got = _run(fixture(name)), _run(shipped)
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout)


def test_the_program_headers_stay_where_strip_puts_them(tmp_path: Path) -> None:
    """The check that fails with the old layout (table in the new segment)."""
    out, _doc = _rewritten("pie", tmp_path)
    image = parse_elf(out.read_bytes())
    first = min((s for s in image.segments if s.type == PT_LOAD), key=lambda s: s.offset)
    assert image.phoff == 64 and first.offset == 0
    assert first.filesz >= 64 + 56 * len(image.segments)
    new = max((s for s in image.segments if s.type == PT_LOAD), key=lambda s: s.vaddr)
    starts = sorted(s.addr for s in image.sections if s.addr and
                    new.vaddr <= s.addr < new.vaddr + new.memsz)
    assert starts and starts[0] == new.vaddr  # the segment starts at its first section


LOOP_C = r"""
#include <stdio.h>
#include <unistd.h>
#include <sys/sdt.h>
volatile unsigned long counter;
__attribute__((noinline)) void plain(unsigned long x) { STAP_PROBE1(loop, plain, x); counter += x; }
int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("ready\n");
    for (unsigned long i = 0;; i++) { plain(i); usleep(300); }
}
"""


@pytest.mark.live
@pytest.mark.needs_cc
@pytest.mark.skipif(cpu0_reason() is not None, reason=cpu0_reason() or "")
@pytest.mark.parametrize("how", list(STRIPS))
def test_stripped_rewrite_probes_fire_and_are_optimized(how: str, tmp_path: Path) -> None:
    if live_kernel_reason() is not None:
        pytest.skip(live_kernel_reason() or "")
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    (tmp_path / "loop.c").write_text(LOOP_C)
    exe = tmp_path / "loop"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(tmp_path / "loop.c")], check=True,
                   timeout=120)
    out = tmp_path / "loop.rw"
    res = run_cli("rewrite", exe, "-o", out, "--json")
    assert res.rc == 0, res.err
    (site,) = json.loads(res.out)["files"][0]["sites"]
    stripped = tmp_path / f"loop.{how}"
    _tool(STRIPS[how], out, stripped)
    stripped.chmod(0o755)
    image = parse_elf(stripped.read_bytes())
    off = image.vaddr_to_offset(site["new_pc"])
    assert off is not None and stripped.read_bytes()[off : off + 5] == NOP5
    with started([stripped], stdout=subprocess.PIPE) as proc:
        assert proc.line(10) == "ready"
        at = runtime_address(proc.pid, stripped, off)
        probe = open_uprobe(str(stripped), off, pid=proc.pid)
        try:
            deadline = time.monotonic() + 20
            while probe.count() < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert probe.count() >= 3
            code = read_mem(proc.pid, at, 5)
            assert code[0] == 0xE8, code.hex()
            dest = at + 5 + int.from_bytes(code[1:5], "little", signed=True)
            assert any(m.path == TRAMPOLINE_NAME and m.start <= dest < m.end
                       for m in read_maps(proc.pid))
        finally:
            probe.close()
        assert proc.proc.poll() is None


def test_without_room_for_the_table_the_old_layout_still_runs(tmp_path: Path) -> None:
    """When a section that cannot move sits after the program headers (here `.interp`
    renamed, so not recognised), the table goes into the new segment as before: the program
    runs (only a strip after the rewrite is then not supported)."""
    data = bytearray(fixture("pie").read_bytes())
    image = parse_elf(bytes(data))
    names = image.sections[int.from_bytes(data[0x3E:0x40], "little")]
    at = data.index(b".interp\0", names.offset, names.offset + names.size)
    data[at + 1] = ord("x")
    src = tmp_path / "pie-x"
    src.write_bytes(bytes(data))
    src.chmod(0o755)
    out = tmp_path / "pie-x.rw"
    res = run_cli("rewrite", src, "-o", out, "--json")
    assert res.rc == 0, res.err
    rewritten = parse_elf(out.read_bytes())
    new = max((s for s in rewritten.segments if s.type == PT_LOAD), key=lambda s: s.vaddr)
    assert rewritten.phoff == new.offset  # the table leads the new segment
    want, got = _run(fixture("pie")), _run(out)
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout)
    back = tmp_path / "back"
    assert run_cli("restore", out, "-o", back).rc == 0
    assert back.read_bytes() == bytes(data)
