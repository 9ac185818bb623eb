"""Short windows (issue 36, `window-function-end`), on tests/data/sites/lastfn.c: a probe-only
function `nop; ret` last in `.text`, `.fini` 2 bytes after it, so no window holds the 5 bytes
of a `jmp rel32`. With gcc and clang -O2 and -Os the window [nop, ret] becomes `jmp rel8` to
a `jmp rel32` stub in the NOPs before the function (after crtstuff's functions, which have no
FDE: `tails_before`, the only place with -Os, where the function is packed right after
frame_dummy; or after the previous function's FDE: `padding_before`), which jumps to the
detour (three jumps per pass); the emulator runs it (no proof). tests/data/sites/stubs.c's
`packed`, between two functions with no NOP within 128 bytes, stays `window-function-end`,
and the finding says that no stub place is in reach.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import ROOT, bpftrace_lines, build_programs
from tests.test_analysis_waysin import _site
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import CheckReport, check, same_row
from usdtpatch.analysis.windows import find_window
from usdtpatch.api import load, rewrite_plan
from usdtpatch.rewriter.plan import Action

SOURCE = ROOT / "tests" / "data" / "sites" / "lastfn.c"
BUILDS = {"gcc-O2": ("gcc", ["-O2", "-g"]), "clang-O2": ("clang", ["-O2", "-g"]),
          "gcc-Os": ("gcc", ["-Os", "-g"]), "clang-Os": ("clang", ["-Os", "-g"])}
CONVERTED = tuple(BUILDS)
STUBS = ROOT / "tests" / "data" / "sites" / "stubs.c"

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_programs(tmp_path_factory.mktemp("lastfn"), SOURCE.read_text(), BUILDS,
                          name="lastfn.c")


@pytest.fixture(scope="module")
def reports(programs: dict[str, Path]) -> dict[str, CheckReport]:
    return {name: check(load(path)) for name, path in programs.items()}


def _program(programs: dict[str, Path], build: str) -> Path:
    if build not in programs:
        pytest.skip(f"no {build}")
    return programs[build]


@pytest.mark.parametrize("build", CONVERTED)
def test_a_probe_only_function_at_the_end_gets_a_short_window(
        programs: dict[str, Path], reports: dict[str, CheckReport], build: str) -> None:
    _program(programs, build)
    s = _site(reports[build], "last")
    assert s.outcome == "forward", s.window
    assert s.window is not None and s.window.window is not None
    w = s.window.window
    assert w.start == s.probe.address and w.size == 2 and w.extra_jumps == 3
    assert w.entry_stub is not None
    assert w.start - 126 <= w.entry_stub <= w.start - 5  # before the function, in reach


def test_a_packed_function_stays_refused_and_says_why(tmp_path: Path) -> None:
    flags = ["-O2", "-g0", "-I", str(ROOT / "fixtures" / "src"), "-I", str(STUBS.parent.parent)]
    path = build_programs(tmp_path, STUBS.read_text(), {"gcc": ("gcc", flags)},
                          name="stubs.c")["gcc"]
    s = _site(check(load(path)), "packed")
    assert s.blocked == "window-function-end"
    assert s.window is not None
    assert "holds a jmp rel8 but no unused padding or NOP run in its reach" in s.window.reason


@pytest.mark.parametrize("build", CONVERTED)
def test_no_stub_place_in_reach_refuses(programs: dict[str, Path],
                                        reports: dict[str, CheckReport], build: str) -> None:
    """The same function without its padding (as -Os has it), or without the last round
    (same_row None: a file with .debug_frame), gets no short window."""
    _program(programs, build)
    rep = reports[build]
    assert rep.context is not None
    s = _site(rep, "last")
    assert s.function is not None
    fc = rep.context.function(s.function)
    assert fc.padding_before or fc.tails_before
    code = rep.context.image.read_vaddr(fc.bounds.start, fc.bounds.size + fc.padding_after)
    test = same_row(rep.context)
    assert find_window(fc, s.probe.address, code, None, test).window is not None
    bare = replace(fc, padding_before=0, tails_before=(), padding_after=0)
    got = find_window(bare, s.probe.address, code, None, test)
    assert got.window is None and got.code == "window-function-end"
    got = find_window(fc, s.probe.address, code, None, None)
    assert got.window is None and got.code == "window-function-end"


@pytest.mark.parametrize("build", BUILDS)
def test_check_predicts_rewrite(programs: dict[str, Path], build: str) -> None:
    assert _mismatches(_program(programs, build)) == []


def _run(path: Path) -> str:
    done = subprocess.run([str(path), "5"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0, (path, done.returncode, done.stderr)
    return done.stdout


@pytest.fixture(scope="module")
def rewritten(programs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    from tests.helpers import run_cli

    out: dict[str, Path] = {}
    folder = tmp_path_factory.mktemp("lastfn-rw")
    for name in CONVERTED:
        if name in programs:
            (folder / name).mkdir()
            res = run_cli("rewrite", programs[name], "-o", folder / name / "lastfn")
            assert res.rc == 0, res.err
            out[name] = folder / name / "lastfn"
    return out


@pytest.mark.parametrize("build", CONVERTED)
def test_rewritten_program_runs_as_the_original(programs: dict[str, Path],
                                                rewritten: dict[str, Path],
                                                build: str) -> None:
    path = _program(programs, build)
    assert _run(rewritten[build]) == _run(path)
    site = next(d for d in rewrite_plan(path, jobs=1).sites if d.probe.name == "last")
    assert site.action is Action.DETOUR and site.verification == "emulated"
    assert "entered by a jmp rel8 through the stub" in site.reason
    assert bytes(load(rewritten[build]).image.read_vaddr(site.probe.address, 1)) == b"\xeb"


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize("build", CONVERTED)
def test_rewritten_program_traced_as_the_original(programs: dict[str, Path],
                                                  rewritten: dict[str, Path],
                                                  build: str) -> None:
    path = _program(programs, build)
    want = bpftrace_lines(path)
    assert len(want) == 3
    assert bpftrace_lines(rewritten[build]) == want
