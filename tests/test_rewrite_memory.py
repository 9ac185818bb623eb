"""What rewrite holds at its peak (issue 38, rewrite's memory): jsondoc.nesting (the depth
bound read before every marker and plan is parsed) holds no memory that grows with the
document's strings (the output check of a 10,000-site rewrite read the marker's
480,000-character string with ~65 MB); the plan is gone when the output check runs; the
build holds the output once and little else (a dict per site for the marker, the file
joined from pieces and copied again for a moved build-id: ~1.9 KB a probe over the
output), and the output check reads the marker, the notes and the recipe's bytes where
they lie (~1.3 KB a probe before)."""

from __future__ import annotations

import gc
import json
import re
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.synthetic_asm import build
from tests.helpers import fixture
from usdtpatch import api, heap, jsondoc
from usdtpatch.analysis.probes import read_probes
from usdtpatch.analysis.targets import CodeContext
from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.elf import validate as validate_mod
from usdtpatch.elf.cfi import load_cfi
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.elf.marker import MARKER_OWNER, MARKER_TYPE, marker_note
from usdtpatch.elf.notes import make_note
from usdtpatch.elf.symbols import load_symbols
from usdtpatch.rewriter import build as build_mod
from usdtpatch.rewriter import plan as plan_mod
from usdtpatch.rewriter.build import build_rewrite
from usdtpatch.rewriter.plan import Action, RewritePlan, WindowSpan


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


PROBES = 2000  # a generated library (bench/synthetic_asm.py): ~4 s for the tests below


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated shared library of PROBES probes, each in its own function."""
    return build(tmp_path_factory.mktemp("memory"), PROBES)


def test_the_plan_for_the_output_holds_no_window_past_its_site(
        library: Path) -> None:
    """rewrite's plan (windows=False) is made during the check's walk: each site is decided
    once the check has settled the sites after it, and its window is let go once the walk
    has passed it; its decisions keep the spans only. The windows alive stay a stretch of
    the file's all along (the check made all PROBES first, then the plan let them go), and
    the output is the bytes of the plan that keeps every window."""
    alive: list[int] = []

    def counting(n: int, _total: int) -> None:  # as each site's decision starts
        if n % (PROBES // 8) == 0:
            gc.collect()
            alive.append(sum(isinstance(o, PatchWindow) for o in gc.get_objects()))

    out = api.rewrite_bytes(library, library.parent / "out.so", verify=False,
                            fork_guard="never", form="nop5", progress=counting)
    assert len(alive) == 8 and max(alive) < 120, alive  # 16-byte functions: ~60 in 1 KiB
    assert sum(s.action is not Action.SKIPPED for s in out.outcome.sites) == PROBES
    assert all(s.window is None and s.span is not None for s in out.outcome.sites)
    whole = api.rewrite_plan(library, verify=False, fork_guard="never", form="nop5")
    assert all(s.window is not None and s.span == WindowSpan.of(s.window) for s in whole.sites)
    assert build_rewrite(whole) == out.data


def test_a_decision_that_would_read_a_site_not_yet_checked_is_refused(
        library: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan decides a site during the check's walk only once every site its decision
    may read is there (plan.REACH bytes after it): with no reach, the first window that may
    join the next site's stops the plan (AssertionError), rather than deciding without it."""
    monkeypatch.setattr(plan_mod, "REACH", 0)
    with pytest.raises(AssertionError, match="not given yet"):
        plan_mod.plan_rewrite(parse_elf(library.read_bytes()), verify=None, windows=False)


def test_a_site_forgotten_by_the_context_is_worked_out_again_the_same(library: Path) -> None:
    """CodeContext.forget_site lets go of a site's function bounds, and of its FDE once no
    kept site holds it; asked again, the bounds are equal to those first worked out."""
    image = parse_elf(library.read_bytes())
    cfi = load_cfi(image)
    probes = read_probes(image)
    ctx = CodeContext(image, cfi, probes.symbols if probes.symbols is not None
                      else load_symbols(image))
    a, b = (p.address for p in probes.probes[:2])
    first = ctx.bounds(a)
    assert first is not None and first.fde is not None and not first.contains(b)
    inside = first.start + (a - first.start + 1) % (first.end - first.start)  # a 2nd address
    assert ctx.bounds(inside) == first and first.fde.address in cfi._kept
    ctx.forget_site(a)
    assert first.fde.address in cfi._kept  # `inside` still holds it
    ctx.forget_site(inside)
    assert first.fde.address not in cfi._kept and a not in ctx._bounds
    again = ctx.bounds(a)
    assert again == first and again is not first


