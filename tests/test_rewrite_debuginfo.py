"""Backtraces, profilers and symbolizers through a moved call name the original function with
its file and line (issue 24, item 2; docs/rewrite.md, "Debugging information").

The program's probe is the first instruction of a loop body followed by a call (the loop's
backward jump lands on the nop, so the only window holds the call): the call is moved into the
detour and returns there. Before, gdb's `bt` showed `__usdtpatch_detour_bt_p_0 ()` for the
caller's frame, perf report attributed detour samples to `__usdtpatch_detour_*` and Rust's
RUST_BACKTRACE printed that name without a file and line.
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
from usdtpatch.elf.dwarf import DwarfError, read_debug_info, read_line_table
from usdtpatch.elf.image import parse_elf

pytestmark = [pytest.mark.needs_cc]

BT_C = r"""#include <stdio.h>
#include <sys/sdt.h>
volatile long *volatile nowhere;
volatile int boom;
__attribute__((noinline)) long crash(long i) { if (i == 3 && boom) return *nowhere; return i + 1; }
__attribute__((noinline)) long caller_fn(long x) {
    for (long i = 0; i < x; i = crash(i))
        STAP_PROBE(bt, p);
    return x;
}
int main(int argc, char **argv) {
    (void)argv;
    boom = argc == 1;  /* with an argument: a long loop, no crash */
    printf("%ld\n", caller_fn(argc > 1 ? 300000000L : 5));
    return 0;
}
"""
# the line of `crash(i)`: the return address's line in caller_fn
CALL_LINE = next(i for i, ln in enumerate(BT_C.splitlines(), 1) if "i = crash(i)" in ln)

BUILDS = {"gcc-dwarf5": ["gcc", "-O2", "-g"], "gcc-dwarf4": ["gcc", "-O2", "-gdwarf-4"],
          "clang-dwarf5": ["clang", "-O2", "-g"], "clang-dwarf4": ["clang", "-O2", "-gdwarf-4"],
          "gcc-nodebug": ["gcc", "-O2"]}


def _build(d: Path, name: str) -> tuple[Path, Path, dict[str, object]]:
    argv = BUILDS[name]
    if shutil.which(argv[0]) is None:
        pytest.skip(f"needs {argv[0]}")
    (d / "bt.c").write_text(BT_C)
    exe, rw = d / name, d / f"{name}.rw"
    subprocess.run([*argv, "-o", str(exe), str(d / "bt.c")], check=True, timeout=120,
                   capture_output=True)
    # --calls move: the default emulates the call (its callee sees the original return
    # address); a moved call returns into the detour, whose debug information is the subject
    res = run_cli("rewrite", exe, "-o", rw, "--json", "--calls", "move")
    assert res.rc == 0, res.err
    (site,) = json.loads(res.out)["files"][0]["sites"]
    assert site["action"] == "detour" and site["calls"] == "moved", site
    return exe, rw, site


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, tuple[Path, Path, dict[str, object]]]:
    d = tmp_path_factory.mktemp("debuginfo")
    out = {}
    for name, argv in BUILDS.items():
        if shutil.which(argv[0]) is not None:
            out[name] = _build(d, name)
    return out


def _get(builds: dict[str, tuple[Path, Path, dict[str, object]]], name: str
         ) -> tuple[Path, Path, dict[str, object]]:
    if name not in builds:
        pytest.skip(f"needs {BUILDS[name][0]}")
    return builds[name]


DWARF_BUILDS = [n for n in BUILDS if n != "gcc-nodebug"]


@pytest.mark.parametrize("name", DWARF_BUILDS)
def test_the_detour_maps_to_the_original_lines_and_function(
        name: str, builds: dict[str, tuple[Path, Path, dict[str, object]]]) -> None:
    """Our reader and pyelftools agree: every detour address has the line of the original
    instruction it was moved from, and a subprogram whose origin is caller_fn."""
    exe, rw, site = _get(builds, name)
    before, after = parse_elf(exe.read_bytes()), parse_elf(rw.read_bytes())
    old_lines = read_line_table(before, {u.stmt_list: u.comp_dir
                                         for u in read_debug_info(before).units
                                         if u.stmt_list is not None})
    new_info = read_debug_info(after)
    new_lines = read_line_table(after, {u.stmt_list: u.comp_dir for u in new_info.units
                                        if u.stmt_list is not None})
    new_pc = int(str(site["new_pc"]))
    row = new_lines.lookup(new_pc)
    assert row is not None and row.file.endswith("bt.c"), row
    old = old_lines.lookup(int(str(site["address"])))
    assert old is not None and (row.line, row.column) == (old.line, old.column)
    sp = new_info.subprogram_at(new_pc)
    assert sp is not None and sp.low <= new_pc < sp.high
    elftools = pytest.importorskip("elftools.elf.elffile")
    with rw.open("rb") as f:
        dwarf = elftools.ELFFile(f).get_dwarf_info()
        units = list(dwarf.iter_CUs())
        die = next(d for d in units[-1].iter_DIEs() if d.tag == "DW_TAG_subprogram")
        origin = die.get_DIE_from_attribute("DW_AT_abstract_origin")
        assert origin.attributes["DW_AT_name"].value == b"caller_fn"
        assert die.attributes["DW_AT_low_pc"].value == sp.low
        rows = [e.state for e in dwarf.line_program_for_CU(units[-1]).get_entries()
                if e.state is not None and not e.state.end_sequence]
        assert any(r.address <= new_pc and r.line == row.line for r in rows)


def test_a_damaged_line_table_is_refused_by_the_reader(
        builds: dict[str, tuple[Path, Path, dict[str, object]]], tmp_path: Path) -> None:
    """The reader raises DwarfError on a unit that runs past the section; the rewrite then
    leaves the debug information out (the detour keeps its symbol) and still succeeds."""
    exe, _rw, _site = _get(builds, "gcc-dwarf5")
    data = bytearray(exe.read_bytes())
    image = parse_elf(bytes(data))
    line = image.section(".debug_line")
    assert line is not None
    data[line.offset : line.offset + 4] = (line.size + 100).to_bytes(4, "little")
    bad = parse_elf(bytes(data))
    with pytest.raises(DwarfError):
        read_line_table(bad)
    src, out = tmp_path / "bad", tmp_path / "bad.rw"
    src.write_bytes(bytes(data))
    src.chmod(0o755)
    res = run_cli("rewrite", src, "-o", out)
    assert res.rc == 0, res.err
    rewritten = parse_elf(out.read_bytes())
    new_info, old_info = rewritten.section(".debug_info"), bad.section(".debug_info")
    assert new_info is not None and old_info is not None
    assert rewritten.section_data(new_info) == bad.section_data(old_info)


def _gdb_bt(path: Path) -> str:
    if shutil.which("gdb") is None:
        pytest.skip("needs gdb")
    done = subprocess.run(["gdb", "-nx", "-batch", "-ex", "run", "-ex", "bt", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", DWARF_BUILDS)
def test_gdb_bt_names_the_caller_with_its_line(
        name: str, builds: dict[str, tuple[Path, Path, dict[str, object]]]) -> None:
    """SIGSEGV in the callee of a moved call, under gdb: frame #1 is in the detour, and gdb
    names caller_fn, its argument (its value is <optimized out> at -O2 when its location list
    does not cover the detour) and the line of the call."""
    _exe, rw, _site = _get(builds, name)
    out = _gdb_bt(rw)
    frame = next((ln for ln in out.splitlines() if ln.startswith("#1 ")), "")
    assert re.search(rf" in caller_fn \(x=[^)]*\) at \S*bt\.c:{CALL_LINE}$", frame), out
    assert "__usdtpatch_detour" not in out and ".usdtpatch" not in frame
    assert re.search(r"^#2 .* in main \(", out, re.M), out


@pytest.mark.slow
def test_gdb_bt_without_debug_info_names_the_split_part(
        builds: dict[str, tuple[Path, Path, dict[str, object]]]) -> None:
    _exe, rw, _site = _get(builds, "gcc-nodebug")
    out = _gdb_bt(rw)
    frame = next((ln for ln in out.splitlines() if ln.startswith("#1 ")), "")
    assert re.search(r" in caller_fn\.usdtpatch(\.0)? \(\)$", frame), out


@pytest.mark.slow
def test_perf_report_attributes_detour_samples_to_the_function(
        builds: dict[str, tuple[Path, Path, dict[str, object]]], tmp_path: Path) -> None:
    """perf record on the rewritten program running its loop (the detour is executed on every
    pass): samples in the detour carry caller_fn's split-part name and bt.c's line."""
    if shutil.which("perf") is None:
        pytest.skip("needs perf (linux-perf)")
    _exe, rw, _site = _get(builds, "gcc-dwarf5")
    env = dict(os.environ, HOME=str(tmp_path))
    data = tmp_path / "perf.data"
    rec = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-o", str(data), str(rw),
                          "loop"], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    if rec.returncode != 0 and "crash" not in rec.stderr:
        pytest.skip(f"perf record cannot run here: {rec.stderr.strip()[:200]}")
    rep = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--sort", "sym,srcline"],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    rows = [ln for ln in rep.stdout.splitlines() if "caller_fn" in ln]
    assert any(re.search(r"caller_fn\.usdtpatch\.0\s+bt\.c:\d+", ln) for ln in rows), rep.stdout
    assert "__usdtpatch_detour" not in rep.stdout


RUST_SRC = r"""
use std::arch::asm;

