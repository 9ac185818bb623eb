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

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REAL_BINARIES, ROOT, fixture_files, run_cli
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
        # the window check shows (its per-site text, its JSON) is the one rewrite used, with
        # its shape: before, a NOP run moved to a guarded detour showed "in place (0 jumps)"
        said = s.window.window if s.window is not None and action != "skipped" else None
        if said is not None and d.window is not None and \
                (said.shape, said.start) != (d.window.shape, d.window.start):
            out.append(f"{path.name} {s.probe.probe_id}: check's window {said.shape.value} "
                       f"[{said.start:#x}, {said.end:#x}), rewrite's {d.window.shape.value} "
                       f"[{d.window.start:#x}, {d.window.end:#x})")
        if said is not None and (s.outcome == "in-place") != (said.shape.value in (
                "in-place", "re-laid")):
            out.append(f"{path.name} {s.probe.probe_id}: check's outcome {s.outcome}, its "
                       f"window {said.shape.value}")
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
    assert _mismatches(_real(name)) == []


def _real(name: str) -> Path:
    path = REAL_BINARIES[name]
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    return path


@pytest.fixture(scope="module")
def trywin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    exe = tmp_path_factory.mktemp("trywin") / "cxx-trywin"
    subprocess.run(["g++", "-O2", str(ROOT / "tests" / "data" / "cxx-trywin.cc"), "-o",
                    str(exe)], check=True)
    return exe


@pytest.mark.parametrize("name", ["default", *sorted(OPTIONS)])
def test_calls_in_try_regions(trywin: Path, name: str, tmp_path: Path) -> None:
    """A window holding a call in a try region: check says what rewrite does, with every
    option (with --calls move, t1's call moves with the detour's own LSDA: its call-site
    entry starts before the window, which the trial build of that LSDA once took for a
    table it could not build, window-call-unwind); the rewritten program runs as the
    original, throws included."""
    opts = OPTIONS.get(name, {})
    assert _mismatches(trywin, opts) == []
    t1 = next(s for s in api.check(trywin, **opts).report.sites if s.probe.name == "t1")
    if name == "calls-move":
        assert t1.outcome == "forward", t1.blocked
        out = tmp_path / "out"
        assert run_cli("rewrite", trywin, "-o", out, "--form", "nop5", "--calls", "move").rc == 0
        runs = [subprocess.run([str(p), "4"], capture_output=True, text=True, timeout=30,
                               check=True).stdout for p in (trywin, out)]
        assert runs[0] == runs[1] and "-1 -2 -3" in runs[0]
    elif name == "default":
        assert t1.outcome == "forward" and t1.window is not None and t1.window.window
        assert t1.window.window.calls
        out = tmp_path / "out"
        assert run_cli("rewrite", trywin, "-o", out, "--form", "nop5").rc == 0
        runs = [subprocess.run([str(p), "4"], capture_output=True, text=True, timeout=30,
                               check=True).stdout for p in (trywin, out)]
        assert runs[0] == runs[1] and "-1 -2 -3" in runs[0]


_TEXT_OF = {"in-place": ("in place ", "re-laid "), "forward": ("forward ",),
            "backward": ("backward ",)}


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.name)
@pytest.mark.parametrize("guard", ["auto", "always"])
def test_check_site_text_summary_and_json_agree(path: Path, guard: str) -> None:
    _agree(path, guard)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_BINARIES))
def test_check_site_text_summary_and_json_agree_on_real_binaries(name: str) -> None:
    _agree(_real(name), "auto")


def _agree(path: Path, guard: str) -> None:
    """One decision behind every rendering of a site (issue 30, class 8): check's per-site
    text (plain and terminal tables share report.plain.outcome_text), the summary's counts
    and the JSON's outcome and window shape say the same. Before, a NOP run the red-zone
    guard moves to a detour was "in place (0 jumps)" in the table, forward in the summary."""
    from usdtpatch.report.checkjson import result_json
    from usdtpatch.report.plain import outcome_text

    doc = result_json(api.check(path, redzone_guard=guard))
    counted = {"in-place": 0, "forward": 0, "backward": 0}
    for s in doc["sites"]:
        text = outcome_text(s)
        if s["outcome"] in _TEXT_OF:
            counted[s["outcome"]] += 1
            assert text.startswith(_TEXT_OF[s["outcome"]]), (s["name"], s["outcome"], text)
            shape = s["window"]["shape"]
            assert (shape in ("in-place", "re-laid")) == (s["outcome"] == "in-place"), \
                (s["name"], s["outcome"], shape)
            assert ("(0 jumps)" in text) == (s["outcome"] == "in-place"), (s["name"], text)
    after = doc["summary"]["after_rewrite"]
    assert counted == {"in-place": after["in_place"], "forward": after["forward"],
                       "backward": after["backward"]}
