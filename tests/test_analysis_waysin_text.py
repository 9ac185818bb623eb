"""Relative jump tables placed in code (issue 19, item 1), on tests/data/waysin3.c built -O2
PIE and non-PIE:

- intab: the instruction after the probe is an entry of intab_other's 4-byte relative table,
  which lies in .text inside intab_other (after its indirect jump, within its FDE);
- gaptab: the same with gaptab_other's table in .text between two functions (no FDE);
- codeword: a `mov $imm32` of codeword_other, 4 bytes after a label whose address a
  rip-relative lea takes, would read as such an entry; decoding codeword_other from its
  entry shows the bytes are an instruction, so it is no way in (rewritten, like plain).

Before, the file-wide index read relative tables only in non-executable sections: every site
was "rewritten" and "proved", and the output died with SIGSEGV (the table's jump landed in
the moved window).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.test_analysis_waysin import (
    _site,
    _sources,
    _symbol,
    build_variants,
    rewritten_runs_alike,
    rewritten_traced_alike,
)
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.analysis.waysin import REL_TABLE, scan_code_tables
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "waysin3.c"
VARIANTS = {"O2-pie": ["-O2", "-fPIE", "-pie"], "O2-nopie": ["-O2", "-fno-pie", "-no-pie"]}

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_variants(tmp_path_factory.mktemp("waysin3"), SOURCE, VARIANTS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_table_in_code_skips_its_site_and_is_named(programs: dict[str, Path],
                                                     variant: str) -> None:
    path = programs[variant]
    rep = check(load(path))
    for name, entry in (("intab", 4), ("gaptab", 0)):
        s = _site(rep, name)
        assert s.blocked == "window-branch-target", (name, s.outcome)
        assert s.window is not None
        table, _end = _symbol(path, f"{name}_table")
        assert table + entry in _sources(s.window.reason), (name, s.window.reason)
        assert "relative-table-entry" in s.window.reason
    for name in ("plain", "codeword"):
        assert _site(rep, name).outcome == "forward", name


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoding_tells_code_from_a_table(programs: dict[str, Path], variant: str) -> None:
    """The immediate of codeword_other's mov is code that decoding from its entry reaches; the
    entries of intab_other's table (after its jmp) and of gaptab's (in no function) are not."""
    path = programs[variant]
    rep = check(load(path))
    assert rep.context is not None
    ctx = rep.context
    other, _end = _symbol(path, "codeword_other")
    assert ctx.executable(other + 4)
    assert ctx.decoded_as_code(other + 4, 4)  # nopl (%rax) (3 bytes); mov $imm32, %ecx
    assert ctx.decoded_as_code(other, 4)
    for name in ("intab_table", "gaptab_table"):
        table, _end = _symbol(path, name)
        assert ctx.executable(table)
        assert not ctx.decoded_as_code(table, 4), name
        assert not ctx.decoded_as_code(table + 4, 4), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_code_table_scan_bounds(programs: dict[str, Path], variant: str) -> None:
    """The scan finds intab_table's second entry from the table's base, and not when that
    base is a function start, nor when another lea target between the base and the entry
    ends the table there."""
    path = programs[variant]
    rep = check(load(path))
    assert rep.context is not None
    image = rep.context.image
    after = _site(rep, "intab").probe.address + 1
    table, _end = _symbol(path, "intab_table")
    got = {(w.kind, w.source, w.base, w.target) for w in
           scan_code_tables(image, [table], [], {after})}
    assert (REL_TABLE, table + 4, table, after) in got
    assert all(w[2] == table and (w[1] - table) % 4 == 0 for w in got)
    assert scan_code_tables(image, [table], [table], {after}) == []
    assert all(w.source != table + 4 for w in
               scan_code_tables(image, [table, table + 2], [], {after}))
    assert all(w.source != table + 4 for w in
               scan_code_tables(image, [table], [], {after + 1}))


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
def test_rewritten_program_traced(programs: dict[str, Path], tmp_path: Path) -> None:
    rewritten_traced_alike(programs["O2-pie"], tmp_path / "out")
