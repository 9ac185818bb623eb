"""The rewrite report as data: a versioned JSON document (schema in docs/json-schema.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from usdtpatch import __version__
from usdtpatch.findings import Finding
from usdtpatch.rewriter.plan import VERIFICATIONS, SiteDecision

REWRITE_SCHEMA = "usdtpatch/rewrite"
REWRITE_SCHEMA_VERSION = 1


def site_json(o: SiteDecision) -> dict[str, Any]:
    return {
        "provider": o.probe.provider, "name": o.probe.name, "address": o.probe.address,
        "action": o.action.value, "code": o.code, "reason": o.reason, "new_pc": o.new_pc,
        "guarded": o.guarded, "extra_jumps_per_pass": o.extra_jumps,
        "window": None if o.window is None else {
            "start": o.window.start, "end": o.window.end, "shape": o.window.shape.value},
        "detour": None if o.detour is None else {
            "address": o.detour.address, "size": len(o.detour.code)},
        "calls": o.calls, "retargeted": list(o.retargeted), "verification": o.verification,
    }


def verification_counts(sites: Sequence[SiteDecision]) -> dict[str, int]:
    """How many sites were proved, emulated, not verified (each site decided with a detour
    or in place, and each rejected by its check; the other skipped sites are not counted)."""
    counts = dict.fromkeys(VERIFICATIONS, 0)
    for o in sites:
        if o.verification is not None:
            counts[o.verification] = counts.get(o.verification, 0) + 1
    return counts


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
            "sites": [site_json(o) for o in sites], "findings": [f.to_json() for f in findings]}


def rewrite_document(files: list[dict[str, Any]], errors: list[dict[str, str]]
                     ) -> dict[str, Any]:
    return {"schema": REWRITE_SCHEMA, "schema_version": REWRITE_SCHEMA_VERSION,
            "tool": {"name": "usdtpatch", "version": __version__}, "files": files,
            "errors": errors}
