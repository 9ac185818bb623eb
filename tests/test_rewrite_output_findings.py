"""The findings of a rewrite are decided in its plan (usdtpatch.rewriter.plan), so that
`rewrite --dry-run` says what the real run does: the fork guard the output carries
(`fork-guarded`, and the input's `process-can-fork` hazard left out where it covers it), the
detours' symbols left out, their unwind tables left out (no PT_GNU_EH_FRAME: check says it
too, in the same words) and their DWARF left out (compressed or unreadable); the builder
(usdtpatch.rewriter.build) adds none. Before, the last two were silent."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import ROOT, build_programs, fixture
from usdtpatch import api
from usdtpatch.analysis.check import check
from usdtpatch.analysis.forms import ForkGuard, Form
from usdtpatch.analysis.probes import read_probes
from usdtpatch.elf.image import SHF_COMPRESSED, parse_elf
from usdtpatch.elf.marker import marker_of
from usdtpatch.findings import (
    DETOUR_DWARF_LEFT_OUT,
    DETOUR_SYMBOLS_LEFT_OUT,
    DETOUR_UNWIND_LEFT_OUT,
    FORK_GUARDED,
    PROCESS_CAN_FORK,
    WINDOW_LINE_ROW,
    Finding,
)
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


# fixtures/src/basic.c (the system's sys/sdt.h: 1-byte NOP sites, each moved to a detour)
LEFT_OUT_BUILDS = {
    "no-eh-frame-hdr": ("gcc", ["-O2", "-g0", "-Wl,--no-eh-frame-hdr"]),
    "eh-frame-hdr": ("gcc", ["-O2", "-g0"]),
    "dwarf": ("gcc", ["-O2", "-g"]),
    "dwarf-compressed": ("gcc", ["-O2", "-g", "-gz"]),
}


@pytest.fixture(scope="module")
def left_out(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    built = build_programs(tmp_path_factory.mktemp("left-out"),
                           (ROOT / "fixtures" / "src" / "basic.c").read_text(), LEFT_OUT_BUILDS)
    if len(built) != len(LEFT_OUT_BUILDS):
        pytest.skip("needs gcc")
    return built


def _rewrite_findings(path: Path, tmp_path: Path) -> dict[str, str]:
    """{code: message} of the rewrite of `path` (to tmp_path/out), the same in the dry run."""
    tmp_path.mkdir(exist_ok=True)
    real = api.rewrite(path, tmp_path / "out", verify=False)
    dry = api.rewrite(path, verify=False)
    assert [f.to_json() for f in dry.findings] == [f.to_json() for f in real.findings]
    assert any(s.action.value == "detour" for s in real.sites)
    return {f.code: f.message for f in real.findings}


@pytest.mark.needs_cc
def test_no_eh_frame_hdr_is_said_by_check_and_rewrite(left_out: dict[str, Path],
                                                      tmp_path: Path) -> None:
    exe = left_out["no-eh-frame-hdr"]
    said = _rewrite_findings(exe, tmp_path)
    assert "no PT_GNU_EH_FRAME" in said[DETOUR_UNWIND_LEFT_OUT.code], said
    out = parse_elf((tmp_path / "out").read_bytes())
    assert out.section(".usdtpatch.eh_frame") is None  # what it says: no rows were added
    predicted = {f.code: f.message for f in api.check(exe).findings}
    assert predicted[DETOUR_UNWIND_LEFT_OUT.code] == said[DETOUR_UNWIND_LEFT_OUT.code]
    # with the header: the rows are added, and neither says it
    said = _rewrite_findings(left_out["eh-frame-hdr"], tmp_path / "hdr")
    assert DETOUR_UNWIND_LEFT_OUT.code not in said
    assert DETOUR_UNWIND_LEFT_OUT.code not in _codes(api.check(left_out["eh-frame-hdr"]).findings)


def _cut_debug_info(src: Path, dst: Path) -> None:
    """A copy of `src` whose first .debug_info unit says it is longer than the section."""
    data = bytearray(src.read_bytes())
    sec = parse_elf(bytes(data)).section(".debug_info")
    assert sec is not None and sec.size > 16
    data[sec.offset:sec.offset + 4] = (sec.size + 0x100).to_bytes(4, "little")
    dst.write_bytes(bytes(data))


@pytest.mark.needs_cc
def test_dwarf_that_cannot_be_extended_is_said(left_out: dict[str, Path],
                                               tmp_path: Path) -> None:
    """zlib-compressed DWARF (gcc -gz) is read inflated and written again uncompressed: the
    detours get theirs. A .debug_info that cannot be read leaves the line rows inside the
    windows where they are: those windows are refused (`window-line-row`, issue 30), by
    check and rewrite alike, and the DWARF is the input's."""
    said = _rewrite_findings(left_out["dwarf-compressed"], tmp_path / "gz")
    assert DETOUR_DWARF_LEFT_OUT.code not in said
    out = parse_elf((tmp_path / "gz" / "out").read_bytes())
    for name in (".debug_info", ".debug_line"):
        sec = out.section(name)
        assert sec is not None and not sec.flags & SHF_COMPRESSED
    cut = tmp_path / "cut"
    _cut_debug_info(left_out["dwarf"], cut)
    real = api.rewrite(cut, tmp_path / "cut-out", verify=False)
    refused = [s for s in real.sites if s.code == WINDOW_LINE_ROW.code]
    assert refused and all("cannot be read" in s.reason for s in refused)
    predicted = {s.probe.index: s.blocked for s in api.check(cut).report.sites}
    assert all(predicted[s.probe.index] == WINDOW_LINE_ROW.code for s in refused)
    if (tmp_path / "cut-out").exists():
        out = parse_elf((tmp_path / "cut-out").read_bytes())
        # the unreadable .debug_info is the input's, not extended
        old, new = parse_elf(cut.read_bytes()).section(".debug_info"), out.section(".debug_info")
        assert old is not None and new is not None and new.size == old.size
    # readable DWARF is extended, and nothing says otherwise
    said = _rewrite_findings(left_out["dwarf"], tmp_path / "ok")
    assert DETOUR_DWARF_LEFT_OUT.code not in said
