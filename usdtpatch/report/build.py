"""The post-link step's report (usdtpatch.integrate.step, `usdtpatch post-link`): the
build-report document (docs/build-integration.md) and the lines a build log shows.

The step calls the library (rewrite, then check of the bytes to be written) and passes the
results here; the document holds the rewrite document's entry and the check document.

Deferred imports: rewriter/plan.py (Status), only for a rewrite's findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from usdtpatch.kernelfacts import OPTIMIZING
from usdtpatch.report.envelope import envelope

if TYPE_CHECKING:
    from usdtpatch.api import RewriteOutcome

REPORT_SCHEMA = "usdtpatch/build-report"
REPORT_SCHEMA_VERSION = 1


def finding_line(path: str, f: dict[str, str]) -> str:
    """A finding as the one line a build log shows; an error (what fails a build) ends with
    its hint, what to do about it."""
    where = f" {f['where']}:" if f.get("where") else ""
    hint = f" (hint: {f['hint']})" if f.get("hint") and f["severity"] == "error" else ""
    return f"usdtpatch: {path}: {f['severity']} [{f['code']}]{where} {f['message']}{hint}"


def rewrite_findings(outcome: RewriteOutcome) -> list[dict[str, str]]:
    """The rewrite's findings, and each site it failed to rewrite as an error."""
    from usdtpatch.rewriter.plan import Status

    out = [f.to_json() for f in outcome.findings]
    for s in outcome.sites:
        if s.status is Status.FAILED:
            out.append({"code": s.code or "rewrite-failed", "severity": "error",
                        "where": s.probe.probe_id, "message": s.reason, "hint": ""})
    return out


def summary_text(entry: dict[str, Any] | None, doc: dict[str, Any], form: str,
                 redzone_guard: str) -> str:
    """What the step did to the file, for its last line: the check document `doc`'s sites,
    the rewrite document's `entry` (None: only checked)."""
    sites = doc["files"][0]["sites"]
    fast = ", ".join(
        f"{sum(1 for s in sites if s['kernels'].get(g.name, {}).get('outcome') == 'optimized')}"
        f" optimized on {g.name}" for g in OPTIMIZING)
    text = f"{len(sites)} site(s), {fast}"
    if entry is not None:
        if entry.get("note"):
            text += "; already rewritten, left as it is"
        elif not entry["changed"]:
            text += "; nothing to rewrite"
        else:
            counts = ", ".join(f"{n} {a}" for a, n in sorted(entry["counts"].items()))
            text += f"; rewritten ({counts})"
        # the options a build fixes rather than taking the build machine's kernel
        # (docs/build-integration.md, "Defaults")
        text += f"; form {form}, red-zone guard {redzone_guard}"
    return text


def build_report(*, path: str, output: str, mode: str, options: dict[str, Any], fail_on: str,
                 failed: bool, changed: bool, findings: list[dict[str, str]],
                 rewrite: dict[str, Any] | None, check: dict[str, Any]) -> dict[str, Any]:
    """The build-report document of one step: `path` made into `output` (`mode` rewrite or
    check) with `options`; `rewrite` the rewrite document's entry, `check` the check
    document of the output."""
    return {**envelope(REPORT_SCHEMA, REPORT_SCHEMA_VERSION), "input": path, "output": output,
            "mode": mode, "options": options, "fail_on": fail_on, "failed": failed,
            "changed": changed, "findings": findings, "rewrite": rewrite, "check": check}
