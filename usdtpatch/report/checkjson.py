"""The `check` report as data: a versioned JSON document (schema in docs/check-json.md).

Every renderer (rich table, SARIF, HTML) reads this document, so the outputs cannot drift apart.

Deferred imports: elf/demangle.py (c++filt), only when result_json is not given the names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from usdtpatch.analysis.check import (
    BACKWARD,
    BLOCKED,
    FORWARD,
    IN_PLACE,
    NOT_APPLICABLE,
    OPTIMIZABLE,
    CheckReport,
    SiteCheck,
)
from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.findings import Finding, Severity
from usdtpatch.prove.support import provable
from usdtpatch.report.envelope import envelope
from usdtpatch.report.listing import function_label, site_disassembly

if TYPE_CHECKING:
    from usdtpatch.api import CheckResult

CHECK_SCHEMA = "usdtpatch/analysis"
CHECK_SCHEMA_VERSION = 1


def window_json(w: PatchWindow) -> dict[str, Any]:
    return {
        "shape": w.shape.value,
        "start": w.start,
        "end": w.end,
        "probe_offset": w.probe_offset,
        "probe_length": w.probe_length,
        "relocated_bytes": w.relocated_bytes,
        "extra_jumps": w.extra_jumps,
        "start_reason": w.start_reason,
        "end_reason": w.end_reason,
        "replacement": w.replacement.hex() if w.replacement is not None else None,
        "internal_targets": list(w.internal_targets),
        "padding_bytes": w.padding_bytes,
        "calls": list(w.calls),
        "retargets": [{"target": r.target, "source": r.source, "how": r.how, "kind": r.kind,
                       "stub": r.stub} for r in w.retargets],
        "instructions": [
            {"address": i.address, "bytes": w.code[i.address - w.start: i.end - w.start].hex(),
             "text": i.text} for i in w.insns
        ],
    }


def site_json(s: SiteCheck, names: dict[str, str], mode64: bool) -> dict[str, Any]:
    p = s.probe
    wr = s.window
    return {
        "provider": p.provider,
        "name": p.name,
        "address": p.address,
        "file_offset": p.offset,
        "function": function_label(p, names),
        "function_bounds": None if s.function is None else {
            "start": s.function.start, "end": s.function.end, "source": s.function.source},
        "site": {"form": p.site.form.value, "length": p.site.length, "bytes": p.code.hex(),
                 "disassembly": site_disassembly(p, mode64)},
        "kernels": {k: {"outcome": v.outcome.value, "reason": v.reason}
                    for k, v in s.candidacy.items()},
        "outcome": s.outcome,
        "blocked": None if s.blocked is None else {
            "code": s.blocked, "reason": wr.reason if wr is not None and wr.window is None
            else next((f.message for f in s.findings if f.code == s.blocked), s.blocked)},
        "window": None if wr is None or wr.window is None else window_json(wr.window),
        "provable": None if wr is None or wr.window is None else _provable_json(wr.window),
        "window_attempts": list(wr.tried) if wr is not None else [],
        "red_zone": None if s.red_zone is None else {
            "may_use": s.red_zone.may_use, "reason": s.red_zone.reason},
        "findings": [f.to_json() for f in s.findings],
    }


def _provable_json(w: PatchWindow) -> dict[str, Any]:
    """Whether a rewrite is expected to prove the window's detour (usdtpatch.prove.support)."""
    why = provable(w)
    return {"expected": why is None, "reason": why}


def summary_json(r: CheckReport) -> dict[str, Any]:
    oc = r.outcome_counts()
    windows = [s.window.window for s in r.sites if s.window is not None
               and s.window.window is not None]
    return {
        "sites": len(r.sites),
        "optimizable": oc[OPTIMIZABLE],
        "after_rewrite": {"in_place": oc[IN_PLACE], "forward": oc[FORWARD],
                          "backward": oc[BACKWARD]},
        "blocked": oc[BLOCKED],
        "blocked_by_reason": r.blocked_counts(),
        "not_applicable": oc[NOT_APPLICABLE],
        # of the sites with a window: how many a rewrite should prove when it moves the
        # window to a detour (usdtpatch.prove.support)
        "windows": len(windows),
        "provable": sum(1 for w in windows if provable(w) is None),
    }


def check_file_json(path: str, r: CheckReport, names: dict[str, str]) -> dict[str, Any]:
    img = r.probeset.image
    return {
        "path": path,
        "elf": {"class": 64 if img.is64 else 32,
                "byteorder": "little" if img.little_endian else "big",
                "machine": img.machine_name, "type": img.type},
        "cfi": {"source": r.cfi_source, "fdes": r.cfi_fdes},
        "fork_imports": list(r.fork_imports),
        "summary": summary_json(r),
        "sites": [site_json(s, names, img.is64) for s in r.sites],
        "findings": [f.to_json() for f in r.findings],
    }


def result_json(result: CheckResult, names: dict[str, str] | None = None,
                path: str | None = None) -> dict[str, Any]:
    """The file's entry of the check document of `usdtpatch.api.check`'s result. `names`:
    demangled function names (looked up here when not given); `path`: the name the entry
    gives the file (default: the result's)."""
    if names is None:
        from usdtpatch.elf.demangle import demangle

        names = demangle([s.probe.function for s in result.report.sites if s.probe.function])
    return check_file_json(result.path if path is None else path, result.report, names)


def check_document(files: list[dict[str, Any]], errors: list[dict[str, str]],
                   fail_on: str = "error") -> dict[str, Any]:
    return {**envelope(CHECK_SCHEMA, CHECK_SCHEMA_VERSION), "fail_on": fail_on, "files": files,
            "errors": errors}


def document_findings(doc: dict[str, Any]) -> list[dict[str, str]]:
    """Every finding of a check document (file-level and per site)."""
    out: list[dict[str, str]] = []
    for f in doc["files"]:
        out.extend(f["findings"])
        for s in f["sites"]:
            out.extend(s["findings"])
    return out


def reaches(findings: list[Finding] | list[dict[str, str]], fail_on: str) -> bool:
    """True when some finding's severity is at or above `fail_on` ("never" never fails)."""
    if fail_on == "never":
        return False
    limit = Severity(fail_on).rank
    for f in findings:
        sev = f.severity if isinstance(f, Finding) else Severity(f["severity"])
        if sev.rank >= limit:
            return True
    return False
