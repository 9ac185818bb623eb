"""Ways into a probe's window from the whole file (issue 19, item 1), on tests/data/waysin.c
built four ways (-O0 and -O2, PIE and not):

- farjmp: the instruction after the probe is the target of a `jmp rel32` from a function
  4 KiB away; farcall: of a `call rel32` from another section. Both are aimed at the detour.
- shortjmp: of a `jmp rel8` from the next function: it cannot be aimed at the detour, so no
  window holds it, and the finding names the jump's address.
- datatab: of a code pointer in `.data.rel.ro` (an R_X86_64_RELATIVE relocation in a PIE, an
  absolute word otherwise): the finding names the word's address.
- cgoto: a computed goto whose second label follows the probe.

Every window's interior is checked against every way in the function analysis knows (the
soundness invariant), and every rewritten program runs to the original's output, untraced and
(live) with every probe traced by bpftrace. Before the file-wide index, every rewritten
program died with SIGSEGV (farjmp's jump landed on the int3 fill).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.helpers import ROOT, build_programs, run_cli
from usdtpatch.analysis.check import CheckReport, SiteCheck, check
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "waysin.c"
VARIANTS = {"O0-pie": ["-O0", "-fPIE", "-pie"], "O2-pie": ["-O2", "-fPIE", "-pie"],
            "O0-nopie": ["-O0", "-fno-pie", "-no-pie"],
            "O2-nopie": ["-O2", "-fno-pie", "-no-pie"]}

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


def build_variants(folder: Path, source: Path, variants: Mapping[str, list[str]]
                   ) -> dict[str, Path]:
    """`source` (of tests/data) built by gcc once per variant: {variant: its flags} ->
    {variant: the program}; with -g0 and the headers of fixtures/src and tests/data. The
    module fixture of each test_analysis_waysin* module."""
    include = ["-g0", "-I", str(ROOT / "fixtures" / "src"), "-I", str(source.parent)]
    return build_programs(folder, source.read_text(),
                          {name: ("gcc", [*flags, *include]) for name, flags in variants.items()},
                          name=source.name)


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_variants(tmp_path_factory.mktemp("waysin"), SOURCE, VARIANTS)


def _symbol(path: Path, name: str) -> tuple[int, int]:
    """[start, end) of a symbol, from binutils' nm (an independent reader)."""
    text = subprocess.run(["nm", "-S", str(path)], capture_output=True, text=True,
                          check=True).stdout
    for line in text.splitlines():
        f = line.split()
        if f[-1] == name:
            size = int(f[1], 16) if len(f) == 4 else 8
            return int(f[0], 16), int(f[0], 16) + size
    raise AssertionError(f"no symbol {name}")


def _site(rep: CheckReport, name: str) -> SiteCheck:
    return next(s for s in rep.sites if s.probe.name == name)


def _sources(reason: str) -> list[int]:
    return [int(m, 16) for m in re.findall(r"from (0x[0-9a-f]+)", reason)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_ways_in_from_elsewhere(programs: dict[str, Path], variant: str) -> None:
    path = programs[variant]
    rep = check(load(path))
    for name, other in (("farjmp", "farjmp_other"), ("farcall", "farcall_other")):
        s = _site(rep, name)
        assert s.window is not None and s.window.window is not None, s.window
        lo, hi = _symbol(path, other)
        srcs = [r.source for r in s.window.window.retargets]
        assert any(lo <= a < hi for a in srcs), (name, [hex(a) for a in srcs])
    s = _site(rep, "shortjmp")
    assert s.blocked == "window-branch-target"
    lo, hi = _symbol(path, "shortjmp_other")
    assert s.window is not None
    assert any(lo <= a < hi for a in _sources(s.window.reason)), s.window.reason
    assert "8-bit displacement" in s.window.reason
    s = _site(rep, "datatab")
    assert s.blocked == "window-branch-target"
    assert s.window is not None
    place, _end = _symbol(path, "datatab_entries")
    assert place in _sources(s.window.reason), s.window.reason


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_window_holds_a_way_in_it_does_not_retarget(programs: dict[str, Path],
                                                       variant: str) -> None:
    """The invariant: every target strictly inside a chosen window is reached only from
    inside it or through a way in the window retargets."""
    rep = check(load(programs[variant]))
    assert rep.context is not None
    for s in rep.sites:
        if s.window is None or s.window.window is None or s.function is None:
            continue
        w = s.window.window
        fc = rep.context.function(s.function)
        retargeted = {(r.target, r.source) for r in w.retargets}
        for addr in fc.targets_between(w.start, w.end):
            for src in fc.incoming.get(addr, ()):
                inside = src.source is not None and w.start <= src.source < w.end
                table = src.kind == "jump-table" and any(r.target == addr for r in w.retargets)
                assert inside or table or (addr, src.source) in retargeted, \
                    (s.probe.name, hex(addr), src)


def _run(path: Path) -> str:
    done = subprocess.run([str(path), "3"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0, (path, done.returncode, done.stderr)
    return done.stdout


def rewritten_runs_alike(program: Path, out: Path) -> None:
    """`program` rewritten to `out` (some site rewritten: the file changes) prints what the
    original prints (each test_analysis_waysin* module's run test)."""
    res = run_cli("rewrite", program, "-o", out)
    assert res.rc == 0, res.err
    assert out.read_bytes() != program.read_bytes()
    assert _run(out) == _run(program)


def rewritten_traced_alike(program: Path, out: Path) -> None:
    """`program` and its rewrite, each run under bpftrace, print the same and hit as often."""
    assert run_cli("rewrite", program, "-o", out).rc == 0
    want, want_hits = _traced(program)
    got, hits = _traced(out)
    assert want_hits > 0
    assert (got, hits) == (want, want_hits)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rewritten_programs_run_as_the_original(programs: dict[str, Path], variant: str,
                                                tmp_path: Path) -> None:
    rewritten_runs_alike(programs[variant], tmp_path / "out")


def _traced(path: Path) -> tuple[str, int]:
    """The program's output and the number of probe hits while bpftrace traces every probe."""
    script = f"usdt:{path}:waysin:* {{ @n = count(); }}"
    done = subprocess.run(["bpftrace", "-e", script, "-c", f"{path} 3"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    m = re.search(r"@n: (\d+)", done.stdout)
    hits = int(m.group(1)) if m else 0
    lines = [ln for ln in done.stdout.splitlines()
             if re.fullmatch(r"[-\d ]+", ln.strip() or "x")]
    return "\n".join(lines), hits


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_rewritten_programs_traced(programs: dict[str, Path], variant: str,
                                   tmp_path: Path) -> None:
    rewritten_traced_alike(programs[variant], tmp_path / "out")
