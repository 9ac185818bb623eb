"""Verification across processes (usdtpatch.verification.equivalence.plan_verified): the decisions
and the layout are those of verifying one detour at a time, also when detours fail (a failed
detour frees its place and the ones after it move), whatever the number of workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import disable_prover, fixture, run_cli
from usdtpatch import api
from usdtpatch.elf.image import parse_elf
from usdtpatch.rewriter.plan import Action, RewritePlan, plan_rewrite
from usdtpatch.verification import equivalence
from usdtpatch.verification.equivalence import DetourVerifier, plan_verified

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")


def _decisions(plan: RewritePlan) -> list[tuple[object, ...]]:
    return [(d.probe.probe_id, d.action.value, d.code, d.reason, d.new_pc,
             None if d.detour is None else d.detour.code) for d in plan.sites]


def _both(name: str, jobs: int) -> tuple[RewritePlan, RewritePlan]:
    image = parse_elf(fixture(name).read_bytes())
    one = plan_rewrite(image, verify=DetourVerifier())
    many = plan_verified(image, lambda v: plan_rewrite(image, verify=v), jobs=jobs,
                         expected=1000)  # a pool even for a small fixture
    return one, many


@pytest.mark.parametrize("jobs", [2, 3])
def test_pool_decides_like_one_verifier(jobs: int) -> None:
    one, many = _both("args-clang", jobs)
    assert sum(1 for d in one.sites if d.action is Action.DETOUR) >= 10
    assert _decisions(many) == _decisions(one)
    assert (many.text_addr, many.text, many.patches) == (one.text_addr, one.text, one.patches)


def test_failed_detours_move_the_next_ones_like_one_verifier(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every third window fails (in this process and in the forked workers alike): both ways
    skip the same sites with the same reason and lay the rest out at the same addresses."""
    real = equivalence._verify
    image = parse_elf(fixture("args-clang").read_bytes())
    starts = sorted(d.window.start for d in plan_rewrite(image, verify=None).sites
                    if d.window is not None and d.action is Action.DETOUR)
    bad = set(starts[::3])

    def failing(pair: object, img: object, window: object, *args: object) -> str | None:
        if getattr(window, "start", None) in bad:
            return "failed on purpose"
        return real(pair, img, window, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(equivalence, "_verify", failing)
    one, many = _both("args-clang", 2)
    skipped = [d for d in one.sites if d.code == "verification-failed"]
    assert len(skipped) == len(bad)
    assert _decisions(many) == _decisions(one)
    assert (many.text, many.patches) == (one.text, one.patches)


def test_api_jobs_do_not_change_the_output(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(equivalence, "JOBS_MIN_DETOURS", 0)
    a, b = tmp_path / "one", tmp_path / "two"
    api.rewrite(fixture("args-clang"), a, jobs=1)
    api.rewrite(fixture("args-clang"), b, jobs=2)
    assert a.read_bytes() == b.read_bytes()


def test_proofs_run_in_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """With workers, each proves its detours (the emulator for what it cannot prove): the
    parent proves none, and every site says how it was verified as a rewrite in one process
    says (the memo's methods of answers not back when the planner asked: not "pending")."""
    from usdtpatch.prove.prover import Prover

    monkeypatch.setattr(equivalence, "JOBS_MIN_DETOURS", 0)
    one = api.rewrite_plan(fixture("args-clang"), jobs=1)
    parent = os.getpid()
    real = Prover.prove

    def prove(self: Prover, *args: object, **kw: object) -> object:
        assert os.getpid() != parent, "a proof in the parent"
        return real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Prover, "prove", prove)
    many = api.rewrite_plan(fixture("args-clang"), jobs=2)
    assert _decisions(many) == _decisions(one)
    methods = [d.verification for d in many.sites]
    assert methods == [d.verification for d in one.sites]
    assert methods.count("proved") >= 10 and "pending" not in methods


@pytest.mark.slow
@pytest.mark.skipif(not LIBJVM.exists(), reason="needs OpenJDK 17's libjvm.so")
def test_libjvm_pool_decides_like_one_verifier() -> None:
    one = api.rewrite_plan(LIBJVM, jobs=1)
    many = api.rewrite_plan(LIBJVM, jobs=2)
    assert _decisions(many) == _decisions(one)


def _die(jobs: object) -> object:
    os._exit(3)  # what a crash of the emulator in a worker looks like to the pool


def test_a_dead_worker_is_a_clean_refusal(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    """A worker that dies (the emulator crashing on some input) makes the rewrite stop with
    one line (exit 2), not hang waiting for its answers; nothing is written."""
    monkeypatch.setattr(equivalence, "_worker_run", _die)
    monkeypatch.setattr(equivalence, "JOBS_MIN_DETOURS", 0)
    disable_prover(monkeypatch)  # the detours go to the workers
    out = tmp_path / "out"
    res = run_cli("rewrite", fixture("args-clang"), "-o", out)
    assert res.rc == 2, res.err
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and "died" in lines[0] and str(fixture("args-clang")) in lines[0]
    assert not out.exists()
