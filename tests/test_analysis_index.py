"""analysis/index.py: the planner's indexes answer as the scans they replace."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from usdtpatch.analysis.index import Claims, SitesByAddress

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


@given(st.lists(st.integers(0, 200), max_size=60), st.integers(0, 200), st.integers(0, 80))
def test_check_between_as_a_scan(addresses: list[int], lo: int, size: int) -> None:
    sites = [_S(_P(a), i) for i, a in enumerate(addresses)]
    idx = SitesByAddress(sites)
    want = [s for a in sorted({s.probe.address for s in sites}) if lo <= a < lo + size
            for s in sites if s.probe.address == a]
    assert list(idx.between(lo, lo + size)) == want
