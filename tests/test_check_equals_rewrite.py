"""check = rewrite (issue 19, item 4): for every site of every fixture and of the real
binaries the tests use, what `check` predicts (its outcome column) is what `rewrite` (default
options, verification on) decides:

- optimizable as it is -> left as it is (`site-already-5-byte`);
- in place -> in place; forward or backward -> a detour (or moved along in another site's);
- blocked by CODE -> skipped with CODE; not applicable -> skipped.

Before, check promised "in place" to combo10 and nop10 sites that rewrite skipped, and to
the DTrace -G sites that rewrite moves together to one detour.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REAL_BINARIES, fixture_files
from usdtpatch import api
from usdtpatch.analysis.check import SiteCheck
from usdtpatch.errors import UnsupportedError


def _predicted(s: SiteCheck) -> tuple[str, str | None]:
    if s.outcome == "optimizable":
        return "skipped", "site-already-5-byte"
    if s.outcome == "in-place":
        return "in-place", None
    if s.outcome in ("forward", "backward"):
        return "detour", None
    if s.outcome == "blocked":
        return "skipped", s.blocked
    return "skipped", "*"  # not applicable: any reason


# non-default rewrite options check is given too (each with rewrite --no-verify: check does
# not run the emulator; the defaults are compared with verification on)
OPTIONS: dict[str, dict[str, Any]] = {
    "combo10": {"form": "combo10"}, "combo5": {"form": "combo5"},
    "guard-always": {"redzone_guard": "always"}, "guard-never": {"redzone_guard": "never"},
    "calls-emulate": {"calls": "emulate"}, "calls-move": {"calls": "move"},
}


def _mismatches(path: Path, options: dict[str, Any] | None = None) -> list[str]:
    opts = options or {}
    rep = api.check(path, **opts).report
    try:
        plan = api.rewrite_plan(path, fork_guard="never", verify=not opts, **opts)
    except UnsupportedError:
        # not x86-64 ELF64: rewrite refuses the file; check promises no rewrite there
        return [f"{path.name} {s.probe.probe_id}: check {s.outcome}" for s in rep.sites
                if s.outcome in ("in-place", "forward", "backward")]
    decided = {d.probe.index: d for d in plan.sites}
    out = []
    for s in rep.sites:
        d = decided[s.probe.index]
        action = "detour" if d.action.value == "moved" else d.action.value
        want = _predicted(s)
        if want == ("skipped", "*") and action == "skipped":
            continue
        if (action, d.code) != want:
            out.append(f"{path.name} {s.probe.probe_id} {s.probe.address:#x}: check {want}, "
                       f"rewrite {(action, d.code)} {d.reason}")
    return out


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.name)
def test_check_predicts_rewrite_on_fixtures(path: Path) -> None:
    assert _mismatches(path) == []


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_check_predicts_rewrite_with_other_options(name: str) -> None:
    """Every fixture, with each non-default option."""
    assert [m for p in fixture_files() for m in _mismatches(p, OPTIONS[name])] == []


def refusal_mismatch(path: Path, fork_guard: str = "auto") -> str | None:
    """Whether check's `fork-guard-unavailable` and rewrite's refusal of the file (decided in
    the plan) disagree: what they say, or None."""
    said = [f.message for f in api.check(path, fork_guard=fork_guard).report.findings
            if f.code == "fork-guard-unavailable"]
    try:
        refusal = api.rewrite_plan(path, verify=False, fork_guard=fork_guard).fork_refusal
    except UnsupportedError:
        return None
    if bool(said) != (refusal is not None):
        return f"{path.name}: check {said}, rewrite {refusal}"
    return None


@pytest.mark.parametrize("fork_guard", ["auto", "always"])
def test_check_predicts_the_fork_guard_refusal_on_fixtures(fork_guard: str) -> None:
    assert [m for p in fixture_files() if (m := refusal_mismatch(p, fork_guard))] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_BINARIES))
def test_check_predicts_rewrite_on_real_binaries(name: str) -> None:
    path = REAL_BINARIES[name]
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    assert _mismatches(path) == []
