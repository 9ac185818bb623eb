"""The kcheck document (schema `usdtpatch/kcheck`, version 1, docs/kcheck.md) and
`usdtpatch kcheck`'s text: per process and site what the running kernel did, against the
plan (usdtpatch.live.kcheck.KcheckReport)."""

from __future__ import annotations

import signal
from typing import Any

from usdtpatch.live.kcheck import Fault, KcheckReport, ProcessResult, SiteResult
from usdtpatch.report.envelope import envelope

KCHECK_SCHEMA = "usdtpatch/kcheck"
KCHECK_SCHEMA_VERSION = 1


def _bytes(b: bytes | None) -> str | None:
    return None if b is None else b.hex()


def site_json(s: SiteResult) -> dict[str, Any]:
    return {"probe": s.probe, "index": s.index, "file_offset": s.file_offset,
            "address": s.address, "original": s.original.hex(),
            "semaphore_offset": s.semaphore_offset or None,
            "attach_error": s.attach_error or None, "hits": s.hits,
            "attached": _bytes(s.attached), "optimized": s.optimized,
            "call_target": s.call_target, "planned_protocol": s.planned_protocol,
            "planned": _bytes(s.planned), "planned_trampoline": s.planned_trampoline,
            "matches_plan": s.matches_plan, "detached": _bytes(s.detached),
            "restored": s.restored}


def fault_json(f: Fault) -> dict[str, Any]:
    return {"pid": f.pid, "tid": f.tid, "signal": f.signal,
            "signal_name": signal.Signals(f.signal).name, "address": f.address,
            "rip": f.rip, "return_address": f.return_address, "site": f.site,
            "in_trampoline": f.in_trampoline}


def process_json(p: ProcessResult) -> dict[str, Any]:
    return {"pid": p.pid, "kind": p.kind, "parent": p.parent,
            "threads": p.threads, "trampolines": p.trampolines,
            "optimized_at_fork": p.optimized_at_fork, "other_faults": p.other_faults,
            "exit_code": p.exit_code,
            "exit_signal": p.exit_signal,
            "exit_signal_name": (None if p.exit_signal is None
                                 else signal.Signals(p.exit_signal).name),
            "inspected": p.inspected, "note": p.note or None,
            "samples_lost": p.samples_lost, "throttled": p.throttled,
            "sites": [site_json(s) for s in p.sites]}


def kcheck_json(rep: KcheckReport) -> dict[str, Any]:
    """The document `kcheck --json` prints."""
    problems = rep.problems
    return {**envelope(KCHECK_SCHEMA, KCHECK_SCHEMA_VERSION, tool="none"),
            "path": rep.path, "command": rep.command, "pid": rep.pid,
            "kernel": rep.kernel, "generation": rep.generation,
            "seconds": round(rep.seconds, 3),
            "attach_seconds": round(rep.attach_seconds, 3),
            "detach_seconds": round(rep.detach_seconds, 3),
            "interrupted": rep.interrupted, "ok": not problems,
            "problems": problems,
            "processes": [process_json(p) for p in rep.processes],
            "faults": [fault_json(f) for f in rep.faults]}


# -- text ------------------------------------------------------------------------------------

def _hx(b: bytes | None) -> str:
    return "-" if b is None else b.hex(" ")


def _proc_line(p: ProcessResult) -> str:
    if p.exit_signal is not None:
        end = f"killed by {signal.Signals(p.exit_signal).name}"
    elif p.exit_code is not None:
        end = f"exit {p.exit_code}"
    else:
        end = p.note or "running"
    parent = f", child of {p.parent}" if p.parent else ""
    extra = ""
    if p.kind == "fork" and p.optimized_at_fork is not None:
        extra = f", forked with {p.optimized_at_fork} site(s) optimized"
    return f"pid {p.pid} ({p.kind}{parent}, {p.threads} thread(s){extra}): {end}"


def kcheck_text(rep: KcheckReport) -> str:
    """`usdtpatch kcheck`'s text."""
    gen = f" (the {rep.generation} generation)" if rep.generation else ""
    lines = [f"{rep.path} on Linux {rep.kernel}{gen}: events attached in "
             f"{rep.attach_seconds:.2f} s, detached in {rep.detach_seconds:.2f} s"]
    for p in rep.processes:
        lines.append(_proc_line(p))
        if p.samples_lost or p.throttled:
            lines.append(f"  hits undercounted: {p.samples_lost} sample(s) lost, sampling "
                         f"throttled {p.throttled} time(s)")
        if p.kind == "fork":
            continue
        if p.trampolines:
            lines.append("  [uprobes-trampoline] at " + ", ".join(f"{t:#x}" for t in p.trampolines))
        for s in p.sites:
            head = f"  {s.probe} +{s.file_offset:#x}"
            if s.attach_error:
                lines.append(f"{head}: not attached: {s.attach_error}")
                continue
            if not p.inspected:
                lines.append(f"{head}: {s.hits} hit(s), not inspected")
                continue
            state = "optimized" if s.optimized else "int3 path"
            addr = "unmapped" if s.address is None else f"{s.address:#x}"
            lines.append(f"{head} at {addr}: {s.hits} hit(s), {state} [{_hx(s.attached)}]")
            if s.matches_plan is not None:
                verdict = "as planned" if s.matches_plan else f"NOT as planned: plan says " \
                                                               f"{_hx(s.planned)}"
                tr = ("" if s.planned_trampoline is None
                      else f", trampoline {s.planned_trampoline:#x}")
                lines.append(f"      plan ({s.planned_protocol}{tr}): {verdict}")
            if s.restored is not None:
                lines.append(f"      after detach: {_hx(s.detached)} "
                             f"({'restored' if s.restored else 'NOT restored'})")
    for f in rep.faults:
        if f.site is None and not f.in_trampoline:
            continue  # summarized per process below
        where = f" called from {f.site} (return address {f.return_address:#x})" \
            if f.site and f.return_address is not None else ""
        tramp = " (the parent's trampoline page: not mapped in this child)" \
            if f.in_trampoline else ""
        lines.append(f"pid {f.pid}: {signal.Signals(f.signal).name} at {f.rip:#x}{tramp}{where}")
    for p in rep.processes:
        if p.other_faults:
            lines.append(f"pid {p.pid}: {p.other_faults} fault signal(s) not at a site "
                         f"(handled by the program or fatal elsewhere; --json lists them)")
    problems = rep.problems
    lines.append(f"{len(problems)} problem(s)" + "".join(f"\n  {p}" for p in problems))
    return "\n".join(lines) + "\n"
