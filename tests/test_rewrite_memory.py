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
from usdtpatch import api, jsondoc
from usdtpatch.elf import validate as validate_mod
from usdtpatch.elf.image import ElfImage
from usdtpatch.elf.marker import MARKER_OWNER, MARKER_TYPE, marker_note
from usdtpatch.elf.notes import make_note
from usdtpatch.rewriter.build import build_rewrite
from usdtpatch.rewriter.plan import RewritePlan


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


def test_the_plan_keeps_each_distinct_unwind_row_once() -> None:
    plan = api.rewrite_plan(fixture("demo"), verify=False)
    rows = [r for u in plan.unwind for _, r in u.rows]
    assert len(plan.unwind) == 4 and len(rows) > len(set(rows))  # the detours share rows
    assert len({id(r) for r in rows}) == len(set(rows))


PROBES = 2000  # a generated library (bench/synthetic_asm.py): ~4 s for both tests


@pytest.fixture(scope="module")
def synthetic_plan(tmp_path_factory: pytest.TempPathFactory) -> RewritePlan:
    lib = build(tmp_path_factory.mktemp("memory"), PROBES)
    plan = api.rewrite_plan(lib, verify=False, fork_guard="never", form="nop5")
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
