"""analysis/index.py: the planner's indexes answer as the scans they replace."""

from __future__ import annotations

import gc
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.synthetic_asm import build
from usdtpatch import api
from usdtpatch.analysis import index
from usdtpatch.analysis.index import Claims, Recent, SitesByAddress
from usdtpatch.report.show import site_views

_range = st.tuples(st.integers(0, 400), st.integers(1, 70)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_range, max_size=40), st.lists(_range, min_size=1, max_size=20))
def test_claims_overlap_as_a_scan(claims: list[tuple[int, int]],
                                  asks: list[tuple[int, int]]) -> None:
    c = Claims()
    for r in claims:
        c.append(r)
    assert list(c) == claims  # the list is kept as appended
    for lo, hi in asks:
        assert c.overlaps(lo, hi) == any(s < hi and lo < e for s, e in claims), (lo, hi)


def test_claims_touching_ranges_do_not_overlap() -> None:
    c = Claims([(10, 20), (30, 31)])
    assert not c.overlaps(20, 30) and not c.overlaps(0, 10) and not c.overlaps(31, 99)
    assert c.overlaps(19, 21) and c.overlaps(30, 31) and c.overlaps(0, 100)


@dataclass(frozen=True)
class _P:
    address: int


@dataclass(frozen=True)
class _S:
    probe: _P
    n: int


@given(st.lists(st.integers(0, 200), max_size=60), st.integers(0, 200), st.integers(0, 80),
       st.integers(0, 60))
def test_sites_between_as_a_scan(addresses: list[int], lo: int, size: int, given_: int) -> None:
    """Given in address order (ties as given), the first `given_` sites answer as a scan of
    them where every site below the question's end is there, and refuse otherwise."""
    sites = sorted((_S(_P(a), i) for i, a in enumerate(addresses)), key=lambda s: s.probe.address)
    idx: SitesByAddress[_S] = SitesByAddress()
    for s in sites[:given_]:
        idx.add(s)
    idx.ended = given_ >= len(sites)  # every site given: each question is answered
    hi = lo + size
    complete = idx.ended or any(s.probe.address >= hi for s in sites[:given_])
    want = [s for s in sites[:given_] if lo <= s.probe.address < hi]
    if complete:
        assert idx.between(lo, hi) == want
    else:
        with pytest.raises(AssertionError, match="not all given yet"):
            idx.between(lo, hi)


def test_sites_given_out_of_address_order_are_refused() -> None:
    idx: SitesByAddress[_S] = SitesByAddress()
    idx.add(_S(_P(8), 0))
    idx.add(_S(_P(8), 1))  # one pc, two notes
    with pytest.raises(ValueError, match="given after"):
        idx.add(_S(_P(7), 2))


def test_recent_forgets_its_oldest_entries_past_its_limit() -> None:
    r: Recent[int, str] = Recent(3)
    for k in range(5):
        r[k] = str(k)
    assert dict(r) == {2: "2", 3: "3", 4: "4"}
    r[3] = "again"  # a key set again stays where it was
    assert list(r) == [2, 3, 4] and r[3] == "again"
    r[9] = "9"
    assert list(r) == [3, 4, 9]


# check of a file with more functions than a memo keeps: what it forgets is worked out again
# when asked, and nothing the analysis makes is left for the cycle collector (check, show
# and rewrite run with it paused: a cycle there keeps its objects until the process ends)


@pytest.fixture(scope="module")
def many_functions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("as") is None or shutil.which("ld") is None:
        pytest.skip("binutils' as and ld are needed")
    return build(tmp_path_factory.mktemp("scale"), index.RECENT + 44)


