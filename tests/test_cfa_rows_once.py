"""Each FDE's rows are computed once (issue 46, class 8), on bench/bench_cfarows.py's
function: one FDE whose call-frame program has 2N rows, N probes in it.

Before, every site ran the FDE's whole program again (its window's unwind-row questions, the
re-laid window's rows, the detour's rows) and scanned it again for unknown instructions:
probes x rows, and doubling the function took 4x the time. Now `fde_rows` runs a program
once per FDE (its memo's misses: one per FDE asked, however many sites ask), the scan for
unknown instructions is memoized too, and a function's targets are sorted once. The bench
prints the medians and ratios; here the counts, and the rows against a direct replay.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.bench_cfarows import build
from usdtpatch import api
from usdtpatch.elf.cfi import load_cfi
from usdtpatch.elf.ehframe import fde_rows, rows_at
from usdtpatch.elf.image import parse_elf

pytestmark = pytest.mark.skipif(shutil.which("as") is None, reason="needs binutils")


@pytest.fixture(scope="module")
def long_fde(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("cfarows"), 60)


def test_each_fde_runs_its_program_once(long_fde: Path) -> None:
    fde_rows.cache_clear()
    rep = api.check(long_fde).report
    assert len(rep.sites) == 60
    api.rewrite_plan(long_fde, verify=False, fork_guard="never")
    info = fde_rows.cache_info()
    cfi = load_cfi(parse_elf(long_fde.read_bytes()))
    assert info.misses <= len(cfi.fde_addresses), info  # once per FDE, in check and rewrite
    assert info.hits >= 60, info  # every site asked


def test_the_table_answers_as_the_program(long_fde: Path) -> None:
    """The rows read from the table are those of the program's replay at each address: the
    CFA moves by 8 at each push and back at each pop."""
    image = parse_elf(long_fde.read_bytes())
    cfi = load_cfi(image)
    fde = next(cfi.fde_at(i) for i in range(len(cfi.fde_addresses))
               if cfi.fde_at(i).pc_end - cfi.fde_at(i).pc_begin > 100)
    rows = rows_at(fde, list(range(fde.pc_begin, fde.pc_end)))
    offsets = [rows[a].cfa.offset for a in range(fde.pc_begin, fde.pc_end)]
    # mov (3 bytes) at 8; then per segment: push (1) at 8, nop/add/pop (6) at 16; ret at 8
    assert offsets[:3] == [8, 8, 8]
    assert offsets[3:10] == [8, 16, 16, 16, 16, 16, 16]
    assert offsets[10:17] == offsets[3:10]
    assert offsets[-1] == 8
    assert sorted(set(offsets)) == [8, 16]
