"""The rewrite document (schema in docs/json-schema.md) and `rewrite --report FILE`, what a
rewrite changed, skipped and why, as a file.

The document: one entry per file (`outcome_json` of usdtpatch.api.RewriteOutcome), the
envelope around them (`rewrite_document`). The report's kind is chosen by FILE's extension:
`.html` (the page of usdtpatch/report/html.py), `.json` (the rewrite document with each
file's `size_before`, `size_after` and `seconds`) or `.sarif` (SARIF 2.1.0: the files'
findings and one result per site left unchanged, with its registered code). Written
atomically with the mode the umask gives (a report is meant to be shared).

Deferred imports: rewriter/plan.py (VERIFICATIONS) and findings, only for the document and
the SARIF (`check --report FILE` asks report_kind alone), report/html.py and
report/sarif.py, only for their kind.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from usdtpatch.errors import OutputError
from usdtpatch.io import umask_mode, write_atomic
from usdtpatch.prove.assumptions import PROVED, RESTS_ON, assumption_names
from usdtpatch.report.envelope import envelope

if TYPE_CHECKING:  # `check --report FILE` asks report_kind without loading the rewriter
    from usdtpatch.api import RestoreOutcome, RewriteOutcome
    from usdtpatch.findings import Finding
    from usdtpatch.rewriter.plan import SiteDecision

REWRITE_SCHEMA = "usdtpatch/rewrite"
REWRITE_SCHEMA_VERSION = 1
REPORT_KINDS = (".html", ".json", ".sarif")


def site_json(o: SiteDecision) -> dict[str, Any]:
    return {
        "provider": o.probe.provider, "name": o.probe.name, "address": o.probe.address,
        "action": o.action.value, "code": o.code, "reason": o.reason, "new_pc": o.new_pc,
        "guarded": o.guarded, "extra_jumps_per_pass": o.extra_jumps,
        "window": None if o.span is None else {
            "start": o.span.start, "end": o.span.end, "shape": o.span.shape.value},
        "detour": None if o.detour is None else {
            "address": o.detour.address, "size": len(o.detour.code)},
        "calls": o.calls, "retargeted": list(o.retargeted), "verification": o.verification,
        "returns": [{"call": c, "original": r, "seen": seen} for c, r, seen in o.returns],
        "faults": [{"original": a, "seen": b} for a, b in o.faults],
    }


def verification_counts(sites: Sequence[SiteDecision]) -> dict[str, int]:
    """How many sites were proved, emulated, not verified (each site decided with a detour
    or in place, and each rejected by its check; the other skipped sites are not counted)."""
    from usdtpatch.rewriter.plan import VERIFICATIONS

    counts = dict.fromkeys(VERIFICATIONS, 0)
    for o in sites:
        if o.verification is not None:
            counts[o.verification] = counts.get(o.verification, 0) + 1
    return counts


def verification_basis(verified: bool) -> dict[str, Any] | None:
    """What a site's `proved` or `emulated` says and what it rests on (prove/assumptions.py);
    None for a rewrite that verified nothing (--no-verify)."""
    if not verified:
        return None
    return {"proved": PROVED, "rests_on": RESTS_ON, "assumptions": assumption_names()}


def result_json(path: str, output: str | None, form: str, guard: str, verified: bool,
                changed: bool, sites: Sequence[SiteDecision], findings: Sequence[Finding],
                note: str | None = None) -> dict[str, Any]:
    """One file's entry; `note` set: the file was already rewritten (nothing decided)."""
    if note is not None:
        return {"path": path, "output": output, "changed": False, "note": note,
                "sites": [], "counts": {}, "findings": [], "form": form, "guard": guard,
                "verified": verified}
    counts: dict[str, int] = {}
    for o in sites:
        counts[o.action.value] = counts.get(o.action.value, 0) + 1
    return {"path": path, "output": output, "form": form, "guard": guard,
            "verified": verified, "changed": changed, "counts": counts,
            "verification": verification_counts(sites),
            "verification_basis": verification_basis(verified),
            "sites": [site_json(o) for o in sites], "findings": [f.to_json() for f in findings]}


