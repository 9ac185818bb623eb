"""The prover's answers depend on the question alone, not on what the process asked z3
before: a counterexample (and the work over the budget) is asked again in a z3 context of
its own (usdtpatch.prove.smt.fresh_context). The replay's confirmation of a counterexample,
the verification workers' answers and tests/test_prove_real.py's mutants rely on it."""

from __future__ import annotations

import random

import z3

from tests.helpers import fixture
from tests.mutants import Question, mutants, questions
from usdtpatch.prove.prover import DIFFERS, PROVED, Proof, Prover
from usdtpatch.prove.smt import bv_const, fresh_context


def _prove(m: Question) -> Proof:
    return Prover().prove(m.window, m.code, m.detour, m.probes,
                          entries=m.extra.get("entries", ()),
                          patches=m.extra.get("patches", ()))


def _history(seed: int) -> None:
    """Terms made and freed in another order: the ids z3 gives the next terms change."""
    rng = random.Random(seed)
    junk = [z3.BitVec(f"j{rng.randrange(10**6)}", 64) * rng.randrange(1 << 64) +
            z3.BitVec(f"k{i}", 64) for i in range(3000)]
    rng.shuffle(junk)
    del junk[:2000]


def test_counterexamples_do_not_depend_on_the_process_history() -> None:
    asked = [m for name in ("branch-after", "riprel-after", "call-window")
             for q in questions(str(fixture(name))) for _w, m in mutants(q)]
    first = [_prove(m) for m in asked]
    assert sum(p.outcome == DIFFERS for p in first) >= 15
    _history(1)
    again = [_prove(m) for m in reversed(asked)][::-1]
    assert [(p.outcome, p.reason, p.model, p.work) for p in again] == \
        [(p.outcome, p.reason, p.model, p.work) for p in first]


def test_fresh_context_sets_the_kept_terms_aside() -> None:
    """Inside, terms are another context's (a kept constant of the outer one is not used);
    after, the outer context and its terms are back."""
    outer = bv_const(5, 64)
    with fresh_context():
        inner = bv_const(5, 64)
        assert inner.ctx is not outer.ctx and inner.ctx == z3.main_ctx()
    assert bv_const(5, 64).ctx is outer.ctx is z3.main_ctx()
    # and a proof made after one inside is the same as before
    q = questions(str(fixture("args-O0")))[0]
    assert _prove(q).outcome == PROVED