#[inline(never)]
fn callee(x: u64) -> u64 {
    if x == 3 {
        panic!("callee got {}", x);
    }
    x + 1
}

#[inline(never)]
fn caller_fn(n: u64) -> u64 {
    let mut i = 0u64;
    while i < n {
        unsafe {
            asm!(
                "990: nop",
                ".pushsection .note.stapsdt,\"\",\"note\"",
                ".balign 4",
                ".4byte 992f-991f, 994f-993f, 3",
                "991: .asciz \"stapsdt\"",
                "992: .balign 4",
                "993: .8byte 990b",
                ".8byte _.stapsdt.base",
                ".8byte 0",
                ".asciz \"rs\"",
                ".asciz \"each\"",
                ".asciz \"8@{0}\"",
                "994: .balign 4",
                ".popsection",
                ".ifndef _.stapsdt.base",
                ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat",
                ".weak _.stapsdt.base",
                ".hidden _.stapsdt.base",
                "_.stapsdt.base: .space 1",
                ".size _.stapsdt.base, 1",
                ".popsection",
                ".endif",
                in(reg) i,
                options(nostack, preserves_flags),
            );
        }
        i = callee(i);
    }
    i
}

fn main() {
    println!("{}", caller_fn(5));
}
"""
RUST_CALL = "panic.rs:44:13"  # `i = callee(i);`


@pytest.mark.slow
def test_rust_panic_backtrace_keeps_file_and_line(tmp_path: Path) -> None:
    """A Rust program with a USDT probe written by inline asm (a stapsdt note, as the
    `probe`/`usdt` crates emit; none is available offline), built with debug info: its
    panic backtrace (backtrace-rs, DWARF through gimli) names caller_fn at its line."""
    rustc = shutil.which("rustc") or os.path.expanduser("~/.cargo/bin/rustc")
    if not os.path.exists(rustc):
        pytest.skip("needs rustc")
    src, exe, rw = tmp_path / "panic.rs", tmp_path / "panic", tmp_path / "panic.rw"
    src.write_text(RUST_SRC)
    subprocess.run([rustc, "-g", "-C", "opt-level=1", "-o", str(exe), str(src)], check=True,
                   timeout=300, capture_output=True, cwd=tmp_path)
    # Rust's std takes syscall()'s address (its raw-syscall fallbacks): the fork guard
    # interposes the file's GOT slot of syscall() (issue 31; before, issue 19's refusal)
    res = run_cli("rewrite", exe, "-o", rw, "--json", "--calls", "move")
    assert res.rc == 0, res.err
    said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
    assert "syscall() interposed" in said["fork-guarded"], said
    (site,) = json.loads(res.out)["files"][0]["sites"]
    assert site["action"] == "detour" and site["calls"] == "moved", site
    env = dict(os.environ, RUST_BACKTRACE="1")
    want = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path, check=False).stderr
    got = subprocess.run([str(rw)], capture_output=True, text=True, env=env, timeout=60,
                         cwd=tmp_path, check=False).stderr
    assert re.search(rf"panic::caller_fn\n\s+at \./{RUST_CALL}\n", want), want
    assert re.search(rf"panic::caller_fn\n\s+at \./{RUST_CALL}\n", got), got
    assert "__usdtpatch_detour" not in got and ".usdtpatch." not in got


@pytest.mark.slow
def test_gdb_bt_through_the_debug_split(
        builds: dict[str, tuple[Path, Path, dict[str, object]]], tmp_path: Path) -> None:
    """The detours' unit goes with the debug information: `objcopy --only-keep-debug` and a
    debug link on the `strip --strip-debug`ged program, and gdb still names caller_fn."""
    _exe, rw, _site = _get(builds, "gcc-dwarf5")
    debug, shipped = tmp_path / "bt.debug", tmp_path / "bt"
    for argv in (["objcopy", "--only-keep-debug", str(rw), str(debug)],
                 ["strip", "--strip-debug", str(rw), "-o", str(shipped)],
                 ["objcopy", f"--add-gnu-debuglink={debug}", str(shipped)]):
        subprocess.run(argv, check=True, timeout=60, capture_output=True)
    out = _gdb_bt(shipped)
    frame = next((ln for ln in out.splitlines() if ln.startswith("#1 ")), "")
    assert re.search(rf" in caller_fn \(x=[^)]*\) at \S*bt\.c:{CALL_LINE}$", frame), out


def test_the_dwarf_reader_reads_leb128_with_the_one_reader() -> None:
    """DWARF's LEB128s are read by elf/cfi.py's reader and written by elf/ehframe.py's
    writer; a truncated or overlong one is a DwarfError (the rewrite then leaves the debug
    information out), never another exception."""
    from usdtpatch.elf.dwarf import DwarfReader
    from usdtpatch.elf.ehframe import sleb, uleb

    values = [0, 1, 127, 128, 624485, 1 << 63]
    r = DwarfReader(b"".join(uleb(v) + sleb(-v) for v in values))
    assert [(r.uleb(), r.sleb()) for _ in values] == [(v, -v) for v in values]
    assert r.pos == len(r.data)
    for bad in (b"\x80\x80", b"\xff" * 17, b""):
        with pytest.raises(DwarfError, match="DWARF LEB128"):
            DwarfReader(bad).uleb()
