"""How many sites of real test programs a rewrite converts (issue 22: >= 99.5%).

- bpftrace's USDT test programs (tests/testprogs/usdt_*.c, tests/testlibs/usdt_tp.c, from
  Debian's bpftrace source that `make test` fetches into build/cache/bpftrace-src), built
  with gcc and clang at -O0 (-fno-omit-frame-pointer, as bpftrace builds them), -O2 and -O3:
  at least 99.5% of their sites convert with the equivalence check on, and every skip names
  its finding code. Skipped, with the reason, when the source is not there.
- Programs of our own reproducing each skip class this issue fixed, so that the fixes are
  tested everywhere: probes one after another whose windows overlap (gcc -O2: six nops and
  a `jmp`, a probe right after another's window), and arguments indexed off %rsp under the
  red-zone guard (`-88(%rsp,%rax,8)`). The loop and aliasing classes are in
  test_verification_loops.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, build_programs
from usdtpatch.analysis.forms import guard_args
from usdtpatch.analysis.merge import joined
from usdtpatch.api import rewrite_plan
from usdtpatch.elf.args import parse_args
from usdtpatch.rewriter.plan import Action, SiteDecision

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]

# USDTPATCH_BPFTRACE_SRC: another unpacked bpftrace source tree (for a measurement by hand)
BPFTRACE_SRC = Path(os.environ.get("USDTPATCH_BPFTRACE_SRC",
                                   ROOT / "build" / "cache" / "bpftrace-src"))
REQUIRED_RATE = 0.995

OWN_C = r"""
#include <sys/sdt.h>
#include <stdint.h>
#include <sys/time.h>

struct item { uint64_t u64; int64_t i64; uint32_t u32; int32_t i32; };

static long rows(void)
{
    struct timeval tv;
    gettimeofday(&tv, 0);
    DTRACE_PROBE1(own, r1, tv.tv_sec);
    DTRACE_PROBE1(own, r1, tv.tv_sec);
    DTRACE_PROBE1(own, r2, tv.tv_sec);
    DTRACE_PROBE1(own, r3, tv.tv_sec);
    DTRACE_PROBE1(own, r3, tv.tv_sec);
    DTRACE_PROBE1(own, r3, tv.tv_sec);
    return tv.tv_sec;
}

__attribute__((noinline)) static void stores(void)
{
    volatile unsigned long a = 0xfffffffffffffff0UL;
    volatile unsigned int b = 0xf3f2f1f0U;
    DTRACE_PROBE1(own, s64, a);
    a = 0xf3f2f1f0U;
    DTRACE_PROBE1(own, s32, b);
    b = 0xf1f0U;
    DTRACE_PROBE1(own, s16, b);
}

__attribute__((noinline)) static void indexed(volatile struct item *a, int i)
{
    volatile struct item array[8];
    for (int k = 0; k < 8; k++) {
        array[k].u64 = a[k].u64;
        array[k].i64 = a[k].i64;
        array[k].u32 = a[k].u32;
        array[k].i32 = a[k].i32;
    }
    DTRACE_PROBE1(own, index_u64, array[i].u64);
    DTRACE_PROBE1(own, index_64, array[i].i64);
    DTRACE_PROBE1(own, index_u32, array[i].u32);
    DTRACE_PROBE1(own, index_32, array[i].i32);
}