def outcome_json(o: RewriteOutcome, output: str | None = None) -> dict[str, Any]:
    """The file's entry of the rewrite document of `usdtpatch.api.rewrite`'s outcome
    (`output`: the output it names, default the outcome's)."""
    return result_json(o.path, o.output if output is None else output,
                       "auto" if o.form is None else o.form.value, o.redzone_guard.value,
                       o.verified, o.changed, o.sites, o.findings, o.note)


def rewrite_document(files: list[dict[str, Any]], errors: list[dict[str, str]],
                     seconds: float | None = None) -> dict[str, Any]:
    """The document of a run over several files (`seconds`: the run's time, when measured)."""
    doc = {**envelope(REWRITE_SCHEMA, REWRITE_SCHEMA_VERSION), "files": files,
           "errors": errors}
    if seconds is not None:
        doc["seconds"] = round(seconds, 3)
    return doc


def restore_line(path: str, res: RestoreOutcome) -> str:
    """What `usdtpatch restore` prints."""
    return f"{path}: restored to {res.output} ({res.size} bytes, sha256 checked)"


def report_kind(path: str) -> str:
    """The report kind of `path` by its extension (.htm counts as .html); raises OutputError
    naming the accepted ones."""
    ext = Path(path).suffix.lower()
    if ext == ".htm":
        ext = ".html"
    if ext not in REPORT_KINDS:
        raise OutputError(f"{path}: --report needs a file name ending in "
                         f"{', '.join(REPORT_KINDS)} (the extension chooses the kind)")
    return ext


def report_fields(size_before: int | None, size_after: int | None, seconds: float
                  ) -> dict[str, Any]:
    """A file's fields in the report (report_document): its size before the rewrite, its
    output's (None: nothing written), the time its rewrite took."""
    return {"size_before": size_before, "size_after": size_after, "seconds": round(seconds, 3)}


def report_document(doc: dict[str, Any], extras: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rewrite document with each file's report fields (`size_before`, `size_after`,
    `seconds`) merged in, file by file; `doc` itself is not changed."""
    files = [{**entry, **extra} for entry, extra in zip(doc["files"], extras, strict=True)]
    return {**doc, "files": files}


def _skip_finding(site: dict[str, Any]) -> dict[str, str]:
    from usdtpatch.findings import is_registered, lookup

    code = site["code"] or "skipped"
    reg = lookup(code) if is_registered(code) else None
    return {"code": code, "severity": reg.severity.value if reg is not None else "info",
            "where": f"{site['provider']}:{site['name']}",
            "message": f"{site['provider']}:{site['name']} at {site['address']:#x} left "
                       f"unchanged: {site['reason']}",
            "hint": reg.hint if reg is not None else ""}


def rewrite_sarif(doc: dict[str, Any]) -> dict[str, Any]:
    """SARIF 2.1.0 of a rewrite document: file findings and each skipped site's reason."""
    from usdtpatch.report.sarif import sarif_document

    files = []
    for f in doc["files"]:
        sites = [{"provider": s["provider"], "name": s["name"], "address": s["address"],
                  "file_offset": None, "function": None,
                  "findings": [_skip_finding(s)]}
                 for s in f["sites"] if s["action"] == "skipped"]
        files.append({"path": f["path"], "findings": f["findings"], "sites": sites})
    return sarif_document({"files": files})


def write_report(path: str, doc: dict[str, Any],
                 views: Sequence[Sequence[dict[str, Any]]] | None = None) -> None:
    """Write the report of the rewrite document `doc` (report_document) to `path`."""
    kind = report_kind(path)
    if kind == ".html":
        from usdtpatch.report.html import rewrite_html_page

        text = rewrite_html_page(doc, views)
    elif kind == ".sarif":
        text = json.dumps(rewrite_sarif(doc), indent=2) + "\n"
    else:
        text = json.dumps(doc, indent=2) + "\n"
    write_atomic(path, text.encode(), mode=umask_mode())
