"""Rewrite one image in one call: `plan_rewrite` (rewriter/plan.py), then `build_rewrite`
(rewriter/build.py). Kept for callers that want bytes; usdtpatch.api.rewrite is the library's
entry point (files, atomic output, the verifier)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from usdtpatch.analysis.check import CheckReport
from usdtpatch.elf.image import ElfImage
from usdtpatch.findings import Finding
from usdtpatch.rewriter.build import TEXT_SECTION, build_rewrite, output_findings
from usdtpatch.rewriter.forms import ForkGuard, Form, Guard
from usdtpatch.rewriter.marker import (
    MARKER_OWNER,
    MARKER_SECTION,
    MARKER_TYPE,
    AlreadyRewritten,
    marker_of,
    restore_image,
)
from usdtpatch.rewriter.plan import (
    INT3,
    Action,
    RewritePlan,
    SiteDecision,
    SiteOutcome,
    Status,
    Verifier,
    plan_rewrite,
)

__all__ = ["INT3", "MARKER_OWNER", "MARKER_SECTION", "MARKER_TYPE", "TEXT_SECTION", "Action",
           "AlreadyRewritten", "RewritePlan", "RewriteResult", "SiteDecision", "SiteOutcome",
           "Status", "Verifier", "marker_of", "restore_image", "rewrite_image"]


@dataclass(frozen=True, slots=True)
class RewriteResult:
    data: bytes | None  # None: nothing to change
    sites: tuple[SiteDecision, ...]
    findings: tuple[Finding, ...]
    form: Form
    guard: Guard

    @property
    def rewritten(self) -> int:
        return sum(1 for s in self.sites if s.status is Status.REWRITTEN)

    @property
    def failed(self) -> bool:
        return any(s.status is Status.FAILED for s in self.sites)


def rewrite_image(image: ElfImage, form: Form = Form.NOP5, guard: Guard = Guard.AUTO, *,
                  verify: Verifier | None, fork_guard: ForkGuard = ForkGuard.AUTO,
                  report: CheckReport | None = None,
                  progress: Callable[[int, int], None] | None = None) -> RewriteResult:
    """Plan and build the rewritten file for `image` (pure: bytes in, bytes out).

    `verify` is required: pass the emulator's verifier, or None to skip verification on
    purpose. Raises AlreadyRewritten for a file that carries the marker.
    """
    plan = plan_rewrite(image, form=form, guard=guard, fork_guard=fork_guard, verify=verify,
                        report=report, progress=progress)
    if not plan.changed:
        return RewriteResult(None, plan.sites, plan.findings, form, guard)
    built = build_rewrite(plan)
    return RewriteResult(built.data, plan.sites, output_findings(plan, built), form, guard)