int main(int argc, char **argv)
{
    (void)argv;
    struct item a[8] = {{0}};
    indexed(a, argc & 7);
    stores();
    if (argc > 1)
        return 0;
    while (1)
        rows();
    return 0;
}
"""

OWN_BUILDS = {
    "gcc-O2": ("gcc", ["-g", "-O2"]),
    "gcc-O3-nopie": ("gcc", ["-g", "-O3", "-no-pie"]),
    "gcc-Os": ("gcc", ["-g", "-Os"]),
    "clang-O2": ("clang", ["-g", "-O2"]),
}


def _convert(path: Path) -> list[SiteDecision]:
    return list(rewrite_plan(str(path), form="nop5", jobs=1).sites)


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_programs(tmp_path_factory.mktemp("own"), OWN_C, OWN_BUILDS, "own.c")


@pytest.mark.parametrize("name", list(OWN_BUILDS))
def test_own_programs_convert_every_site(own: dict[str, Path], name: str) -> None:
    """Every site converts: the rows of probes (window-overlaps-site before: the later site's
    window overlapped the earlier one's) and the indexed arguments (guard-impossible before:
    `-88(%rsp,%rax,8)` was not rewritten for the guard)."""
    if name not in own:
        pytest.skip(f"no compiler for {name}")
    sites = _convert(own[name])
    assert len(sites) == 13
    bad = [(s.probe.name, s.code, s.reason) for s in sites if s.action is Action.SKIPPED]
    assert bad == []
    # check says so too: it joins the rows' windows as rewrite does (it said the last site of
    # a row window-overlaps-site while rewrite moved it along)
    from usdtpatch.analysis.check import BLOCKED, check
    from usdtpatch.api import load

    said = [(s.probe.name, s.blocked) for s in check(load(str(own[name]))).sites
            if s.outcome == BLOCKED]
    assert said == []


def test_guard_rewrites_indexed_stack_arguments() -> None:
    """disp(%rsp,%i,s) gets disp + 128 like disp(%rsp); %rsp itself and %rsp as an index
    are still refused."""
    args = parse_args("-8@-88(%rsp,%rax,8) 4@(%rsp,%rdx) 2@8(%rsp) -4@%eax")
    assert guard_args(args) == ("-8@40(%rsp,%rax,8) 4@128(%rsp,%rdx) 2@136(%rsp) -4@%eax",
                                None)
    assert guard_args(parse_args("8@%rsp"))[1] is not None
    assert guard_args(parse_args("8@8(%rax,%rsp,1)"))[1] is not None


def test_joined_windows_and_what_cannot_be_joined(own: dict[str, Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The joined window is the union, moving both probes; windows of another function, not
    overlapping, or joined past MAX_WINDOW bytes are not joined."""
    from dataclasses import replace

    from usdtpatch.analysis import check as check_module
    from usdtpatch.api import load

    if "gcc-O2" not in own:
        pytest.skip("no gcc")
    # each site's own window, as check reports it without joining
    monkeypatch.setattr(check_module, "join_following", lambda w, _order, _n: w)
    rep = check_module.check(load(str(own["gcc-O2"])))
    wins = sorted((s.window.window for s in rep.sites
                   if s.window is not None and s.window.window is not None),
                  key=lambda w: w.probe_address)
    pairs = [(a, b) for a in wins for b in wins
             if a.start <= b.start < a.end < b.end and a.function_start == b.function_start]
    assert pairs, "the rows of probes give overlapping windows"
    a, b = pairs[0]
    j = joined(a, b)
    assert j is not None
    assert (j.start, j.end) == (a.start, b.end)
    assert [i.address for i in j.insns] == sorted({i.address for i in (*a.insns, *b.insns)})
    assert len(j.code) == j.end - j.start - j.padding_bytes
    back = joined(b, a)  # led by b: the same union (a starts before b, which it holds)
    assert back is not None and (back.start, back.end) == (j.start, j.end)
    assert back.probe_address == b.probe_address and back.code == j.code
    assert joined(a, replace(a, start=a.end, end=a.end + 5, probe_address=a.end)) is None
    far = [w for w in wins if w.function_start != a.function_start]
    assert far and joined(a, far[0]) is None
    assert joined(a, replace(b, end=a.start + 65)) is None


JOINBACK = ROOT / "tests" / "data" / "sites" / "joinback.c"


