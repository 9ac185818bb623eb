"""The findings of a built rewrite (usdtpatch.rewriter.build.output_findings): the input's
`process-can-fork` hazard is left out where the output carries the fork guard, and kept where
it does not. Every way to build a rewrite reports the same: usdtpatch.api.rewrite and the
bytes-in, bytes-out usdtpatch.rewriter.apply.rewrite_image."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import fixture
from usdtpatch import api
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.marker import marker_of
from usdtpatch.findings import FORK_GUARDED, PROCESS_CAN_FORK, Finding
from usdtpatch.rewriter.apply import rewrite_image
from usdtpatch.rewriter.build import Built, build_rewrite, output_findings
from usdtpatch.rewriter.forms import ForkGuard, Form
from usdtpatch.rewriter.plan import RewritePlan, plan_rewrite


def _codes(found: tuple[Finding, ...]) -> list[str]:
    return [f.code for f in found]


def _fork_plan(fork_guard: ForkGuard = ForkGuard.AUTO) -> RewritePlan:
    image = parse_elf(fixture("fork").read_bytes())
    plan = plan_rewrite(image, form=Form.NOP5, fork_guard=fork_guard, verify=None)
    # the input's hazard, so that the tests below cannot pass by its absence
    assert PROCESS_CAN_FORK.code in _codes(plan.findings)
    return plan


def test_rewrite_image_drops_the_covered_fork_hazard() -> None:
    res = rewrite_image(parse_elf(fixture("fork").read_bytes()), Form.NOP5, verify=None)
    assert res.data is not None
    doc = marker_of(parse_elf(res.data))
    assert doc is not None and doc.get("fork_guard")  # the output carries the guard
    codes = _codes(res.findings)
    assert FORK_GUARDED.code in codes
    assert PROCESS_CAN_FORK.code not in codes


def test_rewrite_image_keeps_the_hazard_without_the_guard() -> None:
    res = rewrite_image(parse_elf(fixture("fork").read_bytes()), Form.NOP5, verify=None,
                        fork_guard=ForkGuard.NEVER)
    codes = _codes(res.findings)
    assert PROCESS_CAN_FORK.code in codes
    assert FORK_GUARDED.code not in codes


@pytest.mark.parametrize("name", ["fork", "nofork", "libprobes.so", "retarget-pie"])
@pytest.mark.parametrize("fork_guard", ["auto", "never"])
def test_api_and_rewrite_image_report_the_same(tmp_path: Path, name: str,
                                              fork_guard: str) -> None:
    src = fixture(name)
    got = api.rewrite(src, tmp_path / "out", form="nop5", verify=False, fork_guard=fork_guard)
    res = rewrite_image(parse_elf(src.read_bytes()), Form.NOP5, verify=None,
                        fork_guard=ForkGuard(fork_guard))
    assert [f.to_json() for f in got.findings] == [f.to_json() for f in res.findings]
    if res.data is not None:
        assert (tmp_path / "out").read_bytes() == res.data


def test_output_findings_follow_the_built_file() -> None:
    plan = _fork_plan()
    built = build_rewrite(plan)
    assert built.fork_guarded
    said = output_findings(plan, built)
    assert PROCESS_CAN_FORK.code not in _codes(said)
    # everything else is kept, in order: the plan's, then the builder's
    assert said == tuple(f for f in plan.findings + built.findings
                         if f.code != PROCESS_CAN_FORK.code)
    unguarded = Built(built.data, (), fork_guarded=False)
    assert output_findings(plan, unguarded) == plan.findings


def test_an_unguarded_build_keeps_the_hazard() -> None:
    """A file the rewrite changes without adding the guard (--fork-guard never), said to
    fork: the output still forks with optimized sites, so the hazard stays."""
    image = parse_elf(fixture("pie").read_bytes())
    plan = plan_rewrite(image, form=Form.NOP5, fork_guard=ForkGuard.NEVER, verify=None)
    assert plan.changed
    hazard = PROCESS_CAN_FORK.finding("it calls fork")
    plan = replace(plan, findings=(*plan.findings, hazard))
    built = build_rewrite(plan)
    assert not built.fork_guarded
    assert hazard in output_findings(plan, built)
