"""The prover on real binaries: python3.11, libstdc++.so.6 and a copy of OpenJDK 17's
libjvm.so. Every detour the rewriter builds is proved (but those with ways in from outside,
left to the emulator), and their mutants are rejected with counterexamples the emulator
confirms, as for the fixtures (tests/test_prove.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES
from tests.mutants import Question, mutants, questions
from usdtpatch.prove.prover import DIFFERS, NOT_PROVABLE, PROVED, Proof, Prover
from usdtpatch.prove.verifier import replay_proof
from usdtpatch.verification.equivalence import DetourVerifier

pytestmark = pytest.mark.slow


def _prove(q: Question) -> Proof:
    return Prover().prove(q.window, q.code, q.detour, q.probes,
                          entries=q.extra.get("entries", ()),
                          patches=q.extra.get("patches", ()))


def _check(path: str, mutate_every: int) -> tuple[int, int]:
    """Prove every detour of `path`; mutate every `mutate_every`-th one. (proved, rejected)"""
    proved = rejected = 0
    emulator = DetourVerifier()
    for n, q in enumerate(questions(path)):
        proof = _prove(q)
        if proof.outcome != PROVED:
            assert proof.outcome == NOT_PROVABLE and \
                proof.reason.startswith("ways into the window"), (hex(q.window.start), proof)
            continue
        proved += 1
        if n % mutate_every:
            continue
        for what, m in mutants(q):
            got = _prove(m)
            emulated = emulator(m.image, m.window, m.detour, m.probes, **m.extra)
            confirmed = replay_proof(got, m.window, m.code, m.detour, m.probes) \
                if got.outcome == DIFFERS else None
            where = (hex(q.window.start), what, got.reason, emulated)
            assert not (got.outcome == PROVED and emulated is not None), where
            if emulated is None and confirmed is None:
                continue
            if got.outcome == NOT_PROVABLE:
                # a mutant that makes the detour loop (a dropped jmp out of `je L; nop; jmp
                # out; L: ...; jmp nop`), or one the solver's budget does not settle (a
                # re-laid window's dropped store, aliasing its load), is left to the
                # emulator, which rejects it
                assert ("loops" in got.reason or "budget" in got.reason) and \
                    emulated is not None, where
                continue
            assert got.outcome == DIFFERS and confirmed is not None, where
            rejected += 1
    return proved, rejected


@pytest.mark.parametrize("name", ["python3.11", "libstdc++"])
def test_real_binary_detours_proved_and_mutants_rejected(name: str) -> None:
    path = REAL_BINARIES[name]
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    proved, rejected = _check(str(path), 1)
    assert proved >= 3 and rejected >= 10


def test_libjvm_detours_proved(tmp_path: Path) -> None:
    """Every detour of libjvm.so but its ways in proved; the mutants of every 25th rejected."""
    src = REAL_BINARIES["libjvm"]
    if not src.exists():
        pytest.skip(f"{src} is not installed")
    copy = tmp_path / "libjvm.so"
    shutil.copyfile(src, copy)
    # in this process: a counterexample is asked in a z3 context of its own, the same
    # whatever was asked before (tests/test_prove_determinism.py)
    proved, rejected = _check(str(copy), 25)
    assert proved >= 500 and rejected >= 50


def test_libjvm_indirect_call_counterexample_is_replayable(tmp_path: Path) -> None:
    """Each of libjvm's windows with `call *disp(%rip)`, its detour reading the target one
    byte further: the counterexample's two targets are ones a call leaves to (z3 chose
    non-canonical ones, where both sides fault at the call and the replay sees nothing
    differ), and the replay confirms it."""
    src = REAL_BINARIES["libjvm"]
    if not src.exists():
        pytest.skip(f"{src} is not installed")
    copy = tmp_path / "libjvm.so"
    shutil.copyfile(src, copy)
    asked = [(q, m) for q in questions(str(copy))
             if any(i.text.startswith("callq *") and "(%rip)" in i.text for i in q.window.insns)
             for what, m in mutants(q) if what.startswith("callq *") and what.endswith("+1")]
    assert asked
    for q, m in asked:
        got = _prove(m)
        assert got.outcome == DIFFERS, (hex(q.window.start), got.reason)
        assert replay_proof(got, m.window, m.code, m.detour, m.probes) is not None, \
            (hex(q.window.start), got.model)