def test_a_later_backward_window_holding_the_earlier_is_joined(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzz campaign's pair 1-1779: p3's only window is a backward one that starts before
    p2's and holds it (its 8-bit ways in through a stub in its own filler); joined, both move
    in one detour (before: p3 window-overlaps-site, check and rewrite alike), and the program
    prints what the original prints."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    exe, out = tmp_path / "joinback", tmp_path / "joinback.new"
    subprocess.run(["gcc", "-Os", "-fno-pie", "-no-pie", "-mno-red-zone",
                    "-fno-omit-frame-pointer", "-g", str(JOINBACK), "-o", str(exe)], check=True)
    alone = _windows_alone(exe, monkeypatch)
    a, b = alone["p2"], alone["p3"]
    assert a is not None and b is not None and b.start < a.start < a.end < b.end, (a, b)
    sites = _joined_and_run_the_same(exe, out)
    assert sites["p2"].action is Action.DETOUR and sites["p3"].action is Action.MOVED


JOINSTUB = ROOT / "tests" / "data" / "sites" / "joinstub.c"


def test_windows_holding_their_stubs_are_joined(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzz campaign's pair 1-6968 (csmith, gcc -O1 static-pie): p1's and p4's windows
    overlap their neighbours' and hold the stubs of their 8-bit ways in, in their filler;
    joined, each stub stays where it was (before: window-overlaps-site, three sites), and
    the program prints what the original prints."""
    if shutil.which("gcc") is None or not Path("/usr/include/csmith/csmith.h").is_file():
        pytest.skip("needs gcc and csmith.h")
    exe, out = tmp_path / "joinstub", tmp_path / "joinstub.new"
    subprocess.run(["gcc", "-w", "-O1", "-fno-omit-frame-pointer", "-g",
                    "-I/usr/include/csmith", "-fPIE", "-static-pie", str(JOINSTUB), "-o",
                    str(exe)], check=True)
    alone = _windows_alone(exe, monkeypatch)
    a, b = alone["p0"], alone["p1"]
    assert a is not None and b is not None and b.start < a.end
    assert any(r.stub is not None and b.start <= r.stub < b.end for r in b.retargets)
    sites = _joined_and_run_the_same(exe, out)
    assert [n for n, s in sites.items() if s.action is Action.SKIPPED] == []


def _windows_alone(exe: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Each site's window as check finds it without joining (the shape a join test needs),
    by probe name."""
    from usdtpatch.analysis import check as check_module
    from usdtpatch.api import load

    with monkeypatch.context() as m:
        m.setattr(check_module, "join_following", lambda w, _order, _n: w)
        return {s.probe.name: s.window.base for s in check_module.check(load(str(exe))).sites
                if s.window is not None}


def _joined_and_run_the_same(exe: Path, out: Path) -> dict[str, SiteDecision]:
    """check blocks no site of `exe`; `rewrite -o out` succeeds and `out` exits 0 and prints
    what `exe` prints. The rewrite's decisions, by probe name."""
    from usdtpatch.analysis import check as check_module
    from usdtpatch.api import load

    said = {s.probe.name: s.outcome for s in check_module.check(load(str(exe))).sites}
    assert check_module.BLOCKED not in said.values(), said
    sites = {s.probe.name: s for s in _convert(exe)}
    done = subprocess.run([sys.executable, "-m", "usdtpatch", "rewrite", "-o", str(out),
                           str(exe)], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    runs = [subprocess.run([str(p)], capture_output=True, timeout=30, check=False)
            for p in (exe, out)]
    assert runs[0].returncode == runs[1].returncode == 0 and runs[0].stdout == runs[1].stdout
    return sites


def _bpftrace_builds(tmp: Path) -> list[Path]:
    tests = BPFTRACE_SRC / "tests"
    progs = sorted((tests / "testprogs").glob("usdt_*.c"))
    lib = tests / "testlibs" / "usdt_tp.c"
    out: list[Path] = []
    for cc in ("gcc", "clang"):
        if shutil.which(cc) is None:
            continue
        for opt in ("-O0", "-O2", "-O3"):
            d = tmp / f"{cc}{opt}"
            d.mkdir()
            flags = ["-g", opt, "-DHAVE_SYSTEMTAP_SYS_SDT_H", "-w"]
            if opt == "-O0":
                flags.append("-fno-omit-frame-pointer")
            so = d / "libusdt_tp.so"
            subprocess.run([cc, *flags, "-fPIC", "-shared", "-o", str(so), str(lib),
                            f"-I{lib.parent}"], check=True, capture_output=True)
            out.append(so)
            for src in progs:
                exe = d / src.stem
                extra = [f"-I{lib.parent}", f"-L{d}", "-lusdt_tp"] \
                    if src.stem == "usdt_lib" else ["-lpthread"]
                subprocess.run([cc, *flags, "-no-pie", "-o", str(exe), str(src), *extra],
                               check=True, capture_output=True)
                out.append(exe)
    return out


@pytest.mark.slow
def test_bpftrace_test_programs_convert(tmp_path: Path) -> None:
    """>= 99.5% of the sites of bpftrace's USDT test programs (gcc, clang; -O0, -O2, -O3)
    convert with the check on; every skipped site names its code."""
    if not (BPFTRACE_SRC / "tests" / "testprogs").is_dir():
        pytest.skip(f"no bpftrace source in {BPFTRACE_SRC} (make test fetches it)")
    total = converted = 0
    skipped: list[tuple[str, str, str | None]] = []
    for path in _bpftrace_builds(tmp_path):
        for s in _convert(path):
            if s.code == "site-already-5-byte":
                continue
            total += 1
            if s.action is Action.SKIPPED:
                skipped.append((f"{path.parent.name}/{path.name}", s.probe.name, s.code))
            else:
                converted += 1
    assert total > 250
    assert all(code for _f, _n, code in skipped)
    assert converted >= REQUIRED_RATE * total, skipped
