"""Indexes the planner (and check, which decides the sites as it does) asks instead of
scanning every site per site (docs/performance.md, "Scaling"): with one probe per small
function, a scan per site made plan_rewrite quadratic (10,000 probes: 50 million overlap
tests).

- `Claims`: the byte ranges the plan has claimed (windows, patched ways in), a list kept in
  insertion order, with a sorted index answering "does [lo, hi) overlap a claim?" in
  O(log n + k) (k: the claims starting within the longest claim's length before `hi`).
- `SitesByAddress`: the sites in address order, given as a walk settles them, answering
  "which sites lie in [lo, hi)?" by bisection (and refusing to answer before every site
  below `hi` is there).
- `Recent`: a memo that keeps only its latest entries (the analysis' per-function caches:
  the sites come in address order, so a function is asked about while its sites are decided;
  holding every function's disassembly was ~2.4 KB per site).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Claims(list[tuple[int, int]]):
    """The claimed [lo, hi) ranges; `append` keeps the index, `overlaps` asks it."""

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        super().__init__()
        self._sorted: list[tuple[int, int]] = []
        self._longest = 0
        for r in ranges:
            self.append(r)

    def append(self, r: tuple[int, int]) -> None:
        super().append(r)
        if self._sorted and r >= self._sorted[-1]:
            self._sorted.append(r)  # the usual case: claims come in address order
        else:
            bisect.insort(self._sorted, r)
        self._longest = max(self._longest, r[1] - r[0])

    def extend(self, ranges: Iterable[tuple[int, int]]) -> None:
        for r in ranges:
            self.append(r)

    def overlaps(self, lo: int, hi: int) -> bool:
        """Whether [lo, hi) overlaps a claimed range."""
        i = bisect.bisect_left(self._sorted, (hi, -1))  # the claims starting before hi
        floor = lo - self._longest
        while i > 0:
            i -= 1
            s, e = self._sorted[i]
            if s <= floor:
                break
            if s < hi and lo < e:
                return True
        return False


class _Located(Protocol):
    @property
    def probe(self) -> _HasAddress: ...


class _HasAddress(Protocol):
    @property
    def address(self) -> int: ...


S = TypeVar("S", bound=_Located)


class SitesByAddress(Generic[S]):
    """The sites in address order (two notes may name one pc: ties in the order given),
    given one at a time (`add`) as a walk in address order settles them (rewrite's plan,
    during the check's walk); `between` refuses (AssertionError) a question about addresses
    not all given yet: an answer without the sites still to come would be wrong."""

    def __init__(self) -> None:
        self.sites: list[S] = []
        self.addresses: list[int] = []  # each site's probe address, as `sites`
        self.ended = False  # every site given

    def add(self, sc: S) -> None:
        at = sc.probe.address
        if self.addresses and at < self.addresses[-1]:
            raise ValueError(f"a site at {at:#x} given after one at {self.addresses[-1]:#x}")
        self.sites.append(sc)
        self.addresses.append(at)

    def has(self, hi: int) -> bool:
        """Every site with an address below `hi` is here."""
        return self.ended or (bool(self.addresses) and self.addresses[-1] >= hi)

    def between(self, lo: int, hi: int) -> list[S]:
        """The sites with lo <= address < hi, in address order."""
        if not self.has(hi):
            raise AssertionError(f"the sites up to {hi:#x} are asked for, not all given yet")
        return self.sites[bisect.bisect_left(self.addresses, lo):
                          bisect.bisect_left(self.addresses, hi)]


RECENT = 256  # entries a Recent memo keeps


class Recent(OrderedDict[K, V]):
    """A dict that forgets its oldest entry past `limit` entries (a memo of what is asked
    again soon; what it forgot is worked out again when asked). An OrderedDict: finding a
    plain dict's first key after many deletions at its front walks past every deleted slot
    (libjvm's check spent 0.3 s there)."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.limit = RECENT if limit is None else limit

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        if len(self) > self.limit:
            self.popitem(last=False)
