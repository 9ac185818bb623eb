"""The prover's concrete witness (usdtpatch.prove.smt.witnessed): a pair of paths shown to
admit a state the proof's restriction allows by evaluating its conditions in a few concrete
states, without the solver. It must never claim facts that cannot hold together; where it
cannot show them, the solver decides (tests/test_prove.py's vacuous windows)."""

from __future__ import annotations

import random
import statistics

import pytest
import z3

from tests.helpers import fixture
from tests.mutants import questions
from usdtpatch.prove import smt
from usdtpatch.prove.prover import PROVED, Prover
from usdtpatch.prove.smt import Shared, witnessed


def _terms(s: Shared) -> tuple[z3.BitVecRef, z3.BitVecRef, z3.BitVecRef]:
    return s.chunk(smt.RSP), s.chunk(16), s.chunk(72)  # rsp, rax, rdi


def _sat(facts: list[z3.BoolRef]) -> bool:
    solver = z3.Solver()
    solver.add(*facts)
    return bool(solver.check() == z3.sat)


def test_unsatisfiable_facts_are_never_witnessed() -> None:
    s = Shared()
    rsp, rax, rdi = _terms(s)
    f = s.func("Iop_Foo", (64,), 64)
    load = z3.Concat(*(s.m0(rdi + k) for k in range(7, -1, -1)))
    lo, hi = 0x401000, 0x401020  # "the code"
    cases = [
        [z3.UGE(rsp, 0x10000), z3.ULT(rsp, 0x10000)],
        [rax == rdi, rax != rdi],
        [f(rax) == 0, f(rax) == 1],
        [s.m0(rsp) == 1, s.m0(rsp) == 2],
        [load == rax, rax != load],
        [z3.Or(z3.ULE(rdi + 8, lo), z3.UGE(rdi, hi)), rdi == lo + 4],
        [s.traced, z3.Not(s.traced)],
        [z3.Extract(6, 6, s.flags) == 1, z3.Extract(6, 6, s.flags) == 0],
    ]
    for facts in cases:
        assert not _sat(facts)
        assert not witnessed(facts, s), facts
    # and the facts a witness state does meet: accesses above 64 KiB, outside the code
    ok = [z3.UGE(rsp - 8, 0x10000), z3.ULE(rsp - 8, (1 << 47) - 8),
          z3.Or(z3.ULE(rsp + 8, lo), z3.UGE(rsp, hi)), z3.UGE(load, 0x10000), rax != rdi]
    assert witnessed(ok, s)


def test_witnessed_facts_are_satisfiable() -> None:
    """Random conjunctions over registers, flags, memory and an uninterpreted operation: each
    the witness claims, z3 finds satisfiable too (and the witness claims many)."""
    rng = random.Random(7)
    s = Shared()
    rsp, rax, rdi = _terms(s)
    f = s.func("Iop_Bar", (64,), 1)
    load = z3.Concat(*(s.m0(rdi + k) for k in range(7, -1, -1)))
    values = [rsp, rax, rdi, load, s.flags, rsp - 0x80, rax + rdi, load + 0x10]
    bounds = [0, 0x40, 0x8D5, 0x10000, 0x10_0000_0000, 0x10_2000_0000, 1 << 47, (1 << 64) - 1]

    def atom() -> z3.BoolRef:
        a = rng.choice(values)
        k = rng.choice(bounds)
        pick = rng.randrange(7)
        if pick == 0:
            return z3.UGE(a, k)
        if pick == 1:
            return z3.ULE(a, k)
        if pick == 2:
            return a == rng.choice(values)
        if pick == 3:
            return a != rng.choice(values)
        if pick == 4:
            return z3.Extract(rng.randrange(64), 0, a) == 0
        if pick == 5:
            return f(a) == rng.randrange(2)
        return z3.Or(z3.ULE(a + 8, 0x401000), z3.UGE(a, 0x402000))

    claimed = 0
    for _ in range(400):
        facts = [atom() for _ in range(rng.randrange(1, 5))]
        if witnessed(facts, s):
            claimed += 1
            assert _sat(facts), facts
    assert claimed >= 40


def test_proofs_of_a_fixture_need_little_solver_work() -> None:
    """The restriction's non-vacuity shown by the witness, not asked of the solver: the
    median work of a proof of args-O0's and branch-after's detours stays small (it was
    ~10,000 units a detour with the solver's query; deterministic units, not time)."""
    work = []
    for name in ("args-O0", "branch-after", "call-window"):
        for q in questions(str(fixture(name))):
            proof = Prover().prove(q.window, q.code, q.detour, q.probes,
                                   entries=q.extra.get("entries", ()),
                                   patches=q.extra.get("patches", ()))
            if proof.outcome == PROVED:
                work.append(proof.work)
    assert len(work) >= 3
    assert statistics.median(work) < 1000, work


@pytest.mark.parametrize("facts", [[], [z3.BoolVal(True)]])
def test_nothing_to_show_is_shown(facts: list[z3.BoolRef]) -> None:
    assert witnessed(facts, Shared())
