"""Joining the windows of nearby probes, so that a site whose only windows overlap an earlier
site's is moved along with it instead of skipped (`window-overlaps-site`). Rewrite's planner
and check's walk (analysis/check.py `_together`) both join, so check says what rewrite does.

Probes one after another (`nop; nop; nop; nop; nop; nop; jmp`, several DTRACE_PROBEs in a
row, a probe right after another's window) give windows that overlap: the planner takes the
sites in address order and each window claims its bytes, so the later site found its window
taken. When the later window B overlaps the earlier one A (it starts inside A and ends after
it, or, a backward window, starts before A), their union is a window too: with L the one
that starts first, every address strictly inside the union is strictly inside L (below
L.end) or strictly inside the other (from L.end on, since the other starts before L ends),
so whatever made A and B windows (no branch target from outside strictly inside, or one
reached only from inside, or a way in aimed at the detour) holds for the union. Its detour
holds both probes (relocate_window takes one replacement per probe), and the equivalence
check runs on the union like on any window. The stubs of its 8-bit ways in stay where each
window put them, in the union's filler.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from typing import TYPE_CHECKING, Protocol

from usdtpatch.analysis.forms import guard_args, uses_numeric_rip
from usdtpatch.analysis.windows import MAX_WINDOW, STUB_SIZE, PatchWindow, WindowShape
from usdtpatch.x86.nops import FORMS

if TYPE_CHECKING:  # check.py calls join_following: its type only
    from usdtpatch.analysis.check import SiteCheck


class SitesInOrder(Protocol):
    """The sites in address order, by index: rewrite's sorted list, check's walk."""

    def __len__(self) -> int: ...

    def __getitem__(self, k: int) -> SiteCheck: ...


def joined(a: PatchWindow, b: PatchWindow) -> PatchWindow | None:
    """The union of `a` and the later site's window `b` that overlaps it, or None when they
    cannot be joined (another function, no overlap, `a` ending in padding, a stub, too long).

    `b` may start inside `a` and end after it, or start before `a` (a backward window of the
    later probe) and end inside or after it. With L the window that starts first and O the
    other, every address strictly inside the union is strictly inside L (below L.end) or
    strictly inside O (from L.end on, since O starts before L ends): whatever made L and O
    windows holds for the union, and O's start, strictly inside L, was judged by L."""
    if a.function_start != b.function_start or max(a.start, b.start) >= min(a.end, b.end):
        return None
    first, other = (b, a) if b.start < a.start else (a, b)
    last = b if b.end > a.end else a
    ends_first = a if last is b else b
    if (ends_first.padding_bytes and ends_first.end < last.end) or \
            last.end - first.start > MAX_WINDOW:
        return None  # a window ending in padding is not continued; a joined one stays short
    if a.entry_stub is not None or b.entry_stub is not None:
        return None  # a short window's jmp rel8 and its stub are its own
    # the stubs of 8-bit ways in stay where they are: each must lie in the union's int3
    # filler (after its entry jmp, before any padding the end may take), apart from the others
    stubs = sorted({r.stub for r in (*a.retargets, *b.retargets) if r.stub is not None})
    lo, hi = first.start + STUB_SIZE, last.end - last.padding_bytes
    if any(not lo <= s <= hi - STUB_SIZE for s in stubs) or \
            any(y < x + STUB_SIZE for x, y in pairwise(stubs)):
        return None
    if first is last:  # one holds the other
        insns, code = first.insns, first.code
    else:
        insns = first.insns + tuple(i for i in other.insns if i.address >= first.end)
        if not insns or insns[len(first.insns) - 1].end != first.end or \
                (len(insns) > len(first.insns) and insns[len(first.insns)].address != first.end):
            return None  # the later instructions do not continue the first's at its end
        code = first.code + other.code[first.end - other.start:]
    shape = first.shape if first.shape is not WindowShape.IN_PLACE else WindowShape.FORWARD
    return replace(
        a, shape=shape, start=first.start, end=last.end, insns=insns, code=code,
        replacement=None, relocated_bytes=len(code), extra_jumps=2,
        start_reason=first.start_reason, targets_at_start=first.targets_at_start,
        end_reason=f"{last.end_reason}; joined with the window of the probe at "
                   f"{b.probe_address:#x}",
        internal_targets=tuple(sorted({*a.internal_targets, *b.internal_targets})),
        padding_bytes=last.padding_bytes,
        calls=tuple(sorted({*a.calls, *b.calls})),
        retargets=(*a.retargets, *(r for r in b.retargets if r not in a.retargets)))


def join_following(win: PatchWindow, order: SitesInOrder, n: int) -> PatchWindow:
    """`win`, the window of `order[n]` (sites in address order), joined with the window of
    each later 1-byte site whose probe lies past `win`'s end and whose window overlaps it.
    Looks only at the sites within MAX_WINDOW bytes: constant work per site."""
    for k in range(n + 1, len(order)):  # no slice: a copy of the rest per site is quadratic
        sc = order[k]
        p = sc.probe
        if p.address >= win.start + MAX_WINDOW:
            break
        if p.address < win.end or FORMS[p.site.form].kept_by:
            continue  # a member of `win` already, or a site some kernel optimizes as it is
        other = sc.window.base if sc.window is not None else None
        if other is None or uses_numeric_rip(p.args) is not None or \
                guard_args(p.args)[1] is not None:
            continue  # joining would make the whole window fail where `win` alone works
        both = joined(win, other)
        if both is not None:
            win = both
    return win