def test_check_keeps_only_the_latest_functions_and_show_is_as_with_all(
        many_functions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = api.check(many_functions, fork_guard="never").report
    ctx = rep.context
    assert ctx is not None and len(rep.sites) == index.RECENT + 44
    assert 0 < len(ctx._functions) <= index.RECENT and len(ctx._sweeps) <= index.RECENT
    first = [rep.sites[0], rep.sites[-1]]  # forgotten, and still known
    views = site_views(str(many_functions), rep, first)
    assert views[0]["rows"] and views[1]["rows"]
    monkeypatch.setattr(index, "RECENT", 10**9)
    whole = api.check(many_functions, fork_guard="never").report
    assert whole.context is not None and len(whole.context._functions) == len(whole.sites)
    assert site_views(str(many_functions), whole, [whole.sites[0], whole.sites[-1]]) == views
    assert [s.outcome for s in whole.sites] == [s.outcome for s in rep.sites]


def test_check_and_the_plan_leave_no_reference_cycle(many_functions: Path) -> None:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        api.check(many_functions, fork_guard="never")
        api.rewrite_plan(many_functions, verify=False, fork_guard="never", form="nop5")
        assert gc.collect() < 50  # no cycle per site (a frame cycle per run held them all)
    finally:
        if was:
            gc.enable()


def test_check_analyses_each_function_once_with_more_than_the_memo_keeps(
        many_functions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check walks the sites in address order and decides each right after its own check
    (analysis/check.py `_InOrder`), while the function memo still holds its function: the
    branch start checked every site first, then walked them, and analysed each function that
    the memo had forgotten a second time (issue 38)."""
    from usdtpatch.analysis import targets
    from usdtpatch.analysis.functions import FunctionBounds

    made: list[int] = []
    real = targets.analyze_function

    def counted(ctx: targets.CodeContext, bounds: FunctionBounds) -> targets.FunctionCode:
        made.append(bounds.start)
        return real(ctx, bounds)

    monkeypatch.setattr(targets, "analyze_function", counted)
    rep = api.check(many_functions, fork_guard="never").report
    assert len(rep.sites) == index.RECENT + 44
    assert len(made) == len(set(made)) == len(rep.sites)


def test_relay_reads_each_probes_unwind_rows_once(many_functions: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every window relay tries for a probe starts at the probe: the FDE's rows from there on
    are read once per probe (analysis/relay.py `_row_boundaries`), not once per window tried
    (the branch start: here two windows a probe, each reading them)."""
    from usdtpatch.analysis import relay
    from usdtpatch.elf.cfi import Fde
    from usdtpatch.elf.ehframe import Row, rows_at
    from usdtpatch.x86.relocate import Detour, relay_window

    read: list[int] = []
    laid: list[int] = []

    def rows(fde: Fde, addresses: list[int]) -> dict[int, Row]:
        read.append(addresses[0])
        return rows_at(fde, addresses)

    def lay(code: bytes, start: int, *args: Any) -> Detour:
        laid.append(start)
        return relay_window(code, start, *args)

    monkeypatch.setattr(relay, "rows_at", rows)
    monkeypatch.setattr(relay, "relay_window", lay)
    rep = api.check(many_functions, fork_guard="never").report
    assert len(laid) == 2 * len(rep.sites)  # two windows tried per probe, rows asked for each
    assert len(read) == len(set(read)) == len(rep.sites)


def test_fork_evidence_classifies_the_calls_of_syscall_once(many_functions: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """check asks for the file's fork evidence without the raw system calls, the fork
    guard's question with them: the calls of syscall() are found and classified once per
    analysis context (analysis/hazards.py; the branch start looked for them, through
    references_to, for each question)."""
    from usdtpatch.analysis import hazards
    from usdtpatch.analysis.waysin import references_to

    asked: list[int] = []

    def counted(*args: Any) -> Any:
        asked.append(1)
        return references_to(*args)

    monkeypatch.setattr(hazards, "references_to", counted)
    rep = api.check(many_functions, fork_guard="never").report  # asks without raw
    ctx = rep.context
    assert ctx is not None and len(asked) == 1  # syscall() is not imported: one search
    first = hazards.fork_evidence(ctx)
    again = hazards.fork_evidence(ctx, raw=False)
    assert len(asked) == 1 and first.forks == () and again.forks == ()


def test_each_sites_fde_is_parsed_once(many_functions: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds of every site are kept for the run (the ways-in index asks for them all
    first), their FDEs with them: CfiIndex answers with those (`keep`) after its recent
    FDEs forgot them, and no site's FDE is parsed a second time when its site is checked
    (the branch start parsed each twice here: more sites than CfiIndex's recent FDEs)."""
    from usdtpatch.elf import cfi
    from usdtpatch.elf.image import ElfImage

    parsed: list[int] = []
    real = cfi.parse_fde

    def counted(image: ElfImage, address: int, cache: dict[int, cfi.Cie] | None = None
                ) -> cfi.Fde:
        parsed.append(address)
        return real(image, address, cache)

    monkeypatch.setattr(cfi, "parse_fde", counted)
    rep = api.check(many_functions, fork_guard="never").report
    assert len(rep.sites) > 64 and len(parsed) == len(set(parsed)) >= len(rep.sites)
