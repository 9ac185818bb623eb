"""The rewrite report as data: a versioned JSON document (schema in docs/json-schema.md)."""

from __future__ import annotations

from typing import Any

from usdtpatch import __version__
from usdtpatch.rewrite.apply import RewriteResult

REWRITE_SCHEMA = "usdtpatch/rewrite"
REWRITE_SCHEMA_VERSION = 1


def result_json(path: str, output: str | None, res: RewriteResult,
                verified: bool) -> dict[str, Any]:
    sites = []
    for o in res.sites:
        sites.append({
            "provider": o.probe.provider, "name": o.probe.name, "address": o.probe.address,
            "action": o.action, "code": o.code, "reason": o.reason, "new_pc": o.new_pc,
            "guarded": o.guarded, "extra_jumps_per_pass": o.extra_jumps,
            "window": None if o.window is None else {
                "start": o.window.start, "end": o.window.end, "shape": o.window.shape.value},
            "detour": None if o.detour is None else {
                "address": o.detour.address, "size": len(o.detour.code)},
        })
    counts: dict[str, int] = {}
    for o in res.sites:
        counts[o.action] = counts.get(o.action, 0) + 1
    return {"path": path, "output": output, "form": res.form.value, "guard": res.guard.value,
            "verified": verified, "changed": res.data is not None, "counts": counts,
            "sites": sites, "findings": [f.to_json() for f in res.findings]}


def rewrite_document(files: list[dict[str, Any]], errors: list[dict[str, str]]
                     ) -> dict[str, Any]:
    return {"schema": REWRITE_SCHEMA, "schema_version": REWRITE_SCHEMA_VERSION,
            "tool": {"name": "usdtpatch", "version": __version__}, "files": files,
            "errors": errors}
