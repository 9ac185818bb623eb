"""Stubs of 8-bit jumps inside the function (issue 36), on tests/data/sites/stubs.c built with
gcc and clang -O2 (PIE):

- fillerstub (python3.11d's gc__start): `nop; jmp back` out of line, the instruction after it
  the target of a `jle` rel8 with no alignment padding in reach: the window grows to 10 bytes
  and the `jmp rel32` stub to the detour's copy goes into its own int3 filler;
- deadstub (OpenJDK 25's NewWeakGlobalRef__return): the instruction after the probe is the
  target of a `jmp` rel8 followed by a 10-byte NOP no one runs: the stub goes there (the
  window stays 5 bytes), not into the NOP run that runs nor the one a jump lands on.

Before, both were `window-branch-target` ("no unused padding in its reach"). What must be
refused: a slot whose `.eh_frame` row differs from the target's (the stub runs in the
target's state), a NOP run that is run or that a jump names, and any slot in a file with
`.debug_frame` (same_row is None there).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, bpftrace_lines, build_programs, run_cli
from tests.test_analysis_waysin import _site, _symbol
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import CheckReport, check, same_row
from usdtpatch.analysis.windows import REL8_STUB, STUB_SIZE, find_window, unused_runs
from usdtpatch.api import load, rewrite_plan
from usdtpatch.verification.equivalence import verify_detour
from usdtpatch.x86.relocate import jmp_rel32

SOURCE = ROOT / "tests" / "data" / "sites" / "stubs.c"
FLAGS = ["-O2", "-g0", "-I", str(ROOT / "fixtures" / "src"), "-I", str(ROOT / "tests" / "data")]
BUILDS = {"gcc": ("gcc", FLAGS), "clang": ("clang", FLAGS)}

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_programs(tmp_path_factory.mktemp("stubs"), SOURCE.read_text(), BUILDS,
                          name="stubs.c")


@pytest.fixture(scope="module")
def reports(programs: dict[str, Path]) -> dict[str, CheckReport]:
    return {name: check(load(path)) for name, path in programs.items()}


def _program(programs: dict[str, Path], build: str) -> Path:
    if build not in programs:
        pytest.skip(f"no {build}")
    return programs[build]


@pytest.mark.parametrize("build", BUILDS)
def test_the_stub_lies_in_the_filler_or_an_unused_nop_run(
        programs: dict[str, Path], reports: dict[str, CheckReport], build: str) -> None:
    path = _program(programs, build)
    rep = reports[build]
    fs = _site(rep, "fillerstub")
    assert fs.outcome == "forward", fs.window
    assert fs.window is not None and fs.window.window is not None
    w = fs.window.window
    stubs = [r.stub for r in w.retargets if r.how == REL8_STUB]
    assert len(stubs) == 1 and stubs[0] is not None
    assert w.start + 5 <= stubs[0] <= w.end - STUB_SIZE, (hex(w.start), hex(stubs[0]))
    ds = _site(rep, "deadstub")
    assert ds.outcome == "forward", ds.window
    assert ds.window is not None and ds.window.window is not None
    w = ds.window.window
    dead = _mark(path, "deadstub_dead")
    assert w.size == 5
    assert [r.stub for r in w.retargets] == [dead]


@pytest.mark.parametrize("build", BUILDS)
def test_a_slot_with_another_row_or_a_run_nop_run_is_refused(
        programs: dict[str, Path], reports: dict[str, CheckReport], build: str) -> None:
    path = _program(programs, build)
    rep = reports[build]
    assert rep.context is not None
    ctx = rep.context
    for name in ("fillerstub", "deadstub"):
        s = _site(rep, name)
        assert s.function is not None
        fc = ctx.function(s.function)
        code = ctx.image.read_vaddr(fc.bounds.start, fc.bounds.size + fc.padding_after)
        # without the row test (a file with .debug_frame) there is no such round
        got = find_window(fc, s.probe.address, code, None, None)
        assert got.window is None and got.code == "window-branch-target", name
        # no slot has the target's row: refused, and the finding says what was looked for
        got = find_window(fc, s.probe.address, code, None, lambda _a, _b: False)
        assert got.window is None and got.code == "window-branch-target", name
        assert "where the unwind row is the target's" in got.reason
    # the NOP run that runs (fall-through) and the one a jump lands on are not unused
    fc = ctx.function(_site(rep, "deadstub").function)  # type: ignore[arg-type]
    code = ctx.image.read_vaddr(fc.bounds.start, fc.bounds.size)
    dead = _mark(path, "deadstub_dead")
    assert unused_runs(fc, code) == [(dead, dead + 10)]
    # the rows: a push changes the row, the pop brings it back; another FDE's is not the same
    test = same_row(ctx)
    assert test is not None
    start, _end = _symbol(path, "rows")
    pushed, _end = _symbol(path, "rows_pushed")
    popped, _end = _symbol(path, "rows_popped")
    assert test(popped, start) and test(start, start)
    assert not test(pushed, start) and not test(start, pushed)
    assert not test(start, dead)


def _mark(path: Path, name: str) -> int:
    """The address stubs.c's MARK(name) recorded in its unloaded section .test_marks (read by
    pyelftools; a symbol would name the NOP run, which would then not be unused)."""
    from elftools.elf.elffile import ELFFile

    with path.open("rb") as f:
        sec = ELFFile(f).get_section_by_name(".test_marks")
        assert sec is not None
        data = sec.data()
    at = 0
    while at < len(data):
        end = data.index(b"\0", at)
        if data[at:end].decode() == name:
            return int.from_bytes(data[end + 1:end + 9], "little")
        at = end + 9
    raise AssertionError(f"no mark {name}")


@pytest.mark.parametrize("build", BUILDS)
def test_check_predicts_rewrite(programs: dict[str, Path], build: str) -> None:
    assert _mismatches(_program(programs, build)) == []


@pytest.fixture(scope="module")
def rewritten(programs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    out: dict[str, Path] = {}
    folder = tmp_path_factory.mktemp("stubs-rw")
    for name, path in programs.items():
        (folder / name).mkdir()
        res = run_cli("rewrite", path, "-o", folder / name / path.name)
        assert res.rc == 0, res.err
        out[name] = folder / name / path.name
    return out


def _run(path: Path) -> str:
    done = subprocess.run([str(path), "4"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0, (path, done.returncode, done.stderr)
    return done.stdout


@pytest.mark.parametrize("build", BUILDS)
def test_rewritten_program_runs_as_the_original(programs: dict[str, Path],
                                                rewritten: dict[str, Path],
                                                reports: dict[str, CheckReport],
                                                build: str) -> None:
    path = _program(programs, build)
    out = rewritten[build]
    assert _run(out) == _run(path)
    # the stub is written into the window's filler: a jmp rel32, where the original had code
    w = _site(reports[build], "fillerstub").window
    assert w is not None and w.window is not None
    stub = w.window.retargets[0].stub
    assert stub is not None
    image = load(out).image
    assert bytes(image.read_vaddr(stub, 1)) == b"\xe9"
    assert bytes(image.read_vaddr(w.window.start, 1)) == b"\xe9"


@pytest.mark.parametrize("build", BUILDS)
def test_the_emulator_runs_the_stub_and_rejects_a_wrong_one(programs: dict[str, Path],
                                                            build: str) -> None:
    """The stub in the window's filler is run (the jump, then the stub, then the copy): aimed
    at the copy of its target the detour verifies; aimed at the copy of the probe instead
    (what a wrong stub would do), the emulator rejects it."""
    path = _program(programs, build)
    d = next(s for s in rewrite_plan(path, verify=False, jobs=1).sites
             if s.probe.name == "fillerstub")
    assert d.window is not None and d.detour is not None
    w, detour = d.window, d.detour
    copy = dict(detour.insn_map)
    r = w.retargets[0]
    assert r.stub is not None
    aim = bytes([(r.stub - (r.source + 2)) & 0xFF])  # the jle's rel8, at source + 1
    entries = ((r.target, copy[r.target]),)
    image = load(path).image
    for to, verdict in ((copy[r.target], True), (copy[w.probe_address], False)):
        patches = ((r.stub, jmp_rel32(r.stub, to)), (r.source + 1, aim))
        why = verify_detour(image, w, detour, (w.probe_address,), patches=patches,
                            entries=entries)
        assert (why is None) == verdict, why


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize("build", BUILDS)
def test_rewritten_program_traced_as_the_original(programs: dict[str, Path],
                                                  rewritten: dict[str, Path],
                                                  build: str) -> None:
    path = _program(programs, build)
    want = bpftrace_lines(path)
    assert len(want) > 5
    assert bpftrace_lines(rewritten[build]) == want
