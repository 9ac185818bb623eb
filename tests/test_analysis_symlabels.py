"""Symbols of any type are ways in (issue 46, class 2), on tests/data/symlabel.c: each probed
function holds, right after its probe's `nop`, a symbol that is no function symbol (an
exported NOTYPE entry, an exported OBJECT, a weak NOTYPE, a local NOTYPE in `.symtab` only).

Before, only STT_FUNC and STT_GNU_IFUNC symbols were ways in: the shared library was rewritten
with a detour over each label, and symlabel-main.c, calling the exported labels from another
object through the PLT, landed in the middle of the new jump (wrong results, or SIGSEGV); gdb's
`break local_entry` in the rewritten program stopped 0 times. Now every window of those probes
holds a symbol strictly inside, the site is left alone with `window-branch-target` naming the
symbol (its type, binding and table), check predicts rewrite, and the rewritten library and
programs run as the originals (`plain`, with no label, is still given its detour).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli
from tests.test_analysis_waysin import _site
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "symlabel.c"
MAIN = ROOT / "tests" / "data" / "symlabel-main.c"
INCLUDE = ["-g0", "-I", str(ROOT / "fixtures" / "src")]
LIBS = {"gcc-O0": ("gcc", ["-O0"]), "gcc-O2": ("gcc", ["-O2"]), "clang-O2": ("clang", ["-O2"])}
PROGRAMS = {"gcc-O2-pie": ("gcc", ["-O2", "-fPIE", "-pie"]),
            "gcc-O0-nopie": ("gcc", ["-O0", "-fno-pie", "-no-pie"]),
            "clang-O2-pie": ("clang", ["-O2", "-fPIE", "-pie"]),
            "gcc-O2-static": ("gcc", ["-O2", "-static"])}
# probe -> (its label, what the finding says of it)
LABELS = {"notype": ("notype_entry", "NOTYPE GLOBAL"),
          "object": ("object_entry", "OBJECT GLOBAL"),
          "weak": ("weak_entry", "NOTYPE WEAK"),
          "local": ("local_entry", "NOTYPE LOCAL in .symtab")}

pytestmark = [pytest.mark.needs_cc]


def _cc(cc: str, *argv: str | Path) -> None:
    if shutil.which(cc) is None:
        pytest.skip(f"needs {cc}")
    done = subprocess.run([cc, *map(str, argv)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("symlabel")


def _library(folder: Path, variant: str) -> tuple[Path, Path]:
    """(libsymlabel.so, the program linked against it) of one build of LIBS, in its folder."""
    cc, flags = LIBS[variant]
    where = folder / variant
    lib, exe = where / "libsymlabel.so", where / "main"
    if not exe.exists():
        where.mkdir(exist_ok=True)
        _cc(cc, *flags, *INCLUDE, "-fPIC", "-shared", "-DLIB", SOURCE, "-o", lib)
        _cc(cc, *flags, MAIN, "-L", where, "-lsymlabel", "-Wl,-rpath,$ORIGIN", "-o", exe)
    return lib, exe


def _program(folder: Path, variant: str) -> Path:
    cc, flags = PROGRAMS[variant]
    exe = folder / variant
    if not exe.exists():
        _cc(cc, *flags, *INCLUDE, SOURCE, "-o", exe)
    return exe


def _run(exe: Path) -> str:
    done = subprocess.run([str(exe), "4"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0, (exe, done.returncode, done.stderr)
    return done.stdout


def _assert_labels_named(path: Path) -> None:
    rep = check(load(path))
    for name, (label, said) in LABELS.items():
        s = _site(rep, name)
        assert s.blocked == "window-branch-target", (name, s.outcome)
        assert s.window is not None
        why = s.window.reason
        assert re.search(rf"it is a symbol: {label} \({said}", why), (name, why)
    assert _site(rep, "plain").outcome == "forward"


@pytest.mark.parametrize("variant", LIBS)
def test_labels_in_a_library_are_ways_in(built: Path, variant: str, tmp_path: Path) -> None:
    lib, exe = _library(built, variant)
    _assert_labels_named(lib)
    assert _mismatches(lib) == []
    want = _run(exe)
    res = run_cli("rewrite", lib, "-o", tmp_path / "libsymlabel.so")
    assert res.rc == 0, res.err
    assert (tmp_path / "libsymlabel.so").read_bytes() != lib.read_bytes()
    shutil.copy(exe, tmp_path / "main")
    # the program calls the labels from another object: through the rewritten library
    assert _run(tmp_path / "main") == want


@pytest.mark.parametrize("variant", PROGRAMS)
def test_labels_in_a_program_are_ways_in(built: Path, variant: str, tmp_path: Path) -> None:
    exe = _program(built, variant)
    _assert_labels_named(exe)
    assert _mismatches(exe) == []
    out = tmp_path / "out"
    res = run_cli("rewrite", exe, "-o", out)
    assert res.rc == 0, res.err
    assert out.read_bytes() != exe.read_bytes()
    assert _run(out) == _run(exe)


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
def test_gdb_stops_at_a_local_label_of_the_rewritten_program(built: Path,
                                                               tmp_path: Path) -> None:
    """`break local_entry` (a local NOTYPE symbol of .symtab) stops once per call in the
    rewritten program, as in the original (before, 0 times: the label's bytes were moved)."""
    exe = _program(built, "gcc-O2-static")
    out = tmp_path / "out"
    assert run_cli("rewrite", exe, "-o", out).rc == 0
    hits = []
    for path in (exe, out):
        done = subprocess.run(["gdb", "-nx", "-batch", "-ex", "break local_entry",
                               "-ex", "ignore 1 1000", "-ex", "run 4 > /dev/null",
                               "-ex", "info breakpoints", str(path)],
                              capture_output=True, text=True, timeout=120, check=False)
        m = re.search(r"breakpoint already hit (\d+) time", done.stdout)
        hits.append(int(m.group(1)) if m else 0)
    assert hits == [4, 4]
