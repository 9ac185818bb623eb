"""Text relocations (issue 30, class 3): every relocation the loader applies is a way in or
a fixed place. A shared object linked `-z notext` whose `movabs $glob` (R_X86_64_64, its
place in .text) follows a probe: the loader patches the original place, so a detour that
copies it keeps the unrelocated value (before: the rewritten library's caller died with
SIGSEGV). Now no window holds such a place: the site gets a window beside it, or is refused
with `window-text-relocation` naming the relocation; either way the rewritten library
behaves as the original (gcc and clang, -O0 and -O2). check says what rewrite does.

And the ways-in scan reads every loader table: a pointer to the instruction after a probe,
in a table the loader fills through a packed relative relocation (`-z pack-relative-relocs`,
DT_RELR: the value is the word at the place), is a way in (before: missed, the window was
moved and a call through the pointer hit its int3)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, fixture, run_cli
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch import api
from usdtpatch.analysis.check import SiteCheck, check
from usdtpatch.api import load
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.model import (
    RELR,
    fixed_places,
    loader_relocations,
    loader_tables,
    text_relocations,
)

DATA = ROOT / "tests" / "data" / "textrel"
BUILDS = {f"{cc}-{o}": (cc, o) for cc in ("gcc", "clang") for o in ("O0", "O2")}

pytestmark = pytest.mark.needs_cc


def _run(program: Path) -> tuple[int, str]:
    done = subprocess.run([str(program), "20000"], capture_output=True, text=True,
                          timeout=60, check=False)
    return done.returncode, done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    out: dict[str, Path] = {}
    for name, (cc, opt) in BUILDS.items():
        if shutil.which(cc) is None:
            continue
        d = tmp_path_factory.mktemp(name)
        subprocess.run([cc, f"-{opt}", "-shared", "-fno-pic", "-Wl,-z,notext",
                        str(DATA / "textrel.c"), "-o", str(d / "libtextrel.so")], check=True)
        subprocess.run(["gcc", "-O2", str(DATA / "main.c"), "-L", str(d), "-ltextrel",
                        "-Wl,-rpath,$ORIGIN", "-o", str(d / "textrel-main")], check=True)
        out[name] = d
    return out


def _places(lib: Path) -> list[int]:
    """The r_offset of every R_X86_64_64 readelf lists (an independent reader)."""
    text = subprocess.run(["readelf", "-rW", str(lib)], capture_output=True, text=True,
                          check=True).stdout
    return [int(line.split()[0], 16) for line in text.splitlines()
            if "R_X86_64_64" in line]


def _site(lib: Path, name: str) -> SiteCheck:
    return next(s for s in api.check(lib).report.sites if s.probe.name == name)


@pytest.mark.parametrize("build", BUILDS)
def test_no_window_holds_a_text_relocation(built: dict[str, Path], build: str) -> None:
    if build not in built:
        pytest.skip(f"needs {BUILDS[build][0]}")
    lib = built[build] / "libtextrel.so"
    places = _places(lib)
    image = parse_elf(lib.read_bytes())
    assert text_relocations(image)  # DT_TEXTREL, DF_TEXTREL
    assert [(a, b) for a, b, _w in fixed_places(image)] == [(p, p + 8) for p in places]
    s = _site(lib, "get")
    w = s.window.window if s.window is not None else None
    if w is None:
        assert s.blocked == "window-text-relocation"
        f = next(f for f in s.findings if f.code == "window-text-relocation")
        assert f"R_X86_64_64 at {places[0]:#x}" in f.message
    else:
        assert not any(w.start < p + 8 and p < w.end for p in places), (w.start, w.end)
    assert _mismatches(lib) == []


@pytest.mark.parametrize("build", BUILDS)
def test_rewritten_library_runs_as_the_original(built: dict[str, Path], build: str,
                                                tmp_path: Path) -> None:
    if build not in built:
        pytest.skip(f"needs {BUILDS[build][0]}")
    d = built[build]
    shutil.copy2(d / "textrel-main", tmp_path / "textrel-main")
    res = run_cli("rewrite", d / "libtextrel.so", "-o", tmp_path / "libtextrel.so")
    assert res.rc == 0, res.err
    assert (tmp_path / "libtextrel.so").read_bytes() != (d / "libtextrel.so").read_bytes()
    want = _run(d / "textrel-main")
    assert want[0] == 0
    assert _run(tmp_path / "textrel-main") == want


def test_refusal_is_named_in_rewrite_report(built: dict[str, Path], tmp_path: Path) -> None:
    """gcc -O2 puts the probe first in `get`: every window holds the movabs; check and
    rewrite both refuse the site by name, and the other site is rewritten."""
    if "gcc-O2" not in built:
        pytest.skip("needs gcc")
    lib = built["gcc-O2"] / "libtextrel.so"
    s = _site(lib, "get")
    assert s.outcome == "blocked" and s.blocked == "window-text-relocation"
    plan = api.rewrite_plan(lib, fork_guard="never")
    by_name = {d.probe.name: d for d in plan.sites}
    assert by_name["get"].code == "window-text-relocation"
    assert re.search(r"R_X86_64_64 at 0x[0-9a-f]+ \(\.rela\.dyn\)", by_name["get"].reason)
    assert by_name["plain"].action.value == "detour"


# --- DT_RELR: a packed relative relocation is a way in ---------------------------------------

RELR_SOURCE = ROOT / "tests" / "data" / "textrel" / "relr.c"


@pytest.fixture(scope="module")
def relr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("relr")
    prog = d / "relr"
    done = subprocess.run(["gcc", "-O2", "-fPIE", "-pie", "-Wl,-z,pack-relative-relocs",
                           "-I", str(ROOT / "fixtures" / "src"), str(RELR_SOURCE), "-o",
                           str(prog)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"the linker does not pack relative relocations: {done.stderr[-300:]}")
    return prog


def test_relr_pointer_is_a_way_in(relr: Path) -> None:
    image = parse_elf(relr.read_bytes())
    assert any(t.kind == "relr" for t in loader_tables(image))
    assert not text_relocations(image) and not fixed_places(image)
    text = subprocess.run(["readelf", "-rW", str(relr)], capture_output=True, text=True,
                          check=True).stdout.split(".relr.dyn")[1]
    listed = sorted(int(x, 16) for x in re.findall(r"^([0-9a-f]{16})$", text, re.M))
    rel = loader_relocations(image)
    assert sorted(p for p, t in zip(rel.places, rel.types, strict=True) if t == RELR) == listed
    s = _site(relr, "after")
    after = s.probe.address + 1
    w = s.window.window if s.window is not None else None
    # the instruction after the probe is reached through the RELR-filled pointer: no
    # window holds it strictly inside
    assert w is None or not w.start < after < w.end, (w.start, w.end) if w else None
    if w is None:  # refused: the reason names the way in, a place readelf lists as RELR's
        text = subprocess.run(["readelf", "-rW", str(relr)], capture_output=True, text=True,
                              check=True).stdout.split(".relr.dyn")[1]
        relr_places = {int(x, 16) for x in re.findall(r"^([0-9a-f]{16})$", text, re.M)}
        reason = s.window.reason if s.window is not None else ""
        named = {int(x, 16) for x in re.findall(r"relocation from (0x[0-9a-f]+)", reason)}
        assert named and named <= relr_places, (reason, relr_places)
    assert _mismatches(relr) == []


def test_relr_program_rewritten_runs_as_the_original(relr: Path, tmp_path: Path) -> None:
    out = tmp_path / "relr"
    res = run_cli("rewrite", relr, "-o", out)
    assert res.rc == 0, res.err
    assert out.read_bytes() != relr.read_bytes()
    want = _run(relr)
    assert want[0] == 0
    assert _run(out) == want


@pytest.mark.parametrize("how", ["rel32", "rel8-stub"])
def test_branch_holding_a_fixed_place_is_not_retargeted(how: str) -> None:
    """A branch into a window is retargeted by patching its displacement (rel32) or aiming
    it at a stub (rel8); where the loader writes those bytes (a text relocation's place)
    the patch would be overwritten: that way in cannot be aimed at the detour. (The fixture
    has no text relocation: the file's fixed places are given one at the branch's
    displacement, as the model would read it.)"""
    path = fixture("retarget-pie")
    before = next(s for s in check(load(path)).sites if s.probe.name == "relbr")
    w = before.window.window if before.window is not None else None
    assert w is not None
    branch = next(r.source for r in w.retargets if r.how == how)
    ps = load(path)
    width = 4 if how == "rel32" else 1
    ps.image.derived["model_fixed"] = [(branch + 1, branch + 1 + width,
                                        f"R_X86_64_PC32 at {branch + 1:#x} (test)")]
    after = next(s for s in check(ps).sites if s.probe.name == "relbr")
    aw = after.window.window if after.window is not None else None
    assert aw is None or branch not in [r.source for r in aw.retargets]
    if aw is None:
        assert after.window is not None
        assert f"the branch at {branch:#x} holds the place of R_X86_64_PC32" in \
            after.window.reason
