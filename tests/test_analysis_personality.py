"""An LSDA is read only under a personality known to use GCC's format (issue 46, class 4), on
tests/data/foreignpers.c: `foreign`'s CIE names my_personality, whose LSDA is four bytes that
read as an empty GCC table followed by its own landing pad offset; the exception raise_it
raises lands right after the probe.

Before, every LSDA was read as GCC's whatever routine the CIE named: that one named no landing
pad, the window moved the pad into a detour, and the landing went into the middle of the new
jump (SIGSEGV). Now the routine is named (through its pointer, the slot an indirect pointer
reads and that slot's relocation, to a symbol) and checked against the one list
(usdtpatch.elf.ehframe.GCC_LSDA_PERSONALITIES); the site is left alone with
window-foreign-personality naming my_personality, check predicts rewrite, and the rewritten
program lands its exceptions as the original. The C++ and plain C fixtures keep their
windows (their routine is __gxx_personality_v0, or none).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import ROOT, build_variant, fixture
from tests.test_analysis_waysin import _site, rewritten_runs_alike
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.api import load
from usdtpatch.elf.cfi import load_cfi
from usdtpatch.elf.ehframe import GCC_LSDA_PERSONALITIES, foreign_personality
from usdtpatch.elf.image import parse_elf

SOURCE = ROOT / "tests" / "data" / "foreignpers.c"
BUILDS = {"gcc-O2-pie": ("gcc", ["-O2", "-fPIE", "-pie"]),
          "gcc-O0-pie": ("gcc", ["-O0", "-fPIE", "-pie"]),
          "clang-O0-nopie": ("clang", ["-O0", "-fno-pie", "-no-pie"]),
          "clang-O2-pie": ("clang", ["-O2", "-fPIE", "-pie"]),
          "gcc-O2-static": ("gcc", ["-O2", "-static"])}


def _program(folder: Path, variant: str) -> Path:
    cc, flags = BUILDS[variant]
    return build_variant(SOURCE, folder / variant, cc, flags)


@pytest.mark.needs_cc
@pytest.mark.parametrize("variant", BUILDS)
def test_a_foreign_personality_is_refused_by_name(variant: str, tmp_path: Path) -> None:
    path = _program(tmp_path, variant)
    rep = check(load(path))
    s = _site(rep, "foreign")
    assert s.blocked == "window-foreign-personality", (s.outcome, s.blocked)
    assert s.window is not None and "personality routine my_personality" in s.window.reason
    assert [f.code for f in s.findings] == ["window-foreign-personality"]
    assert _site(rep, "plain").outcome == "forward"
    assert _mismatches(path) == []
    rewritten_runs_alike(path, tmp_path / "out")


@pytest.mark.parametrize("name", ["cxx-throw", "cxx-callwin"])
def test_gcc_personalities_are_read(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C++ fixtures' routine is named (__gxx_personality_v0 through its DW.ref slot) and
    is one of the list: none of their CIEs is foreign; without the list, one is."""
    image = parse_elf(fixture(name).read_bytes())
    cfi = load_cfi(image)
    cies = {cfi.fde_at(i).cie for i in range(len(cfi.fde_addresses))}
    assert all(foreign_personality(image, c) is None for c in cies)
    assert "__gxx_personality_v0" in GCC_LSDA_PERSONALITIES
    named = [c for c in cies if c.personality_at is not None]
    assert named, "a fixture with a personality routine"
    monkeypatch.setattr("usdtpatch.elf.ehframe.GCC_LSDA_PERSONALITIES", frozenset())
    again = parse_elf(fixture(name).read_bytes())
    got = [foreign_personality(again, c) for c in named]
    assert all(g is not None and "__gxx_personality_v0" in g for g in got), got
