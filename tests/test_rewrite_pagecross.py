"""A nop5 site that crosses a 4 KiB page is never optimized where it is; rewrite moves it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers import fixture, run_cli
from usdtpatch.analysis.check import check
from usdtpatch.analysis.probes import read_probes
from usdtpatch.elf.image import parse_elf
from usdtpatch.x86.nops import crosses_page


def test_a_page_crossing_nop5_is_moved_and_becomes_optimizable(tmp_path: Path) -> None:
    src = fixture("nop5-pagecross")
    before = {p.name: p for p in read_probes(parse_elf(src.read_bytes())).probes}
    assert crosses_page(before["site"].address, 5) and not crosses_page(before["other"].address, 5)
    out = tmp_path / "moved"
    res = run_cli("rewrite", src, "-o", out, "--json")
    assert res.rc == 0, res.err
    after = {p.name: p for p in read_probes(parse_elf(out.read_bytes())).probes}
    assert after["site"].address != before["site"].address
    assert not crosses_page(after["site"].address, 5)
    assert after["site"].code[:5] == bytes.fromhex("0f1f440000")
    assert after["other"].address == before["other"].address  # already fine: left alone
    report = check(read_probes(parse_elf(out.read_bytes())))
    assert [s.outcome for s in report.sites] == ["optimizable", "optimizable"]
    original = subprocess.run([str(src)], capture_output=True, text=True, check=False)
    moved = subprocess.run([str(out)], capture_output=True, text=True, check=False)
    assert (moved.returncode, moved.stdout) == (original.returncode, original.stdout)
