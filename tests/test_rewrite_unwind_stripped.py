"""Backtraces through a detour after strip (issue 33, item 1; docs/rewrite.md, "What each
consumer needs").

gdb reads the section named `.eh_frame` and merges `.debug_frame`; elfutils (eu-stack, and
perf's DWARF unwinding through libdw) reads `.eh_frame` by name, then the module's
`.debug_frame`. The detours' FDEs were in `.usdtpatch.eh_frame` (read by neither) and a
non-allocated `.debug_frame` (gone with strip): a stripped rewritten program's backtrace
from a callee of a moved call lost every frame past the detour (gdb printed the stack's
contents as frames, eu-stack stopped: "No DWARF information found"). Now the detours'
`.debug_frame` is allocated, in the new segment, which strip, `strip --strip-debug` and
eu-strip keep.

Each program (tests/data/unwind: a C program, a C++ throw, a shared library) is shipped as
it is, stripped, stripped of debug information and eu-stripped, original and rewritten alike,
and the backtraces compared frame by frame: the same number of frames and the same names
(the original's symbol or `??` where the original's is `??`; a detour's symbol
`<function>.usdtpatch.<n>` counts as its function's, as `f.cold` is f's).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.needs_cc, pytest.mark.slow]

DATA = ROOT / "tests" / "data" / "unwind"
HOW = ["as-is", "strip", "strip-debug", "eu-strip"]
PROGRAMS = ["c", "cxx", "lib"]


def _run(*argv: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120,
                          check=False, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, (argv, done.stderr)
    return done  # type: ignore[no-any-return]


def _ship(how: str, src: Path, dst: Path) -> None:
    if how == "as-is":
        shutil.copy(src, dst)
    elif how == "eu-strip":
        _run("eu-strip", src, "-o", dst)
    else:
        _run("strip", *(["--strip-debug"] if how == "strip-debug" else []), src, "-o", dst)
    dst.chmod(0o755)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], Path]:
    """{(program, how, 'orig' or 'rw'): a folder holding `prog` (and libbtc.so)}."""
    for tool in ("gcc", "g++", "strip", "eu-strip", "gdb"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    d = tmp_path_factory.mktemp("unwind")
    _run("gcc", "-O2", "-g", "-o", d / "c", DATA / "btc.c")
    _run("g++", "-O2", "-g", "-o", d / "cxx", DATA / "btx.cc")
    _run("gcc", "-O2", "-g", "-shared", "-fPIC", "-DLIB", "-o", d / "libbtc.so", DATA / "btc.c")
    _run("gcc", "-O2", "-g", "-o", d / "lib", DATA / "btmain.c", f"-L{d}", "-lbtc")
    out = {}
    for prog in PROGRAMS:
        target = d / ("libbtc.so" if prog == "lib" else prog)
        rw = d / f"{target.name}.rw"
        res = run_cli("rewrite", target, "-o", rw, "--calls", "move")
        assert res.rc == 0, res.err
        for how in HOW:
            for kind, src in (("orig", target), ("rw", rw)):
                at = d / f"{prog}-{how}-{kind}"
                at.mkdir()
                if prog == "lib":
                    shutil.copy(d / "lib", at / "prog")
                    _ship(how, src, at / "libbtc.so")
                else:
                    _ship(how, src, at / "prog")
                out[(prog, how, kind)] = at
    return out


_FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(\S+)")


def _names(frames: list[str]) -> list[str]:
    """The function names of a backtrace, a detour's symbol taken as its function's."""
    return [re.sub(r"\.usdtpatch(\.\d+)?$", "", name) for name in frames]


def _same(got: list[str], want: list[str]) -> None:
    """Frame for frame the same names (a stripped shared library's too: its detours have
    `.dynsym` entries, usdtpatch.elf.dynsym; before, the detour's frame was `??` where the
    original's said `framed`)."""
    assert got == want


def _gdb(folder: Path, prog: str, arg: str) -> list[str]:
    cmds = ["set debuginfod enabled off", "set pagination off"]
    if prog == "cxx":
        cmds.append("catch throw")
    cmds += ["run", "bt"]
    argv = ["gdb", "-q", "-nx", "-batch"]
    for c in cmds:
        argv += ["-ex", c]
    done = subprocess.run([*argv, "--args", str(folder / "prog"),
                           *([arg] if prog != "cxx" else [])],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={"LD_LIBRARY_PATH": str(folder), "PATH": "/usr/bin:/bin"})
    frames = [m.group(2) for ln in done.stdout.splitlines() if (m := _FRAME.match(ln))]
    assert frames, done.stdout + done.stderr
    bad = [ln for ln in done.stdout.splitlines() if "Backtrace stopped" in ln]
    return _names(frames) + bad


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("prog", PROGRAMS)
def test_gdb_bt_from_a_callee_of_a_moved_call(prog: str, how: str,
                                               dirs: dict[tuple[str, str, str], Path]) -> None:
    """abort() in the callee (a C++ throw caught by `catch throw`): frame for frame the
    original's backtrace."""
    want = _gdb(dirs[(prog, how, "orig")], prog, "1")
    got = _gdb(dirs[(prog, how, "rw")], prog, "1")
    _same(got, want)
    assert len(got) >= 4 and not any("Backtrace stopped" in g for g in got)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("prog", ["c", "lib"])
def test_gdb_bt_from_a_fault_in_a_detour(prog: str, how: str,
                                         dirs: dict[tuple[str, str, str], Path]) -> None:
    """SIGSEGV on the load moved into the detour of the second probe."""
    want = _gdb(dirs[(prog, how, "orig")], prog, "3")
    got = _gdb(dirs[(prog, how, "rw")], prog, "3")
    _same(got, want)


def _eu_stack(folder: Path) -> list[str]:
    proc = subprocess.Popen([str(folder / "prog"), "2"], stdout=subprocess.DEVNULL,
                            env={"LD_LIBRARY_PATH": str(folder)})
    try:
        for _ in range(200):  # it stops itself (SIGSTOP) in the callee
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "T":
                break
            time.sleep(0.05)
        done = subprocess.run(["eu-stack", "-p", str(proc.pid)], capture_output=True,
                              text=True, timeout=60, check=False)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    names = []
    for ln in done.stdout.splitlines():
        m = re.match(r"^#\d+\s+0x[0-9a-f]+\s*(\S*)", ln)
        if m:
            names.append(m.group(1) or "??")
    assert names, done.stdout + done.stderr
    errors = [ln for ln in done.stderr.splitlines() if "dwfl_thread_getframes" in ln]
    return _names(names) + errors


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("prog", ["c", "lib"])
def test_eu_stack_from_a_callee_of_a_moved_call(prog: str, how: str,
                                                dirs: dict[tuple[str, str, str], Path]
                                                ) -> None:
    want = _eu_stack(dirs[(prog, how, "orig")])
    got = _eu_stack(dirs[(prog, how, "rw")])
    _same(got, want)
