"""More ways into a probe's window from outside its function (issue 19, item 1), on
tests/data/waysin2.c built four ways (-O0 and -O2, PIE and not):

- reltab: the instruction after the probe is an entry of another function's 4-byte relative
  jump table in .rodata (the table addressed by a rip-relative lea);
- lpad: it is a landing pad that another function's LSDA names;
- immed, pushed (fixed-address builds): its address is a `mov $imm32` / `push imm32` of
  another function;
- unaligned: its address is an 8-byte word at an odd address of .data (a relocation in a
  PIE, the absolute word otherwise);
- plain: no way in from elsewhere (rewritten: the detour is used).

None of these ways in can be aimed at a detour, so the site is skipped and the finding names
the way in's address. Before, every one of them was "rewritten" and the output died with
SIGSEGV (the table, the immediate, the push and the word jump into the moved window).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.test_analysis_waysin import (
    VARIANTS,
    _site,
    _sources,
    _symbol,
    build_variants,
    rewritten_runs_alike,
    rewritten_traced_alike,
)
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "waysin2.c"

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_variants(tmp_path_factory.mktemp("waysin2"), SOURCE, VARIANTS)


def _expected(variant: str) -> dict[str, tuple[str, bool]]:
    """probe -> (the symbol that holds its way in, whether the way in is that symbol's
    address itself, not somewhere inside it)."""
    out = {"reltab": ("reltab_table", True), "lpad": ("lpad_lsda", True),
           "unaligned": ("unaligned_word", True)}
    if "nopie" in variant:
        out |= {"immed": ("immed_other", False), "pushed": ("pushed_other", False)}
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_way_in_skips_its_site_and_is_named(programs: dict[str, Path],
                                                 variant: str) -> None:
    path = programs[variant]
    rep = check(load(path))
    for name, (holder, exact) in _expected(variant).items():
        s = _site(rep, name)
        assert s.blocked == "window-branch-target", (name, s.outcome)
        assert s.window is not None
        lo, hi = _symbol(path, holder)
        srcs = _sources(s.window.reason)
        assert (lo in srcs) if exact else any(lo <= a < hi for a in srcs), \
            (name, hex(lo), s.window.reason)
    plain = _site(rep, "plain")
    assert plain.outcome == "forward", plain.outcome


@pytest.mark.parametrize("variant", VARIANTS)
def test_check_predicts_rewrite(programs: dict[str, Path], variant: str) -> None:
    assert _mismatches(programs[variant]) == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_rewritten_programs_run_as_the_original(programs: dict[str, Path], variant: str,
                                                tmp_path: Path) -> None:
    rewritten_runs_alike(programs[variant], tmp_path / "out")


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_rewritten_programs_traced(programs: dict[str, Path], variant: str,
                                   tmp_path: Path) -> None:
    rewritten_traced_alike(programs[variant], tmp_path / "out")
