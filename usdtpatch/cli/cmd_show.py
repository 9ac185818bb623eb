"""`usdtpatch show FILE --probe [PROVIDER:]NAME [--json] [--context N]`.

The site and its patch window disassembled, before and after side by side: the window's
instructions, the branch targets around them (marked T, with their kind), the probe (marked >),
and why the window starts and ends where it does.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import IO, Any

from usdtpatch import api
from usdtpatch.analysis.check import CheckReport, SiteCheck
from usdtpatch.analysis.targets import CodeContext, FunctionCode
from usdtpatch.analysis.windows import PatchWindow, WindowShape
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE, error_line
from usdtpatch.elf.cfi import CfiError, CfiIndex, load_cfi
from usdtpatch.elf.demangle import demangle
from usdtpatch.elf.symbols import load_symbols
from usdtpatch.errors import InputError, UsdtpatchError
from usdtpatch.report.checkjson import site_json
from usdtpatch.report.listing import PROBE_PATTERN_HELP, probe_matches
from usdtpatch.x86.describe import describe


def register(sub: Any) -> None:
    p = sub.add_parser("show", help="show one probe site and its patch window, before and after")
    p.add_argument("file", metavar="FILE", help="the ELF file holding the probe")
    p.add_argument("--probe", required=True, metavar="PATTERN",
                   help=f"the probes to show (every site of each): {PROBE_PATTERN_HELP}")
    p.add_argument("--context", type=int, default=3, metavar="N",
                   help="instructions shown before and after the window (default 3)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


def _rows(fc: FunctionCode, s: SiteCheck, context: int) -> list[dict[str, Any]]:
    w: PatchWindow | None = s.window.window if s.window is not None else None
    pc = s.probe.address
    lo_addr, hi_addr = (w.start, w.end) if w is not None else (pc, pc + 1)
    first = fc.index_covering(lo_addr)
    last = fc.index_covering(min(hi_addr, fc.bounds.end) - 1)
    if first is None or last is None:
        return []
    rows: list[dict[str, Any]] = []
    detour: list[str] = []
    if w is not None and w.shape is not WindowShape.IN_PLACE:
        for ins in w.insns:
            detour.append("nopl 0x0(%rax,%rax,1)  <- probe (nop5)" if ins.address == pc
                          else ins.text)
        detour.append(f"jmp {w.end:#x}")
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
            if w is not None and ins.address in w.internal_targets:
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
            if w.shape is WindowShape.IN_PLACE:
                after = in_place if ins.address == w.start else "(overwritten)"
            else:
                after = "jmp <detour>" if ins.address == w.start else "int3 ..."
        rows.append({"mark": mark, "address": ins.address, "before": ins.text, "after": after,
                     "detour": detour.pop(0) if inside and detour else "",
                     "note": "; ".join(notes)})
    for extra in detour:  # the detour's tail (its jump back)
        rows.append({"mark": "", "address": None, "before": "", "after": "", "detour": extra,
                     "note": ""})
    return rows


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    try:
        docs = _site_docs(args)
    except UsdtpatchError as exc:
        error_line(args.file, exc, err)
        return EXIT_UNUSABLE
    if args.json:
        json.dump({"schema": "usdtpatch/show", "schema_version": 1, "sites": docs}, out,
                  indent=2)
        out.write("\n")
    else:
        from usdtpatch.report.render import make_console, render_show

        console = make_console(out)
        for d in docs:
            render_show(console, d)
    return EXIT_OK


def _site_docs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of every site of the probe (raises UsdtpatchError, naming what is wrong)."""
    report = api.check(args.file).report
    sites = [s for s in report.sites
             if probe_matches(args.probe, s.probe.provider, s.probe.name)]
    if not sites:
        known = ", ".join(sorted({s.probe.probe_id for s in report.sites})[:10]) or "none"
        raise InputError(f"{args.file}: no probe {args.probe} (probes: {known})")
    return site_views(args.file, report, sites, args.context)


def site_views(path: str, report: CheckReport, sites: Sequence[SiteCheck] | None = None,
               context: int = 3) -> list[dict[str, Any]]:
    """The `show` document of each of `sites` (default: every site of `report`), in order;
    the HTML report embeds them per site."""
    ps = report.probeset
    if sites is None:
        sites = report.sites
    ctx = report.context  # check's: its functions know the file-wide ways in
    if ctx is None:
        symbols = load_symbols(ps.image)
        try:
            cfi = load_cfi(ps.image)
        except CfiError:
            cfi = CfiIndex(ps.image, (), (), "none")
        ctx = CodeContext(ps.image, cfi, symbols)
    names = demangle([s.probe.function for s in sites if s.probe.function])
    docs: list[dict[str, Any]] = []
    for s in sites:
        sj = site_json(s, names, ps.image.is64)
        fc = ctx.function(s.function) if s.function is not None else None
        docs.append({
            "path": path, "probe": s.probe.probe_id, "address": s.probe.address,
            "function": sj["function"], "kernels": sj["kernels"], "outcome": s.outcome,
            "attempts": sj["window_attempts"], "window": sj["window"],
            "rows": _rows(fc, s, context) if fc is not None else [],
            "findings": sj["findings"],
        })
    return docs
