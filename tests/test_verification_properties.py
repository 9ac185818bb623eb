"""Properties of verification: every correct plan passes wherever the trampoline lands, every
other order of the kernel's writes is rejected, and plan/maps parsers only ever raise
InputError on bad documents."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import fixture
from usdtpatch.api import load
from usdtpatch.errors import InputError
from usdtpatch.report.plan import plan_json
from usdtpatch.sequences.plan import build_plan, plan_from_json, with_site
from usdtpatch.sequences.sequences import Sequence, build_sequence
from usdtpatch.sequences.trampoline import parse_maps
from usdtpatch.verification.plans import FAIL, PASS, verify_plan

BASE = 0x555555554000
PS = load(str(fixture("nop5")))
IMAGE = PS.image
FILE_END = BASE + 0x5000  # the nop5 fixture's mappings end below this


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page=st.one_of(st.integers(min_value=(BASE - (1 << 31)) // 4096 + 2,
                                  max_value=BASE // 4096 - 1),
                      st.integers(min_value=FILE_END // 4096,
                                  max_value=(BASE + (1 << 31)) // 4096 - 2)))
def test_correct_plan_passes_for_any_reachable_trampoline(page: int) -> None:
    plan = build_plan(PS, "nop5", "nop5", BASE, trampoline=page * 4096)
    rep = verify_plan(plan, IMAGE)
    assert [v.status for v in rep.verdicts] == [PASS] * len(plan.sites), \
        [v.codes for v in rep.verdicts]


def _reordered(seq: Sequence, order: tuple[int, ...]) -> Sequence:
    steps = [seq.steps[i] for i in order]
    return build_sequence(seq.name, seq.address, seq.start,
                          [(s.offset, s.data, s.expect_byte0, s.what) for s in steps])


ORDERS = [o for o in itertools.permutations(range(3)) if o != (0, 1, 2)]


@pytest.mark.parametrize("which", ["optimize", "unoptimize"])
@pytest.mark.parametrize("order", ORDERS, ids=[",".join(map(str, o)) for o in ORDERS])
def test_every_other_order_is_rejected(which: str, order: tuple[int, ...]) -> None:
    plan = build_plan(PS, "nop5", "nop5", BASE)
    site = plan.sites[0]
    s = site.sequences
    assert s is not None and s.optimize is not None and s.unoptimize is not None
    if which == "optimize":
        opt = _reordered(s.optimize, order)
        bad = replace(s, optimize=opt, unoptimize=replace(s.unoptimize, start=opt.end))
    else:
        bad = replace(s, unoptimize=_reordered(s.unoptimize, order))
    v = verify_plan(with_site(plan, 0, replace(site, sequences=bad)), IMAGE).verdicts[0]
    assert v.status == FAIL


DOC = plan_json(build_plan(PS, "nop5", "nop5", BASE))
INTS = st.integers() | st.sampled_from([-4096, -1, 0, 4096, 1 << 63, (1 << 64) - 4096, 1 << 64,
                                          0x555555553000, 0x555555555000])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | INTS | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


PATHS = [p for p in _paths(DOC) if p]


@settings(max_examples=200, deadline=None)
@given(path=st.sampled_from(PATHS), value=JSON_VALUES)
def test_plan_reader_raises_only_input_error(path: tuple[Any, ...], value: Any) -> None:
    doc = json.loads(json.dumps(DOC))
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    try:
        plan = plan_from_json(doc, "p.json")
    except InputError as exc:
        assert str(exc).startswith("p.json: ")
        return
    verify_plan(plan, IMAGE)  # whatever it says, it must not raise


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_maps_parser_raises_only_input_error(text: str) -> None:
    try:
        maps = parse_maps(text)
    except InputError:
        return
    assert all(m.end > m.start for m in maps)
