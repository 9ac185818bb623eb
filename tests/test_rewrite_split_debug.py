"""Debug information split off before or after the rewrite (issue 33; docs/rewrite.md,
"Debugging information"; the finding `debug-file-stale`).

Split before (objcopy --only-keep-debug, strip --strip-debug, --add-gnu-debuglink, then
rewrite): the rewrite cannot see the debug file, and says so. What the tests hold, as the
docs say it: gdb still finds the file for the output through `.gnu_debuglink` (its name and
the debug file's CRC, not the build-id: the output's build-id is a new one, the debug file
keeps the original's, so a lookup by build-id does not find it; with --keep-build-id it
does); its line rows describe the original code: `break btc.c:29`, a line with a row inside
the second probe's window, puts an int3 inside the moved code and the program stops with
SIGILL; the detour's frame has no line. Split after (rewrite, then split the output): no
finding, the build-ids match, the same breakpoints are hit as in the original and the
program ends as it does, and the detour's frame has its line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.needs_cc, pytest.mark.slow]

SRC = ROOT / "tests" / "data" / "unwind" / "btc.c"


def _run(*argv: str | Path) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, (argv, done.stderr)
    return done.stdout + done.stderr


def _split(prog: Path) -> None:
    """prog.debug beside it, prog stripped of its debug information and linked to it."""
    debug = prog.with_name(prog.name + ".debug")
    _run("objcopy", "--only-keep-debug", prog, debug)
    _run("strip", "--strip-debug", prog)
    _run("objcopy", f"--add-gnu-debuglink={debug}", prog)


def _build_id(path: Path) -> str:
    m = re.search(r"Build ID: ([0-9a-f]+)", _run("readelf", "-n", path))
    assert m is not None
    return m.group(1)


def _gdb(prog: Path, *cmds: str) -> str:
    argv = ["gdb", "-q", "-nx", "-batch", "-ex", "set debuginfod enabled off"]
    for c in cmds:
        argv += ["-ex", c]
    done = subprocess.run([*argv, "--args", str(prog), *(["1"] if "bt" in cmds else ["0"])],
                          capture_output=True, text=True, timeout=120, check=False,
                          cwd=prog.parent)
    return done.stdout


@pytest.fixture(scope="module")
def progs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{'orig', 'before', 'after'}: each in a folder with its prog.debug."""
    for tool in ("gcc", "objcopy", "strip", "gdb", "readelf"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    d = tmp_path_factory.mktemp("splitdebug")
    out = {}
    for name in ("orig", "before", "after", "before-keep"):
        (d / name).mkdir()
        _run("gcc", "-O2", "-g", "-o", d / name / "btc", SRC)
        out[name] = d / name / "btc"
    _split(out["orig"])
    for name in ("before", "before-keep"):
        _split(out[name])
        shutil.move(out[name], d / name / "in")
        keep = ["--keep-build-id"] if name == "before-keep" else []
        res = run_cli("rewrite", d / name / "in", "-o", out[name], "--calls", "move", *keep)
        assert res.rc == 0, res.err
        assert "debug-file-stale" in res.out + res.err, res.out + res.err
    res = run_cli("rewrite", out["after"], "-o", d / "after" / "rw", "--calls", "move")
    assert res.rc == 0 and "debug-file-stale" not in res.out + res.err, res.out + res.err
    shutil.move(d / "after" / "rw", out["after"])
    _split(out["after"])
    return out


def test_build_ids(progs: dict[str, Path]) -> None:
    """Split before: the output's build-id is not its debug file's (a lookup by build-id
    misses it) unless --keep-build-id; split after: they match."""
    for name in ("before", "before-keep", "after"):
        prog = progs[name]
        same = _build_id(prog) == _build_id(prog.with_name("btc.debug"))
        assert same == (name != "before"), name


def _breaks(prog: Path) -> list[str]:
    out = _gdb(prog, "break btc.c:20", "break btc.c:29", "run", "continue", "continue",
               "continue")
    # "Breakpoint 2 at 0x13c1: file btc.c, line 29." (set), "Breakpoint 2, loads (...)" (hit)
    return [re.sub(r" at 0x[0-9a-f]+: file .*, (line \d+)\.$", r" \1", ln).split(", ")[0]
            if ln.startswith("Breakpoint") else ln.strip() for ln in out.splitlines()
            if ln.startswith(("Breakpoint", "Program received", "[Inferior"))]


def test_split_before_gdb_breaks_inside_a_moved_window(progs: dict[str, Path]) -> None:
    """The debug file is found through .gnu_debuglink (the breakpoints are set by line), and
    its row inside the window makes the program stop with SIGILL."""
    want = _breaks(progs["orig"])
    assert not any("SIGILL" in w for w in want), want
    got = _breaks(progs["before"])
    assert got[:2] == want[:2]  # set by file and line: the debug file was read
    assert any("SIGILL" in g for g in got), got


def test_split_after_gdb_breaks_as_in_the_original(progs: dict[str, Path]) -> None:
    assert _breaks(progs["after"]) == _breaks(progs["orig"])


def _detour_frame(prog: Path) -> str:
    out = _gdb(prog, "run", "bt")
    frames = [ln for ln in out.splitlines() if re.match(r"#\d+ ", ln)]
    return next(ln for ln in frames if " framed" in ln)


def test_the_detour_s_frame_has_its_line_when_split_after(progs: dict[str, Path]) -> None:
    assert "btc.c:20" in _detour_frame(progs["orig"])
    assert "btc.c:20" in _detour_frame(progs["after"])
    before = _detour_frame(progs["before"])
    assert "framed.usdtpatch" in before and "btc.c:" not in before


def test_no_finding_without_a_debug_link(tmp_path: Path) -> None:
    """A file with its own DWARF, and one without any debug information or link, get no
    `debug-file-stale`."""
    for name, flags in (("g", ["-g"]), ("plain", [])):
        exe = tmp_path / name
        _run("gcc", "-O2", *flags, "-o", exe, SRC)
        if name == "g":
            _run("objcopy", f"--add-gnu-debuglink={exe}", exe)  # a link, and DWARF
        res = run_cli("rewrite", exe, "-o", tmp_path / f"{name}.rw", "--calls", "move")
        assert res.rc == 0 and "debug-file-stale" not in res.out + res.err, res.out
