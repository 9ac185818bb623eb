"""What moving an instruction changes is kept true for unwinding and exceptions (issue 30,
classes 1 and 2), on programs built here (tests/data/eh/, gcc and clang, -O0 to -O3, PIE,
non-PIE, a shared object with its driver, static):

- argsize.cc: a call moved under `DW_CFA_GNU_args_size` (clang pushes its 7th and 8th
  arguments, the probe comes between the pushes and the call): the detour's FDE repeats the
  args_size of every copied instruction, so an exception through the moved call lands with
  the pushed arguments popped. Before, it landed 16 bytes off: SIGSEGV (clang -O2/-O3, PIE,
  non-PIE, static, shared).
- nce.cc: a fault in a detour in -fnon-call-exceptions code, whose SIGSEGV handler throws:
  the detour's own LSDA covers the faulting load with the original landing pad. Before, no
  row covered it: std::terminate, exit 134 (gcc -O1 to -O3, PIE, non-PIE, shared). A static
  link, where the detour can get no FDE, refuses the window (`window-eh-unwind`, as check
  says). With "backtrace" the handler counts backtrace()'s frames from the fault in the
  detour: the same as the original's (the FDE's rows repeat the original's, signal frame
  included).

Each program runs original and rewritten (output, exit status); check predicts each
rewrite; the rewritten programs also run under bpftrace with the probe attached.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.test_check_equals_rewrite import _mismatches
from usdtpatch import api
from usdtpatch.analysis.calls import may_fault
from usdtpatch.elf.cfi import CallSite, Cie, Fde, Lsda
from usdtpatch.elf.ehframe import Cfa, Row, detour_call_sites, fde_program, rows_at
from usdtpatch.errors import UnsupportedError
from usdtpatch.rewriter.plan import Status
from usdtpatch.x86.decode import CodeInsn, Flow, MemRef

pytestmark = [pytest.mark.needs_cc]

DATA = Path(__file__).resolve().parent / "data" / "eh"

# build name -> (compiler, flags, must the site be rewritten)
ARGSIZE = {
    "clang-O2": ("clang++", ["-O2"], True),
    "clang-O3": ("clang++", ["-O3"], True),
    "clang-O2-nopie": ("clang++", ["-O2", "-no-pie"], True),
    # clang passes --eh-frame-hdr to a static link too: the detour gets its FDE there
    "clang-O2-static": ("clang++", ["-O2", "-static"], True),
    "clang-O0": ("clang++", ["-O0"], True),
    "gcc-O0": ("g++", ["-O0"], True),
    "gcc-O2": ("g++", ["-O2"], True),
    "gcc-Os": ("g++", ["-Os"], True),
}
NCE = {
    "gcc-O1": ("g++", ["-O1"], True),
    "gcc-O2": ("g++", ["-O2"], True),
    "gcc-O3": ("g++", ["-O3"], True),
    "gcc-O2-nopie": ("g++", ["-O2", "-no-pie"], True),
    "gcc-O0": ("g++", ["-O0"], True),
    "clang-O2": ("clang++", ["-O2"], True),
    "clang-O0": ("clang++", ["-O0"], True),
}


def _cc(cc: str, flags: Sequence[str], out: Path, source: Path, *extra: str) -> Path:
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    done = subprocess.run([cc, *flags, "-o", str(out), str(source), *extra],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 and "-static" in flags:
        pytest.skip(f"{cc} cannot link a static C++ program here: {done.stderr[-300:]}")
    assert done.returncode == 0, f"{cc} {' '.join(flags)}: {done.stderr[-3000:]}"
    return out


def _run(path: Path, *args: str) -> tuple[int, str]:
    res = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60,
                         check=False)
    return res.returncode, res.stdout


def _build(tmp: Path, source: str, cc: str, flags: Sequence[str]) -> Path:
    extra = ["-fnon-call-exceptions"] if source == "nce.cc" else []
    return _cc(cc, [*flags, *extra], tmp / source.removesuffix(".cc"), DATA / source)


def _rewritten(prog: Path, tmp: Path, calls: str = "auto") -> tuple[Path, api.RewriteOutcome]:
    out = tmp / f"{prog.name}.{calls}.rw"
    return out, api.rewrite(prog, out, calls=calls)


def _site(o: api.RewriteOutcome) -> str:
    (s,) = o.sites
    return f"{s.status.value} {s.code or ''} {s.reason}"


# the default emulates the call where the window ends with it (its callee sees the original
# return address, whose unwind row is the original's); `move` is the case args_size is about
@pytest.mark.parametrize("calls", ["auto", "move"])
@pytest.mark.parametrize("build", list(ARGSIZE))
def test_exception_through_a_call_moved_under_pushed_arguments(build: str, calls: str,
                                                               tmp_path: Path) -> None:
    cc, flags, rewritten = ARGSIZE[build]
    prog = _build(tmp_path, "argsize.cc", cc, flags)
    want = _run(prog)
    assert want[0] == 0 and "42 -1" in want[1], want  # the exception was caught
    out, o = _rewritten(prog, tmp_path, calls)
    (s,) = [s for s in o.sites if s.probe.name == "argsize"]  # and a static C library's
    assert (s.status is Status.REWRITTEN) == rewritten, s.reason
    assert _run(out) == want, s.reason
    assert _mismatches(prog) == []


def test_the_clang_builds_move_the_call_under_args_size(tmp_path: Path) -> None:
    """The case the test above is about: the window holds the call, which is moved, and the
    detour's FDE sets DW_CFA_GNU_args_size (readelf as the oracle)."""
    prog = _build(tmp_path, "argsize.cc", "clang++", ["-O2"])
    out, o = _rewritten(prog, tmp_path, "move")
    (s,) = o.sites
    assert s.status is Status.REWRITTEN and s.calls == "moved", _site(o)
    assert s.detour is not None
    frames = subprocess.run(["readelf", "--debug-dump=frames", str(prog)], capture_output=True,
                            text=True, check=False).stdout
    assert "DW_CFA_GNU_args_size: 16" in frames
    frames = subprocess.run(["readelf", "--debug-dump=frames", str(out)], capture_output=True,
                            text=True, check=False).stdout
    detour_fde = frames[frames.index(f"pc={s.detour.address:016x}"):]
    detour_fde = detour_fde[: detour_fde.find("\n\n")]
    assert "DW_CFA_GNU_args_size: 16" in detour_fde, detour_fde


