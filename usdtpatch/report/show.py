"""The `show` document (schema `usdtpatch/show`, version 1): one probe site and its patch
window disassembled, before and after side by side, as rows: the window's instructions, the
branch targets around them (marked T, with their kind), the probe (marked >), and why the
window starts and ends where it does. `usdtpatch show` prints it (report/render.py's
render_show) or its JSON; the HTML reports embed it per site.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from usdtpatch.analysis.check import CheckReport, SiteCheck, needs_red_zone_guard
from usdtpatch.analysis.targets import FunctionCode
from usdtpatch.analysis.windows import PatchWindow, WindowShape
from usdtpatch.elf.demangle import demangle
from usdtpatch.report.checkjson import site_json
from usdtpatch.report.envelope import envelope
from usdtpatch.x86.describe import describe
from usdtpatch.x86.nops import GUARD_ENTER, GUARD_LEAVE

SHOW_SCHEMA = "usdtpatch/show"
SHOW_SCHEMA_VERSION = 1


def show_document(sites: list[dict[str, Any]]) -> dict[str, Any]:
    """The document `show --json` prints: the site_views of the sites shown."""
    return {**envelope(SHOW_SCHEMA, SHOW_SCHEMA_VERSION, tool="none"), "sites": sites}


def _guard_row(text: str, note: str) -> dict[str, Any]:
    return {"mark": "", "address": None, "before": "", "after": "", "detour": text,
            "note": note}


GUARD_ENTER_TEXT = describe(GUARD_ENTER, 0, 0)  # leaq -0x80(%rsp), %rsp
GUARD_LEAVE_TEXT = describe(GUARD_LEAVE, 0, 0)  # leaq 0x80(%rsp), %rsp


def _rows(fc: FunctionCode, s: SiteCheck, context: int, members: Sequence[SiteCheck] = (),
          guarded: bool = False) -> list[dict[str, Any]]:
    """The rows of site `s`. In the detour, as rewrite writes it, every probe of the window
    (`s`'s and the `members` moved with it) is the 5-byte NOP; `guarded`: each is wrapped in
    the red-zone guard, a row of its own before and after the probe's."""
    w: PatchWindow | None = s.window.window if s.window is not None else None
    pc = s.probe.address
    lo_addr, hi_addr = (w.start, w.end) if w is not None else (pc, pc + 1)
    first = fc.index_covering(lo_addr)
    last = fc.index_covering(min(hi_addr, fc.bounds.end) - 1)
    if first is None or last is None:
        return []
    rows: list[dict[str, Any]] = []
    detour: dict[int, str] = {}  # the detour's line of each window instruction
    probes = {m.probe.address: m.probe.probe_id for m in members if m.probe.address != pc}
    tail: list[str] = []
    if w is not None and w.shape not in (WindowShape.IN_PLACE, WindowShape.RELAID):
        for ins in w.insns:
            detour[ins.address] = (
                "nopl 0x0(%rax,%rax,1)  <- probe (nop5)" if ins.address == pc else
                f"nopl 0x0(%rax,%rax,1)  <- {probes[ins.address]} (nop5, moved)"
                if ins.address in probes else ins.text)
        tail.append(f"jmp {w.end:#x}")
    else:
        guarded = False  # no detour: nothing to guard
    in_place = (describe(w.replacement, w.start, 0) if w is not None and w.replacement
                else "")
    lo = max(0, first - context)
    hi = min(len(fc.insns), last + 1 + context)
    for k in range(lo, hi):
        ins = fc.insns[k]
        inside = w is not None and w.start <= ins.address < w.end
        t = fc.target(ins.address)
        mark = ">" if ins.address == pc else ""
        if t is not None:
            mark += "T"
        notes: list[str] = []
        if t is not None:
            src = f" from {t.source:#x}" if t.source is not None else ""
            extra = ""
            ways = [r for r in w.retargets if r.target == ins.address] if w is not None else []
            if ways:
                extra = (f" (reached from outside too: {len(ways)} way(s) in aimed at its "
                         f"copy in the detour)")
            elif w is not None and ins.address in w.internal_targets:
                extra = " (reached only from inside the window: relocated with it)"
            elif w is None and pc < ins.address < pc + 5:
                extra = " (strictly inside: blocks)"
            notes.append(f"target: {t.kind}{src}{extra}")
        if w is not None and ins.address == w.start:
            notes.append(f"window start: {w.start_reason}")
        if w is not None and ins.address < w.end <= ins.end + fc.padding_after and (
                k + 1 == len(fc.insns) or fc.insns[k + 1].address >= w.end):
            notes.append(f"window end {w.end:#x}: {w.end_reason}")
        after = ins.text
        if inside and w is not None:
            if w.shape in (WindowShape.IN_PLACE, WindowShape.RELAID):
                after = in_place if ins.address == w.start else "(overwritten)"
            else:
                after = "jmp <detour>" if ins.address == w.start else "int3 ..."
        wrapped = guarded and inside and (ins.address == pc or ins.address in probes)
        if wrapped:
            rows.append(_guard_row(GUARD_ENTER_TEXT, "red-zone guard: %rsp lowered by 128 "
                                                     "around the probe"))
        rows.append({"mark": mark, "address": ins.address, "before": ins.text, "after": after,
                     "detour": detour.get(ins.address, "") if inside else "",
                     "note": "; ".join(notes)})
        if wrapped:
            rows.append(_guard_row(GUARD_LEAVE_TEXT, "red-zone guard: %rsp given back"))
    for extra in tail:  # the detour's tail (its jump back)
        rows.append({"mark": "", "address": None, "before": "", "after": "", "detour": extra,
                     "note": ""})
    return rows


def _members(report: CheckReport, s: SiteCheck) -> list[SiteCheck]:
    """The sites in `s`'s window (itself included): rewrite moves them with it."""
    w = s.window.window if s.window is not None else None
    if w is None:
        return [s]
    return [m for m in report.sites if w.start <= m.probe.address < w.end]


def site_views(path: str, report: CheckReport, sites: Sequence[SiteCheck] | None = None,
               context: int = 3) -> list[dict[str, Any]]:
    """The `show` document of each of `sites` (default: every site of `report`), in order;
    the HTML report embeds them per site."""
    ps = report.probeset
    if sites is None:
        sites = report.sites
    ctx = report.context  # check's: its functions know the file-wide ways in; none is made here
    names = demangle([s.probe.function for s in sites if s.probe.function])
    docs: list[dict[str, Any]] = []
    for s in sites:
        sj = site_json(s, names, ps.image.is64)
        fc = ctx.function(s.function) if s.function is not None else None
        members = _members(report, s)
        docs.append({
            "path": path, "probe": s.probe.probe_id, "address": s.probe.address,
            "function": sj["function"], "kernels": sj["kernels"], "outcome": s.outcome,
            "attempts": sj["window_attempts"], "window": sj["window"],
            "rows": _rows(fc, s, context, members, any(
                needs_red_zone_guard(m, report.options.guard, report.options.form)
                for m in members))
            if fc is not None else [],
            "findings": sj["findings"],
        })
    return docs
