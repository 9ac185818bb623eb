"""`rewrite --probe PATTERN` (issue 47, item 11): it was refused (argparse: unrecognized
arguments). Only the selected probes' sites are rewritten: every other site keeps its bytes
and its note, no window covers it, and `check --probe` (api.check(probes=...)) predicts the
same outcome for every site."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch import api
from usdtpatch.elf.image import parse_elf


def _site_bytes(path: Path, address: int, length: int = 1) -> bytes:
    return parse_elf(path.read_bytes()).read_vaddr(address, length)


@pytest.mark.parametrize(("name", "pattern"), [("demo", "parse"), ("demo", "demo:re*"),
                                               ("adjacent", "third"), ("args-O2", "a1")])
def test_only_the_selected_sites_are_rewritten(name: str, pattern: str, tmp_path: Path) -> None:
    src = fixture(name)
    out = tmp_path / name
    outcome = api.rewrite(src, out, form="nop5", probes=[pattern], verify=False)
    before = api.load(src)
    after = api.load(out)
    chosen = {p.index for p in before.probes
              if fnmatchcase(p.probe_id if ":" in pattern else p.name, pattern)}
    assert chosen
    for d in outcome.sites:
        if d.probe.index not in chosen:
            assert d.action.value == "skipped", d
            old = before.probes[d.probe.index]
            new = after.probes[d.probe.index]
            assert new.address == old.address  # its note as it was
            assert _site_bytes(out, old.address, max(1, old.site.length)) == \
                _site_bytes(src, old.address, max(1, old.site.length))
    # check with the same patterns predicts every site's decision
    report = api.check(src, form="nop5", probes=[pattern]).report
    for s, d in zip(sorted(report.sites, key=lambda s: s.probe.index),
                    sorted(outcome.sites, key=lambda d: d.probe.index), strict=True):
        if s.outcome in ("forward", "backward"):
            assert d.action.value in ("detour", "moved"), (s.probe.probe_id, s.outcome, d)
        elif s.outcome == "in-place":
            assert d.action.value == "in-place"
        elif s.outcome == "blocked":
            assert (d.action.value, d.code) == ("skipped", s.blocked)


def test_the_command_line_takes_probe_and_refuses_a_pattern_that_selects_nothing(
        tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = run_cli("rewrite", fixture("demo"), "-o", out, "--form", "nop5", "--probe", "idle")
    assert res.rc == 0, res.err
    assert "[probe-not-selected]" in res.out
    bad = run_cli("rewrite", fixture("demo"), "--dry-run", "--probe", "nosuch")
    assert bad.rc == 2 and "no probe matches nosuch" in bad.err
    assert bad.err.count("\n") == 1
    tree = run_cli("rewrite", "--tree", tmp_path, "--probe", "idle")
    assert tree.rc == 2 and "--probe" in tree.err
