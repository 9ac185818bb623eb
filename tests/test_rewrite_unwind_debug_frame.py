"""Backtraces through a detour of a function whose rows are in `.debug_frame` only (issue 33).

gcc -fno-asynchronous-unwind-tables -g puts the program's call frame rows in `.debug_frame`
(its `.eh_frame` has crt's only). The detours' rows were taken from `.eh_frame` alone: such a
detour had none, and gdb's backtrace of the rewritten program, not even stripped, went
through the stack's contents (a dozen bogus frames) where the original's was right. Now they
are taken from `.debug_frame` too (usdtpatch.elf.cfi.debug_frame_fde), and the input's
`.debug_frame` with the detours' FDEs is allocated in the new segment, so that strip keeps
it (the original bytes stay as `.debug_frame.orig`, which strip removes). A stripped
original has no rows for its functions at all; it is compared here as stripped with
`--keep-section=.debug_frame`, the rows the stripped rewritten file keeps.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli
from tests.test_rewrite_unwind_stripped import _eu_stack, _gdb
from usdtpatch.elf.cfi import debug_frame_fde
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.symbols import symbol_value

pytestmark = [pytest.mark.needs_cc, pytest.mark.slow]

SRC = ROOT / "tests" / "data" / "unwind" / "btc.c"
HOW = ["as-is", "strip", "strip-debug", "eu-strip"]


def _ship(how: str, src: Path, dst: Path, keep: bool) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    extra = ["--keep-section=.debug_frame"] if keep else []
    if how == "as-is":
        shutil.copy(src, dst)
        return
    argv = {"strip": ["strip", *extra], "strip-debug": ["strip", "--strip-debug", *extra],
            "eu-strip": ["eu-strip", *extra]}[how]
    done = subprocess.run([*argv, str(src), "-o", str(dst)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    dst.chmod(0o755)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    for tool in ("gcc", "strip", "eu-strip", "gdb", "eu-stack", "readelf"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    d = tmp_path_factory.mktemp("debugframe")
    exe = d / "btc"
    subprocess.run(["gcc", "-O2", "-g", "-fno-asynchronous-unwind-tables", "-o", str(exe),
                    str(SRC)], check=True, timeout=120)
    sections = subprocess.run(["readelf", "-S", "-W", str(exe)], capture_output=True,
                              text=True, check=True).stdout
    assert " .debug_frame " in sections
    rw = d / "btc.rw"
    res = run_cli("rewrite", exe, "-o", rw, "--calls", "move")
    assert res.rc == 0, res.err
    out = {}
    for how in HOW:
        for kind, src in (("orig", exe), ("rw", rw)):
            _ship(how, src, d / f"{how}-{kind}" / "prog", kind == "orig")
            out[(how, kind)] = d / f"{how}-{kind}"
    return out


@pytest.mark.parametrize("how", HOW)
def test_gdb_bt_through_a_detour_of_a_debug_frame_function(
        how: str, dirs: dict[tuple[str, str], Path]) -> None:
    """abort() in the callee of the moved call: the original's frames, and `main` reached."""
    want = _gdb(dirs[(how, "orig")], "c", "1")
    got = _gdb(dirs[(how, "rw")], "c", "1")
    assert got == want
    assert len(got) >= 8


@pytest.mark.parametrize("how", HOW)
def test_gdb_bt_from_a_fault_in_a_debug_frame_detour(
        how: str, dirs: dict[tuple[str, str], Path]) -> None:
    want = _gdb(dirs[(how, "orig")], "c", "3")
    got = _gdb(dirs[(how, "rw")], "c", "3")
    assert got == want


@pytest.mark.parametrize("how", HOW)
def test_eu_stack_through_a_detour_of_a_debug_frame_function(
        how: str, dirs: dict[tuple[str, str], Path]) -> None:
    want = _eu_stack(dirs[(how, "orig")])
    got = _eu_stack(dirs[(how, "rw")])
    assert got == want


def test_debug_frame_reader_reads_what_it_knows_and_no_other(
        dirs: dict[tuple[str, str], Path]) -> None:
    """The FDE of a window's function is found; a CIE of a version DWARF does not define
    (2) or an augmentation it does not know leaves the detour without rows."""
    data = (dirs[("as-is", "orig")] / "prog").read_bytes()
    image = parse_elf(data)
    framed = symbol_value(image, "framed")
    assert framed is not None
    fde = debug_frame_fde(image, framed + 1)
    assert fde is not None and fde.cie.understood and fde.pc_begin == framed
    assert debug_frame_fde(image, 0) is None
    sec = image.section(".debug_frame")
    assert sec is not None
    cie_at = sec.offset + fde.cie.address
    bad = bytearray(data)
    bad[cie_at + 8] = 2  # the CIE's version
    assert debug_frame_fde(parse_elf(bytes(bad)), framed + 1) is None
    bad = bytearray(data)
    bad[cie_at + 9] = ord("z")  # an augmentation string where there was none
    got = debug_frame_fde(parse_elf(bytes(bad)), framed + 1)
    assert got is None or not got.cie.understood
