"""Joining the windows of nearby probes, so that a site whose only windows overlap an earlier
site's is moved along with it instead of skipped (`window-overlaps-site`). Rewrite's planner
and check's walk (analysis/check.py `_together`) both join, so check says what rewrite does.

Probes one after another (`nop; nop; nop; nop; nop; nop; jmp`, several DTRACE_PROBEs in a
row, a probe right after another's window) give windows that overlap: the planner takes the
sites in address order and each window claims its bytes, so the later site found its window
taken. When the later window B starts inside the earlier one A (A.start <= B.start < A.end)
and ends after it, their union [A.start, B.end) is a window too: every address strictly
inside it is strictly inside A (below A.end) or strictly inside B (from A.end on, since
B.start < A.end), so whatever made A and B windows (no branch target from outside strictly
inside, or one reached only from inside, or a way in aimed at the detour) holds for the
union. Its detour holds both probes (relocate_window takes one replacement per probe), and
the equivalence check runs on the union like on any window.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from usdtpatch.analysis.forms import guard_args, uses_numeric_rip
from usdtpatch.analysis.windows import MAX_WINDOW, PatchWindow, WindowShape
from usdtpatch.x86.nops import FORMS

if TYPE_CHECKING:  # check.py calls join_following: its type only
    from usdtpatch.analysis.check import SiteCheck


class SitesInOrder(Protocol):
    """The sites in address order, by index: rewrite's sorted list, check's walk."""

    def __len__(self) -> int: ...

    def __getitem__(self, k: int) -> SiteCheck: ...


def joined(a: PatchWindow, b: PatchWindow) -> PatchWindow | None:
    """The union of `a` and the later window `b` that overlaps its end, or None when they
    cannot be joined (another function, no overlap, `a` ending in padding, a stub in the
    padding, too long)."""
    if a.function_start != b.function_start or not a.start <= b.start < a.end < b.end:
        return None
    if a.padding_bytes or b.end - a.start > MAX_WINDOW:
        return None
    if a.entry_stub is not None or b.entry_stub is not None:
        return None  # a short window's jmp rel8 and its stub are its own
    if any(r.stub is not None for r in (*a.retargets, *b.retargets)):
        return None  # a stub lives in the padding a joined window's end may take
    insns = a.insns + tuple(i for i in b.insns if i.address >= a.end)
    if not insns or insns[len(a.insns) - 1].end != a.end or \
            (len(insns) > len(a.insns) and insns[len(a.insns)].address != a.end):
        return None  # b's instructions do not continue a's at its end
    code = a.code + b.code[a.end - b.start:]
    shape = WindowShape.FORWARD if a.shape is WindowShape.IN_PLACE else a.shape
    return replace(
        a, shape=shape, end=b.end, insns=insns, code=code, replacement=None,
        relocated_bytes=len(code), extra_jumps=2,
        end_reason=f"{b.end_reason}; joined with the window of the probe at "
                   f"{b.probe_address:#x}",
        internal_targets=tuple(sorted({*a.internal_targets, *b.internal_targets})),
        padding_bytes=b.padding_bytes,
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
