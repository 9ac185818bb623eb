"""Golden files of every fixture's rewrite decisions (tests/golden/decisions-NAME.txt).

One line per probe: what the rewrite does to its site (action, skip code), where the note's
pc goes, whether the red-zone guard wraps it; files the rewriter refuses record the refusal.
A fixture that silently stops being rewritten (or starts being skipped for another reason)
changes its golden file and fails here. Regenerate with USDTPATCH_UPDATE_GOLDEN=1 and review
the diff.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.golden import check_golden
from tests.helpers import fixture_files
from usdtpatch import api
from usdtpatch.errors import UsdtpatchError
from usdtpatch.rewriter.plan import Action, RewritePlan, Status

FIXTURES = fixture_files()


def render(plan: RewritePlan) -> str:
    counts = {s.value: sum(1 for d in plan.sites if d.status is s) for s in Status}
    lines = [f"form {plan.form.value}, guard {plan.guard.value}, verified {plan.verified}: "
             f"{len(plan.sites)} site(s), " + ", ".join(f"{n} {k}" for k, n in counts.items())
             + f"; changes the file: {plan.changed}"]
    for d in plan.sites:
        # where the note's pc goes, independent of where the new segment is placed
        if d.new_pc is None:
            where = "pc stays"
        elif d.detour is not None:
            where = f"pc -> detour+{d.new_pc - d.detour.address:#x} ({len(d.detour.code)} bytes)"
        else:
            where = f"pc -> site+{d.new_pc - d.probe.address:#x}"
        window = "" if d.window is None else \
            f" window {d.window.start:#x}-{d.window.end:#x} {d.window.shape.value}"
        lines.append(f"{d.probe.probe_id} {d.probe.address:#x} {d.action.value}"
                     f"{f' [{d.code}]' if d.code else ''}{window} {where}"
                     f"{' guarded' if d.guarded else ''}"
                     f"{f' calls {d.calls}' if d.calls else ''}"
                     + "".join(f"; {w}" for w in d.retargeted))
    return "\n".join(lines) + "\n"


def decisions(path: Path) -> str:
    try:
        plan = api.rewrite_plan(path)
    except UsdtpatchError as exc:
        return f"refused: {exc.detail(str(path))}\n"  # the library names the file
    return render(plan)


@pytest.mark.skipif(not FIXTURES, reason="fixtures/bin holds no fixtures yet")
@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_decisions_match_golden(path: Path) -> None:
    check_golden(f"decisions-{path.name}.txt", decisions(path))


def test_golden_files_do_not_pass_vacuously() -> None:
    """The fixtures made to be rewritten have sites rewritten in their golden file."""
    for name in ("demo", "pie", "branch-after", "padded", "dtrace-G5", "redzone-leaf"):
        text = (Path(__file__).parent / "golden" / f"decisions-{name}.txt").read_text()
        assert any(f" {a.value} " in line for line in text.splitlines()[1:]
                   for a in (Action.DETOUR, Action.IN_PLACE)), name


def test_a_fixture_that_stops_being_rewritten_fails() -> None:
    """The rendering tells a rewritten site from a skipped one (so the golden test can fail)."""
    plan = api.rewrite_plan(FIXTURES[0].parent / "demo")
    skipped = tuple(replace(d, action=Action.SKIPPED, code="no-patch-window", new_pc=None,
                            detour=None) for d in plan.sites)
    assert render(replace(plan, sites=skipped)) != render(plan)