def test_the_heaps_free_pages_are_given_back() -> None:
    """usdtpatch.heap.give_back returns the C library heap's free pages: freed blocks below
    a live one stay resident until it is called."""
    if heap.malloc_trim() is None:
        pytest.skip("this C library has no malloc_trim (give_back leaves the pages)")
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    blocks: list[bytes] = []  # ~50 MB from malloc (over 512 bytes: not CPython's arenas)
    pins: list[bytes] = []  # a live block after every 64 freed ones: the freed runs (128 KB)
    for i in range(25_000):  # stay inside the heap, which trims by itself only its top
        blocks.append(bytes(2000) + bytes([i % 256]))
        if i % 64 == 63:
            pins.append(bytes(1000) + bytes([i % 256]))
    before = rss()
    del blocks
    freed = rss()
    heap.give_back()
    after = rss()
    assert pins and freed > before - 10_000_000, (before, freed)  # kept by the heap
    assert after < freed - 30_000_000, (before, freed, after)


@pytest.fixture(scope="module")
def synthetic_plan(library: Path) -> RewritePlan:
    plan = api.rewrite_plan(library, verify=False, fork_guard="never", form="nop5")
    assert plan.changed and len(plan.sites) == PROBES
    return plan


def _traced_peak(run: Any) -> tuple[Any, int]:
    """run()'s value and the peak of the memory it allocated (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        got = run()
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return got, peak


def test_the_build_holds_the_output_once(synthetic_plan: RewritePlan) -> None:
    # at most the output and 800 bytes a probe (its new tables and the rest, ~430 bytes a
    # probe); before: 1,865 bytes a probe over the output (3.9 times the output)
    out, peak = _traced_peak(lambda: build_rewrite(synthetic_plan))
    over = (peak - len(out)) / PROBES
    assert over < 800, f"the build's peak: {peak} bytes, {over:.0f} a probe over the output"


def test_the_output_check_reads_the_output_where_it_lies(synthetic_plan: RewritePlan) -> None:
    out = build_rewrite(synthetic_plan)
    validate_mod.validate_output(out, synthetic_plan.image)  # its imports, once
    _none, peak = _traced_peak(lambda: validate_mod.validate_output(out, synthetic_plan.image))
    # ~490 bytes a probe; before: 1,330 (three copies of the marker, the notes of both files
    # at once, the recipe's bytes copied)
    assert peak / PROBES < 700, f"the output check's peak: {peak} bytes"


def _again(items: list[Any]) -> Callable[[], Iterator[Any]]:
    """The items anew at each call (MarkerNote encodes its arrays twice)."""
    return lambda: iter(items)


@pytest.mark.parametrize("doc", [
    {"tool": "usdtpatch", "build_id": None, "cut": [1, 2], "fork_guard": {"z": 1, "a": [True]}},
    {"elf_header": "7f454c46", "reason": "caf\u00e9 \"quoted\"\n\\", "n": -3},
    {},
])
def test_the_marker_is_the_json_of_the_whole_document(doc: dict[str, object]) -> None:
    sites = [{"probe": f"p:{i}\u2603", "address": i, "action": "detour", "new_pc": None,
              "guarded": i % 2 == 0, "reason": None if i else "why \"not\"",
              "window": [i, i + 5]} for i in range(3)]
    every: list[dict[str, list[Any]]] = [{}, {"patches": [[64, "00ff"]], "sites": sites},
                                         {"sites": []}]
    for arrays in every:
        whole = {**doc, **arrays}
        text = json.dumps(whole, sort_keys=True, separators=(",", ":")).encode()
        want = make_note(MARKER_OWNER, MARKER_TYPE, text + b"\0" * (-len(text) % 4))
        assert marker_note(doc, {k: _again(v) for k, v in arrays.items()}) == want


def test_a_patch_given_as_text_in_pieces() -> None:
    from usdtpatch.elf.marker import Encoded

    def _hex_pair(data: bytes, off: int, n: int) -> Iterator[bytes]:  # as the build's
        yield b"[%d,\"" % off
        for at in range(off, off + n, 1 << 16):
            yield data[at : min(at + (1 << 16), off + n)].hex().encode()
        yield b"\"]"

    data = bytes(range(256)) * 600  # 150 KiB: three pieces of hex
    pairs = [(64, 5), (1000, len(data) - 1000)]
    doc = {"tool": "usdtpatch", "patches": [[o, data[o : o + n].hex()] for o, n in pairs]}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    want = make_note(MARKER_OWNER, MARKER_TYPE, text + b"\0" * (-len(text) % 4))
    got = marker_note({"tool": "usdtpatch"},
                      {"patches": lambda: (Encoded(_hex_pair(data, o, n)) for o, n in pairs)})
    assert got == want