@pytest.mark.parametrize("build", list(NCE))
def test_a_fault_in_a_detour_reaches_its_landing_pad(build: str, tmp_path: Path) -> None:
    cc, flags, rewritten = NCE[build]
    prog = _build(tmp_path, "nce.cc", cc, flags)
    want = _run(prog)
    if cc == "g++":  # clang's -fnon-call-exceptions does not cover the load: it terminates
        assert want[0] == 0 and "2 -1" in want[1], want
    out, o = _rewritten(prog, tmp_path)
    assert (o.sites[0].status is Status.REWRITTEN) == rewritten, _site(o)
    assert _run(out) == want, _site(o)
    assert _run(out, "backtrace") == _run(prog, "backtrace"), _site(o)
    assert _mismatches(prog) == []


def test_a_static_link_refuses_the_window_the_lsda_covers(tmp_path: Path) -> None:
    """gcc writes no PT_GNU_EH_FRAME for a static link: the detour could get neither FDE nor
    LSDA, and the fault would end in std::terminate (and backtrace() stop at the detour):
    the window is refused, as check says."""
    prog = tmp_path / "nce-static"
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    built = subprocess.run(["g++", "-O2", "-fnon-call-exceptions", "-static", "-o", str(prog),
                            str(DATA / "nce.cc")], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"g++ cannot link a static C++ program here: {built.stderr[-300:]}")
    out, o = _rewritten(prog, tmp_path)
    (s,) = [s for s in o.sites if s.probe.name == "nce"]  # and the C library's probes
    assert s.status is Status.UNCHANGED and s.code == "window-eh-unwind", s.reason
    (sc,) = [s for s in api.check(prog).report.sites if s.probe.name == "nce"]
    assert sc.blocked == "window-eh-unwind"
    assert _run(out) == _run(prog)
    assert _run(out, "backtrace") == _run(prog, "backtrace")
    assert _mismatches(prog) == []


