"""The verification document (schema `usdtpatch/verification`, version 1,
docs/plan-verify.md) and `usdtpatch verify`'s text: every site's verdict from the emulator's
runs of every torn state; `demo_text`, the plan of one site and the verdicts, for `usdtpatch
demo`."""

from __future__ import annotations

from typing import Any

from usdtpatch.report.envelope import envelope
from usdtpatch.report.plan import site_lines
from usdtpatch.sequences.plan import Plan
from usdtpatch.verification.plans import FAIL, PASS, SKIP, VerifyReport

VERIFY_SCHEMA = "usdtpatch/verification"
VERIFY_SCHEMA_VERSION = 1


def verify_json(rep: VerifyReport) -> dict[str, Any]:
    return {
        **envelope(VERIFY_SCHEMA, VERIFY_SCHEMA_VERSION, tool="none"), "path": rep.path,
        "protocol": rep.protocol, "ok": rep.ok, "runs": rep.runs,
        "seconds": round(rep.seconds, 4),
        "sites": [{"probe": v.probe, "address": v.address, "protocol": v.protocol,
                   "status": v.status, "reason": v.reason, "runs": v.runs,
                   "failures": [f.to_json() for f in v.failures],
                   "hazards": [h.to_json() for h in v.hazards],
                   "red_zone_writes": list(v.red_zone_writes)} for v in rep.verdicts],
        "findings": [f.to_json() for f in rep.findings],
    }


def verify_text(rep: VerifyReport) -> str:
    """`usdtpatch verify`'s text."""
    lines = []
    for f in rep.findings:
        lines.append(f"{f.severity.value} [{f.code}] {f.message}")
    for v in rep.verdicts:
        head = f"{v.status.upper():<4} {v.probe} at {v.address:#x} ({v.protocol})"
        if v.status == SKIP:
            head += f": {v.reason}"
        else:
            head += f": {v.runs} thread run(s)"
        lines.append(head)
        for fl in v.failures:
            lines.append(f"     [{fl.code}] {fl.message}")
        for h in v.hazards:
            lines.append(f"     {h.severity.value} [{h.code}] {h.message}")
    n = {s: sum(1 for v in rep.verdicts if v.status == s) for s in (PASS, FAIL, SKIP)}
    lines.append(f"{rep.path}: {len(rep.verdicts)} site(s): {n[PASS]} pass, {n[FAIL]} fail, "
                 f"{n[SKIP]} skipped; {rep.runs} emulated thread runs in {rep.seconds:.2f} s")
    return "\n".join(lines) + "\n"


def demo_text(plan: Plan, rep: VerifyReport) -> str:
    """The plan of the first site the kernel optimizes, then every site's verdict."""
    first = next((s for s in plan.sites
                  if s.sequences is not None and s.sequences.optimize is not None), None)
    text = ""
    if first is not None:
        text += "\n".join(site_lines(first)) + "\n"
    return text + verify_text(rep)
