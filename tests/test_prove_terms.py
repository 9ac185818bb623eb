"""The prover's terms made through z3's C API (usdtpatch.prove.smt's mk_ite, mk_eq,
mk_extract, mk_concat, mk_app, mk_and, mk_or, mk_val, mk_bin, mk_cmp; is_value, split_sum,
is_true_term, is_false_term, same_term, rlimit_count read them) are the terms
z3's Python operators make, made in the same order: the same term, the same Python class,
and in a fresh context the same ids one after the other (z3 orders a sum's operands by
their ids, and a model follows the order: a proof's answer, its work and its
counterexample must not change with the way its terms are made)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import z3

from usdtpatch.prove import smt
from usdtpatch.prove.smt import fresh_context

Z = Any


def _terms(fast: bool) -> list[Z]:
    """A varied sequence of terms, made by smt's helpers (`fast`) or by z3's operators."""
    x, y = z3.BitVec("x", 64), z3.BitVec("y", 64)
    b8, c8 = z3.BitVec("b8", 8), z3.BitVec("c8", 8)
    p, q = z3.Bool("p"), z3.Bool("q")
    m0 = z3.Function("m0", z3.BitVecSort(64), z3.BitVecSort(8))
    f3 = z3.Function("f3", z3.BitVecSort(64), z3.BitVecSort(8), z3.BitVecSort(64),
                     z3.BitVecSort(16))
    one = z3.BitVecVal(7, 8)
    out: list[Z] = []

    def made(helper: Callable[..., Z], operator: Callable[..., Z]) -> Z:
        t = helper() if fast else operator()
        out.append(t)
        return t

    made(lambda: smt.mk_ite(p, b8, c8), lambda: z3.If(p, b8, c8))
    made(lambda: smt.mk_ite(p, one, one), lambda: z3.If(p, one, one))  # same branches
    made(lambda: smt.mk_ite(z3.BoolVal(True), b8, one), lambda: z3.If(z3.BoolVal(True), b8, one))
    made(lambda: smt.mk_eq(x, y), lambda: x == y)
    made(lambda: smt.mk_eq(b8, one), lambda: b8 == one)  # Python asks the numeral first
    made(lambda: smt.mk_eq(one, b8), lambda: one == b8)
    made(lambda: smt.mk_eq(one, z3.BitVecVal(9, 8)), lambda: one == z3.BitVecVal(9, 8))
    for hi, lo in ((7, 0), (63, 56), (15, 8), (0, 0), (63, 0)):
        made(lambda h=hi, lo=lo: smt.mk_extract(h, lo, x),
             lambda h=hi, lo=lo: z3.Extract(h, lo, x))
    made(lambda: smt.mk_extract(3, 0, one), lambda: z3.Extract(3, 0, one))  # of a constant
    for parts in ((b8, c8), (b8, c8, one, b8), (x, b8)):
        made(lambda ps=parts: smt.mk_concat(ps), lambda ps=parts: z3.Concat(*ps))
    made(lambda: smt.mk_app1(m0, x), lambda: m0(x))
    made(lambda: smt.mk_app1(m0, x + 3), lambda: m0(x + 3))
    made(lambda: smt.mk_app(f3, (x, b8, y)), lambda: f3(x, b8, y))
    g0 = z3.Function("g0", z3.BitVecSort(32))
    made(lambda: smt.mk_app(g0, ()), g0)
    for args in ((p,), (p, q), (p, q, x == y, z3.Not(p))):
        made(lambda a=args: smt.mk_and(*a), lambda a=args: z3.And(*a))
        made(lambda a=args: smt.mk_or(*a), lambda a=args: z3.Or(*a))
    for k in (0, 1, 0x10000, (1 << 47) - 8, (1 << 64) - 1):
        made(lambda k=k: smt.mk_bin(z3.Z3_mk_bvand, x, smt.mk_val(k, x)), lambda k=k: x & k)
        made(lambda k=k: smt.mk_bin(z3.Z3_mk_bvadd, y, smt.mk_val(k, y)), lambda k=k: y + k)
        made(lambda k=k: smt.mk_cmp(z3.Z3_mk_bvule, x, smt.mk_val(k, x)),
             lambda k=k: z3.ULE(x, k))
        made(lambda k=k: smt.mk_cmp(z3.Z3_mk_bvuge, y, smt.mk_val(k, y)),
             lambda k=k: z3.UGE(y, k))
    made(lambda: smt.mk_bin(z3.Z3_mk_bvand, b8, smt.mk_val(0xD5, b8)), lambda: b8 & 0xD5)
    for k in (1, 8, (1 << 64) - 8):  # a kept constant added: base + bv_const(k, 64)
        made(lambda k=k: smt.mk_bin(z3.Z3_mk_bvadd, x, z3.BitVecVal(k, 64)),
             lambda k=k: x + z3.BitVecVal(k, 64))
    return out


def test_the_helpers_make_what_the_operators_make() -> None:
    with fresh_context():
        slow = _terms(fast=False)
        slow_ids = [t.get_id() for t in slow]
        slow_text = [(type(t), t.sexpr()) for t in slow]
    with fresh_context():
        fast = _terms(fast=True)
        fast_ids = [t.get_id() for t in fast]
        fast_text = [(type(t), t.sexpr()) for t in fast]
    assert fast_text == slow_text
    assert fast_ids == slow_ids
    # and in the main context, where the operators' terms already exist: the same terms
    a, b = _terms(fast=False), _terms(fast=True)
    assert all(x.eq(y) and type(x) is type(y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("make", [
    lambda: z3.BitVecVal(0, 64), lambda: z3.BitVecVal(5, 8), lambda: z3.BitVec("v", 64),
    lambda: z3.BitVec("v", 64) + 8, lambda: 8 + z3.BitVec("v", 64),
    lambda: z3.BitVec("v", 64) + z3.BitVec("w", 64), lambda: z3.BitVec("v", 64) - 8,
    lambda: z3.BitVec("v", 64) + 8 + z3.BitVec("w", 64),
    lambda: z3.Extract(7, 0, z3.BitVec("v", 64)), lambda: z3.BitVecVal(1, 1),
])
def test_values_and_sums_are_read_as_before(make: Callable[[], Z]) -> None:
    e = make()
    assert smt.is_value(e) == z3.is_bv_value(e)
    assert smt.bits_of(e) == e.size()
    base, k = smt.split_sum(e)
    # what _split said before: a constant, `base + c` with a constant operand, or e itself
    if z3.is_bv_value(e):
        want: tuple[Z, int] = (None, e.as_long())
    elif z3.is_app_of(e, z3.Z3_OP_BADD) and e.num_args() == 2 and \
            (z3.is_bv_value(e.arg(0)) or z3.is_bv_value(e.arg(1))):
        c = 0 if z3.is_bv_value(e.arg(0)) else 1
        want = (e.arg(1 - c), e.arg(c).as_long())
    else:
        want = (e, 0)
    assert k == want[1]
    assert (base is None) == (want[0] is None) and (base is None or base.eq(want[0]))


def test_the_work_counted_is_the_statistics() -> None:
    x = z3.BitVec("x", 64)
    for facts in ([x * x == 17], [x > 3, x < 2], [z3.ULE(x, 9), x * 3 == x + 4]):
        s = z3.Solver()
        s.add(*facts)
        s.check()
        stats = s.statistics()
        want = int(stats.get_key_value("rlimit count")) if "rlimit count" in stats.keys() \
            else 0  # noqa: SIM118 (Statistics has keys(), not `in`)
        assert smt.rlimit_count(s) == want > 0


@pytest.mark.parametrize("make", [
    lambda: z3.BoolVal(True), lambda: z3.BoolVal(False), lambda: z3.Bool("p"),
    lambda: z3.Not(z3.BoolVal(True)), lambda: z3.simplify(z3.Not(z3.BoolVal(True))),
    lambda: z3.BitVec("v", 8) == 3, lambda: z3.BitVecVal(1, 1), lambda: z3.BitVecVal(0, 1),
    lambda: z3.And(z3.BoolVal(True)), lambda: True, lambda: False,
])
def test_truth_and_sameness_are_read_as_before(make: Callable[[], Z]) -> None:
    e = make()
    assert smt.is_true_term(e) == z3.is_true(e)
    assert smt.is_false_term(e) == z3.is_false(e)
    if isinstance(e, z3.ExprRef):
        for other in (make(), z3.BoolVal(True), z3.BitVecVal(1, 1), z3.simplify(e)):
            if isinstance(other, z3.ExprRef):
                assert smt.same_term(e, other) == e.eq(other)
