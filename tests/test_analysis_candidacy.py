"""The kernel's verdict matrix per site form (docs/kernel.md), on the committed fixtures."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.helpers import NOP5_GEN, NOP10_GEN, fixture
from usdtpatch.analysis.candidacy import Outcome, site_candidacy, trampoline_reachable
from usdtpatch.analysis.check import BLOCKED, check
from usdtpatch.api import load
from usdtpatch.elf.image import PT_LOAD, parse_elf

OPT, AT_NEXT, INT3, NO, NA = (Outcome.OPTIMIZED, Outcome.OPTIMIZED_AT_NEXT, Outcome.INT3,
                              Outcome.UNPROBEABLE, Outcome.NOT_APPLICABLE)


@pytest.mark.parametrize(("name", "k618", "nop10", "code"), [
    ("nop5", OPT, INT3, None),
    ("nop5-alt", OPT, INT3, None),
    ("nop5-pageend", OPT, INT3, None),
    ("combo5", AT_NEXT, INT3, "site-combo5-pc1"),
    ("combo10", INT3, AT_NEXT, "site-not-nop5"),
    ("nop10", NO, OPT, "site-segment-prefix"),
    ("dsprefix", NO, NO, "site-segment-prefix"),
    ("hintnop", INT3, INT3, "site-hint-nop"),
    ("padded", INT3, INT3, "site-not-nop5"),
    ("pie", INT3, INT3, "site-not-nop5"),
    ("dtrace-G5", INT3, INT3, "site-not-nop5"),
    ("i386", INT3, INT3, "site-elf32"),
    ("aarch64", NA, NA, None),
    ("bigendian", NA, NA, None),
])
def test_matrix(name: str, k618: Outcome, nop10: Outcome, code: str | None) -> None:
    ps = load(str(fixture(name)))
    assert ps.probes
    for p in ps.probes:
        c = site_candidacy(p, ps.image)
        got = (c.verdict(NOP5_GEN).outcome, c.verdict(NOP10_GEN).outcome)
        assert got == (k618, nop10), p.probe_id
        assert c.verdict(NOP5_GEN).code == code
        assert c.verdict(NOP5_GEN).reason


def test_page_crossing_is_the_4091_rule() -> None:
    ps = load(str(fixture("nop5-pagecross")))
    by_offset = {p.address % 4096: site_candidacy(p, ps.image).verdict(NOP5_GEN) for p in ps.probes}
    crossing = [v for off, v in by_offset.items() if off > 4091]
    assert crossing and all(v.code == "site-crosses-page" and v.outcome is INT3
                            for v in crossing)
    ps = load(str(fixture("nop5-pageend")))
    assert any(p.address % 4096 == 4091 for p in ps.probes)
    assert all(site_candidacy(p, ps.image).verdict(NOP5_GEN).outcome is OPT for p in ps.probes)


def test_page_crossing_site_can_move_to_a_detour() -> None:
    r = check(load(str(fixture("nop5-pagecross"))))
    crossing = [s for s in r.sites if s.probe.address % 4096 > 4091]
    assert crossing
    for s in crossing:
        assert s.outcome == "forward"
        assert s.window is not None and s.window.window is not None
        assert s.window.window.size == 5  # just the nop5


def _with_huge_segment(src: Path, dst: Path) -> None:
    """Copy `src` with its last PT_LOAD's memsz grown to 3 GiB: no trampoline page in reach."""
    data = bytearray(src.read_bytes())
    img = parse_elf(bytes(data))
    seg = [s for s in img.segments if s.type == PT_LOAD][-1]
    phoff = img.phoff + seg.index * 56
    struct.pack_into("<Q", data, phoff + 40, 3 << 30)  # p_memsz
    dst.write_bytes(bytes(data))


def test_no_trampoline_reach(tmp_path: Path) -> None:
    big = tmp_path / "nop5-huge"
    _with_huge_segment(fixture("nop5"), big)
    ps = load(str(big))
    assert all(not trampoline_reachable(ps.image, p.address + 5) for p in ps.probes)
    r = check(ps)
    assert {s.outcome for s in r.sites} == {BLOCKED}
    assert {s.blocked for s in r.sites} == {"no-trampoline-reach"}
    assert "no-trampoline-reach" in {f.code for f in r.all_findings}
    # the unmodified file has its trampoline page
    ps = load(str(fixture("nop5")))
    assert all(trampoline_reachable(ps.image, p.address + 5) for p in ps.probes)


def test_nopie_trampoline_below_0x400000() -> None:
    ps = load(str(fixture("nopie")))
    assert all(trampoline_reachable(ps.image, p.address + 5) for p in ps.probes)