def test_a_detour_lsda_that_cannot_be_built_refuses_the_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the detour's own LSDA cannot be built (here: made to fail, as an encoding that
    would need a relocation at its new place fails), the window holding the faulting load is
    not used, by check and rewrite alike (`window-eh-unwind`)."""
    from usdtpatch.analysis import calls

    prog = _build(tmp_path, "nce.cc", "g++", ["-O2"])
    monkeypatch.setattr(calls, "detour_eh", lambda *_a: "a type table pointer cannot move")
    _out, o = _rewritten(prog, tmp_path)
    (s,) = o.sites
    assert s.status is Status.UNCHANGED and s.code == "window-eh-unwind", _site(o)
    assert "cannot be built (a type table pointer cannot move)" in s.reason
    (sc,) = api.check(prog).report.sites
    assert sc.blocked == "window-eh-unwind"
    assert _mismatches(prog) == []


def _shared(tmp: Path, source: str, cc: str, flags: Sequence[str]) -> tuple[Path, Path]:
    """lib<name>.so built from `source` with -DEH_LIB and its driver (-DEH_DRIVER, rpath
    $ORIGIN) in `tmp`."""
    name = source.removesuffix(".cc")
    extra = ["-fnon-call-exceptions"] if source == "nce.cc" else []
    lib = _cc(cc, [*flags, *extra, "-DEH_LIB", "-shared", "-fPIC"], tmp / f"lib{name}.so",
              DATA / source)
    drv = _cc(cc, [*flags, *extra, "-DEH_DRIVER"], tmp / name, DATA / source,
              f"-L{tmp}", f"-l{name}", "-Wl,-rpath,$ORIGIN")
    return lib, drv


@pytest.mark.parametrize(("source", "cc"), [("argsize.cc", "clang++"), ("nce.cc", "g++")])
def test_shared_object(source: str, cc: str, tmp_path: Path) -> None:
    orig, new = tmp_path / "orig", tmp_path / "new"
    orig.mkdir()
    new.mkdir()
    lib, drv = _shared(orig, source, cc, ["-O2"])
    shutil.copy2(drv, new / drv.name)
    o = api.rewrite(lib, new / lib.name)
    assert o.sites[0].status is Status.REWRITTEN, _site(o)
    assert _run(new / drv.name) == _run(drv)
    assert _run(new / drv.name, "backtrace") == _run(drv, "backtrace")
    assert _mismatches(lib) == []


@pytest.mark.slow
@pytest.mark.live
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize(("source", "cc", "probe"), [("argsize.cc", "clang++", "argsize"),
                                                     ("nce.cc", "g++", "nce")])
def test_traced(source: str, cc: str, probe: str, tmp_path: Path) -> None:
    """Traced by bpftrace (the probe attached, so the kernel optimizes the detour's nop5):
    the rewritten program prints what the original prints, and the probe fires as often."""
    orig, new = tmp_path / "orig", tmp_path / "new"
    orig.mkdir()
    new.mkdir()
    prog = _build(orig, source, cc, ["-O2"])
    out = new / prog.name
    o = api.rewrite(prog, out)
    assert o.sites[0].status is Status.REWRITTEN, _site(o)

    def traced(path: Path) -> list[str]:
        script = f'usdt:{path}:eh:{probe} {{ printf("@ hit\\n"); }}'
        done = subprocess.run(["bpftrace", "-e", script, "-c", str(path)], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return [ln for ln in done.stdout.splitlines() if not ln.startswith("Attaching")]

    want, got = traced(prog), traced(out)
    # the hits and the program's lines, each in order (bpftrace's and the program's writes
    # interleave as their buffers flush)
    assert want.count("@ hit") == 4 and got.count("@ hit") == 4
    assert [ln for ln in got if ln != "@ hit"] == [ln for ln in want if ln != "@ hit"]
    assert "total" in want[-1] or any("total" in ln for ln in want)


# ---------------------------------------------------------------------------------------
# The pieces, with the inputs they must reject

def _cie(instructions: bytes = b"") -> Cie:
    return Cie(0, 1, "zR", 1, -8, 16, 0x1B, 0xFF, None, instructions)


def _fde(program: bytes) -> Fde:
    return Fde(0x100, _cie(b"\x0c\x07\x08\x90\x01"), 0x1000, 0x1100, None, program)


def test_rows_carry_args_size() -> None:
    # advance 4; args_size 16; advance 4; args_size 0
    rows = rows_at(_fde(b"\x44\x2e\x10\x44\x2e\x00"), [0x1000, 0x1004, 0x1006, 0x1008])
    assert [rows[a].args_size for a in (0x1000, 0x1004, 0x1006, 0x1008)] == [0, 16, 16, 0]
    assert rows[0x1000].cfa == Cfa(7, 8) and rows[0x1004].cfa == Cfa(7, 8)
    # written back: the detour's program sets it where it changes
    prog = fde_program(0x2000, [(0x2000, rows[0x1000]), (0x2004, rows[0x1004]),
                                (0x2008, rows[0x1008])])
    assert b"\x2e\x10" in prog and prog.endswith(b"\x2e\x00")
    assert rows_at(_fde(b"\x44\x2e\x10"), [0x1004])[0x1004] == Row(
        Cfa(7, 8), rows[0x1004].regs, 16)


def test_args_size_the_unwinders_read_differently_is_refused() -> None:
    # remember_state; args_size 16; restore_state: libgcc keeps 16, libunwind goes back to 0
    program = b"\x0a\x2e\x10\x41\x0b"
    with pytest.raises(UnsupportedError, match="GNU_args_size"):
        rows_at(_fde(program), [0x1002])
    # where both read the same, the program is replayed
    assert rows_at(_fde(b"\x0a\x41\x0b\x2e\x10\x41"), [0x1002])[0x1002].args_size == 16


def test_detour_call_sites_give_each_lookup_the_original_row() -> None:
    lsda = Lsda(0, 0x1000, (CallSite(0x1000, 0x1005, 0x1080, 1),
                            CallSite(0x1005, 0x100A, None, 0)))
    # a load at 0x1000 (covered, landing pad); a call at 0x1003 whose start is in the first
    # row and whose return address - 1 is in the second; an instruction left out at 0x100a
    spans = [(0x1000, 0x1003, 0x2000, 0x2003, False), (0x1003, 0x1008, 0x2003, 0x2008, True),
             (0x100A, 0x100C, 0x2008, 0x200A, False)]
    rows = detour_call_sites(lsda, spans)
    assert [(r.start, r.end, r.landing_pad, r.action) for r in rows] == [
        (0x2000, 0x2004, 0x1080, 1), (0x2004, 0x2008, None, 0)]
    # a non-call instruction is looked up at its own address (a signal frame's pc)
    rows = detour_call_sites(lsda, [(0x1004, 0x1007, 0x2000, 0x2003, False)])
    assert [(r.landing_pad, r.action) for r in rows] == [(0x1080, 1)]


def _insn(mnemonic: str, op_str: str, mem: bool) -> CodeInsn:
    ref = MemRef(disp=0, base="rdi", index=None, scale=1) if mem else None
    return CodeInsn(0, 3, mnemonic, op_str, Flow.NONE, None, ref, None, mnemonic)


def test_may_fault() -> None:
    assert may_fault(_insn("movq", "(%rdi), %rax", True))
    assert may_fault(_insn("idivl", "%ecx", False))
    assert may_fault(_insn("ud2", "", False))
    assert not may_fault(_insn("nopl", "(%rax)", True))
    assert not may_fault(_insn("leaq", "8(%rdi), %rax", True))
    assert not may_fault(_insn("addq", "%rsi, %rax", False))
    assert not may_fault(_insn("callq", "0x1000", False))


def test_relaid_window_keeps_call_site_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-laid window shifts instructions inside their stretch: where one can fault, each
    boundary of the LSDA's call-site entries inside the window is kept as an anchor (a fault
    is looked up at the instruction's own address), and one inside an instruction refuses
    the window; without a faulting instruction nothing is added."""
    from types import SimpleNamespace

    from usdtpatch.analysis import relay

    lsda = Lsda(0, 0x1000, (CallSite(0x1000, 0x1004, None, 0),
                            CallSite(0x1004, 0x1010, 0x1080, 1)))
    monkeypatch.setattr(relay, "parse_lsda", lambda _i, _a, _f: lsda)
    fde = Fde(0x100, _cie(), 0x1000, 0x1100, 0x5000, b"")
    ctx: Any = SimpleNamespace(image=None, cfi=SimpleNamespace(lookup=lambda _a: fde))

    def insn(at: int, size: int, mem: bool) -> CodeInsn:
        return _insn("movq" if mem else "nop", "", mem)._replace(address=at, size=size)

    window = (insn(0x1000, 1, False), insn(0x1001, 3, True), insn(0x1004, 5, True))
    assert relay.call_site_boundaries(ctx, window) == {0x1004}
    inside = (insn(0x1000, 1, False), insn(0x1001, 5, True))  # 0x1004 inside [0x1001, 0x1006)
    assert "inside an instruction" in str(relay.call_site_boundaries(ctx, inside))
    quiet = (insn(0x1000, 1, False), insn(0x1001, 5, False))
    assert relay.call_site_boundaries(ctx, quiet) == set()
