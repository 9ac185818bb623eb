"""The findings of a rewrite are decided in its plan (usdtpatch.rewriter.plan), so that
`rewrite --dry-run` says what the real run does: the fork guard the output carries
(`fork-guarded`, and the input's `process-can-fork` hazard left out where it covers it), the
detours' symbols left out; the builder (usdtpatch.rewriter.build) adds none."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import fixture
from usdtpatch import api
from usdtpatch.analysis.check import check
from usdtpatch.analysis.forms import ForkGuard, Form
from usdtpatch.analysis.probes import read_probes
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.marker import marker_of
from usdtpatch.findings import DETOUR_SYMBOLS_LEFT_OUT, FORK_GUARDED, PROCESS_CAN_FORK, Finding
from usdtpatch.rewriter import plan as plan_module
from usdtpatch.rewriter.build import build_rewrite
from usdtpatch.rewriter.plan import plan_rewrite


def _codes(found: tuple[Finding, ...]) -> list[str]:
    return [f.code for f in found]


def test_the_plan_says_the_fork_guard_covers_the_hazard() -> None:
    image = parse_elf(fixture("fork").read_bytes())
    plan = plan_rewrite(image, form=Form.NOP5, verify=None)
    assert plan.fork_guard_code is not None
    codes = _codes(plan.findings)
    assert FORK_GUARDED.code in codes
    assert PROCESS_CAN_FORK.code not in codes
    doc = marker_of(parse_elf(build_rewrite(plan)))
    assert doc is not None and doc.get("fork_guard")  # the output carries the guard


def test_without_the_guard_the_plan_keeps_the_hazard() -> None:
    image = parse_elf(fixture("fork").read_bytes())
    plan = plan_rewrite(image, form=Form.NOP5, fork_guard=ForkGuard.NEVER, verify=None)
    assert not plan.changed and plan.fork_guard_code is None  # its sites are nop5 already
    codes = _codes(plan.findings)
    assert PROCESS_CAN_FORK.code in codes
    assert FORK_GUARDED.code not in codes


def test_an_unguarded_rewrite_keeps_the_hazard() -> None:
    """A file the rewrite changes without adding the guard (--fork-guard never), said to
    fork: the output still forks with optimized sites, so the hazard stays."""
    image = parse_elf(fixture("pie").read_bytes())
    rep = check(read_probes(image))
    hazard = PROCESS_CAN_FORK.finding("it calls fork")
    plan = plan_rewrite(image, form=Form.NOP5, fork_guard=ForkGuard.NEVER, verify=None,
                        report=replace(rep, findings=(*rep.findings, hazard)))
    assert plan.changed and plan.fork_guard_code is None
    assert hazard in plan.findings
    doc = marker_of(parse_elf(build_rewrite(plan)))
    assert doc is not None and "fork_guard" not in doc


@pytest.mark.parametrize("name", ["fork", "nofork", "libprobes.so", "retarget-pie", "nop5"])
@pytest.mark.parametrize("fork_guard", ["auto", "never", "always"])
def test_a_dry_run_reports_what_the_real_run_does(tmp_path: Path, name: str,
                                                  fork_guard: str) -> None:
    """The same sites and findings with and without an output (before, the dry run of a file
    that may fork said `process-can-fork` where the real run said `fork-guarded`), and the
    output is the plan's, built."""
    src = fixture(name)
    real = api.rewrite(src, tmp_path / "out", form="nop5", verify=False,
                       fork_guard=fork_guard)
    dry = api.rewrite(src, form="nop5", verify=False, fork_guard=fork_guard)
    assert [f.to_json() for f in dry.findings] == [f.to_json() for f in real.findings]
    assert dry.sites == real.sites
    plan = plan_rewrite(parse_elf(src.read_bytes()), form=Form.NOP5, verify=None,
                        fork_guard=ForkGuard(fork_guard))
    if plan.changed:
        assert (tmp_path / "out").read_bytes() == build_rewrite(plan)


def test_symbols_left_out_is_the_plans_decision(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A `.symtab` that cannot grow in place and is too big to copy: the plan says the
    detours go without symbols (the dry run says so too), and the output's table is the
    input's."""
    monkeypatch.setattr(plan_module, "symtab_in_place", lambda *_a: None)
    monkeypatch.setattr(plan_module, "SYMTAB_COPY_FLOOR", 0)
    src = fixture("demo")
    dry = api.rewrite(src, form="nop5", verify=False)
    assert DETOUR_SYMBOLS_LEFT_OUT.code in _codes(dry.findings)
    plan = plan_rewrite(parse_elf(src.read_bytes()), form=Form.NOP5, verify=None)
    assert plan.symbols is not None and plan.symbols.left_out is not None
    assert plan.symbols.symbols  # the detours' names are still decided (DWARF uses them)
    out = parse_elf(build_rewrite(plan))
    image = parse_elf(src.read_bytes())
    old, new = image.section(".symtab"), out.section(".symtab")
    assert old is not None and new is not None
    assert out.section_data(new) == image.section_data(old)
