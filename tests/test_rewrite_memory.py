"""What rewrite holds at its peak (issue 38, rewrite's memory): jsondoc.nesting (the depth
bound read before every marker and plan is parsed) holds no memory that grows with the
document's strings (the output check of a 10,000-site rewrite read the marker's
480,000-character string with ~65 MB); the plan is gone when the output check runs."""

from __future__ import annotations

import gc
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.synthetic_asm import build
from tests.helpers import fixture
from usdtpatch import api, jsondoc
from usdtpatch.analysis.targets import CodeContext
from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.elf import validate as validate_mod
from usdtpatch.elf.cfi import load_cfi
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.rewriter import build as build_mod
from usdtpatch.rewriter import plan as plan_mod
from usdtpatch.rewriter.build import build_rewrite
from usdtpatch.rewriter.plan import Action, RewritePlan, SiteDecision, WindowSpan


def _former(data: bytes) -> int:
    """The definition as it was: the strings cut out, then the brackets counted."""
    depth = deepest = 0
    for m in re.finditer(rb"[\[\]{}]", re.sub(rb'"(?:[^"\\]|\\.)*"', b"", data, flags=re.DOTALL)):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def test_nesting_of_a_long_string_and_many_strings_holds_no_copy() -> None:
    doc = (b'{"notes": "' + b"0a" * 250_000 + b'", "sites": [' +
           b", ".join(b'{"probe": "p%d", "reason": "x[y]"}' % i for i in range(20_000)) + b"]}")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        depth = jsondoc.nesting(doc)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert depth == 3
    assert peak < 100_000, f"{peak} bytes held reading {len(doc)} bytes"


@given(st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"a", b"\n", b",", b'\\"',
                                 b"\\\\", b'"[{"', b"\\["]), max_size=40).map(b"".join))
def test_nesting_counts_the_brackets_outside_strings_as_before(data: bytes) -> None:
    assert jsondoc.nesting(data) == _former(data)


def test_the_plan_is_gone_when_the_output_is_checked(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    validate = validate_mod.validate_output

    def counting(data: bytes, original: ElfImage | None = None) -> None:
        gc.collect()
        seen.append(sum(isinstance(o, RewritePlan) for o in gc.get_objects()))
        validate(data, original)

    monkeypatch.setattr(validate_mod, "validate_output", counting)
    out = api.rewrite(fixture("demo"), tmp_path / "out", verify=False)
    assert out.changed and out.sites
    assert seen == [0]


def test_the_checks_context_is_gone_when_the_output_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's context (each site's function, FDE and index entries, kept for the fork
    guard's questions) is let go once the plan is made: the build reads none of it."""
    seen: list[int] = []
    build = build_mod.build_rewrite

    def counting(plan: RewritePlan, keep_build_id: bool = False) -> bytes:
        gc.collect()
        seen.append(sum(isinstance(o, CodeContext) for o in gc.get_objects()))
        return build(plan, keep_build_id)

    monkeypatch.setattr(build_mod, "build_rewrite", counting)
    out = api.rewrite(fixture("demo"), tmp_path / "out", verify=False)
    assert out.changed and seen == [0]


def test_the_output_check_reads_the_markers_sites_as_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[Any] = []
    loads = jsondoc.loads

    def keeping(data: bytes | str, object_hook: Any = None) -> Any:
        read.append(loads(data, object_hook) if object_hook is not None else loads(data))
        return read[-1]

    monkeypatch.setattr(jsondoc, "loads", keeping)
    out = api.rewrite(fixture("demo"), tmp_path / "out", verify=False)
    assert out.changed and len(read) == 1
    assert read[0]["sites"] == [None] * len(out.sites) and read[0]["patches"]


def test_the_plan_holds_each_detours_unwind_as_its_frame_program() -> None:
    """A detour's unwind entry is its bounds and call frame instructions (a few bytes), not
    its rows or the Detour: the program is what the output's FDE carries."""
    plan = api.rewrite_plan(fixture("demo"), verify=False)
    detours = {s.detour.address: s.detour for s in plan.sites if s.detour is not None}
    assert len(plan.unwind) == 4
    for u in plan.unwind:
        assert u.end == detours[u.start].end and isinstance(u.program, bytes) and u.program
        assert {type(getattr(u, f)) for f in u.__slots__} <= {int, bytes, type(None)}
    out = parse_elf(build_rewrite(plan))
    cfi = load_cfi(out)
    for u in plan.unwind:
        fde = cfi.lookup(u.start)
        assert fde is not None and (fde.pc_begin, fde.pc_end) == (u.start, u.end)
        assert fde.instructions.startswith(u.program)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated shared library of 400 probes, each in its own function (bench/)."""
    return build(tmp_path_factory.mktemp("synthetic"), 400)


def test_the_plan_for_the_output_holds_no_window_past_its_site(
        library: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rewrite's plan (windows=False) lets go of each check window once the walk has passed
    its site, and its decisions keep the spans only: the windows alive fall as the walk
    decides 400 sites (they stayed 400: the check's, then the decisions'), and the output is
    the bytes of the plan that keeps every window."""
    alive: list[int] = []
    decide = plan_mod._decide_site

    def counting(inputs: Any, seg: Any, order: list[Any], n: int) -> list[SiteDecision]:
        if n % 50 == 0:
            gc.collect()
            alive.append(sum(isinstance(o, PatchWindow) for o in gc.get_objects()))
        return decide(inputs, seg, order, n)

    monkeypatch.setattr(plan_mod, "_decide_site", counting)
    out = api.rewrite_bytes(library, library.parent / "out.so", verify=False,
                            fork_guard="never", form="nop5")
    monkeypatch.undo()
    assert len(alive) == 8 and alive == sorted(alive, reverse=True) and alive[-1] < 80, alive
    assert sum(s.action is not Action.SKIPPED for s in out.outcome.sites) == 400
    assert all(s.window is None and s.span is not None for s in out.outcome.sites)
    whole = api.rewrite_plan(library, verify=False, fork_guard="never", form="nop5")
    assert all(s.window is not None and s.span == WindowSpan.of(s.window) for s in whole.sites)
    assert build_rewrite(whole) == out.data
