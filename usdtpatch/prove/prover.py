"""The equivalence proof of one detour: proved, differs (a candidate counterexample), or not
provable. Neither engine is imported here (usdtpatch.prove.vex lifts, usdtpatch.prove.smt
executes and asks z3).

What is proved, for every entry pair (the window's start and the detour's; each moved
call's return site and its copy; the ways in the rewriter lists): on every pair of paths of
the window and the detour whose conditions can hold together, from one shared symbolic
state (registers, flags, vector registers, memory):
- both leave to the same address (the window's exits are original addresses, so are the
  detour's; a call's pushed return address may be the detour's copy of the original one);
- the guest state they wrote is equal (every general and vector register, the status flags,
  the direction flag), rip aside;
- every byte either wrote holds the same value, except the tracer's 32 bytes below the
  guard (docs/rewrite.md, "Proved, not sampled": the assumption);
- the probe is reached as often, with the same registers;
- each original instruction accesses the same bytes in both (the copy of an instruction
  faults exactly where the original does: the exit map of faults).

The answers are kept per `Prover` (one per verifying process of a rewrite) by the window
and the position-independent form of the detour: a detour moved to another address (a
rejected one before it freed its place) is the same question. A counterexample, and an
answer over the budget, is asked again in a z3 context of its own (smt.fresh_context): it
then depends on the question alone, not on what the process asked before.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass
from functools import partial

from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.kernelfacts import RED_ZONE
from usdtpatch.prove.smt import (
    Dead,
    Machine,
    Model,
    NotLiftable,
    Region,
    Shared,
    Unprovable,
    differences,
    fault_witness,
    fresh_context,
    plausible,
    replayable,
    solve,
)
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.nops import GUARD_ENTER, GUARD_LEAVE, NOP5
from usdtpatch.x86.relocate import Detour

PROVED = "proved"
DIFFERS = "differs"  # a counterexample the caller replays before calling it not equivalent
NOT_PROVABLE = "not-provable"
# z3's deterministic resource limit per site (the same answer on every machine and load):
# 150,000 units took 90-150 ms of solving on the reference machine under load
# (docs/performance.md, "Proofs"). The detours of libjvm.so need at most 2,124 (median 184,
# measured 2026-12-01): the check that each pair of paths admits a state the restriction
# allows is shown by a concrete witness (smt.witnessed), the solver asked only where none
# fits (it cost a median of ~10,000 units a detour asked of the solver every time).
# A site that needs more is left to the emulator
RLIMIT = 150_000


OVER_BUDGET = "the solver's budget was exceeded"


@dataclass(frozen=True, slots=True)
class Proof:
    """The prover's answer for one detour."""

    outcome: str  # PROVED, DIFFERS, NOT_PROVABLE
    reason: str  # why not provable, or what differs
    model: Model | None = None  # the counterexample (DIFFERS)
    entry: tuple[int, int] | None = None  # (window entry, detour entry) it concerns
    ms: float = 0.0
    work: int = 0  # z3's resource units spent (the budget is RLIMIT)


def tracer_nops(detour: Detour, probes: tuple[int, ...]) -> tuple[frozenset[int], int]:
    """The addresses of the detour's nop5s in its new sites (where the 6.18 trampoline writes
    32 bytes below rsp when traced) and the bytes the guard is meant to skip (128 for a
    guarded site, from the site's length, not its bytes: a guard that skips less is then a
    difference; 0 without one). combo10's nop10 holds no nop5: another kernel's design,
    no writes modelled."""
    mapping = dict(detour.insn_map)
    out: set[int] = set()
    for p in probes:
        at = mapping[p] - detour.address
        i = detour.code[at : at + detour.site_length].find(NOP5)
        if i >= 0:
            out.add(detour.address + at + i)
    guarded = detour.site_length >= len(GUARD_ENTER) + len(NOP5) + len(GUARD_LEAVE)
    return frozenset(out), RED_ZONE if guarded else 0


def call_returns(window: PatchWindow, detour: Detour) -> dict[int, tuple[int, ...]]:
    """What each call of the window may push in the detour, by the return address it pushes
    in the window: its copy (a moved call, returning into the detour), or, for the call that
    ends the window, the window's end itself (an emulated call: the original code after the
    window runs). The first is always the copy."""
    mapping = dict(detour.insn_map)
    calls = set(window.calls)
    return {i.end: (mapping[i.end], *((i.end,) if i.end == window.end else ()))
            for i in window.insns if i.address in calls and i.end in mapping}


def _relaid_stops(window: PatchWindow, detour: Detour) -> frozenset[int]:
    """A window re-laid where it is (its "detour" at the window's start) stops where the
    window does: back at its start, a loop's back edge; a detour elsewhere stops nowhere
    inside (its jmp back leaves it)."""
    return frozenset({detour.address}) if detour.address == window.start else frozenset()


class _Back:
    """Detour address -> the original instruction its bytes copy."""

    def __init__(self, detour: Detour) -> None:
        pairs = sorted((new, orig) for orig, new in detour.insn_map)
        self.news = [n for n, _o in pairs]
        self.origs = [o for _n, o in pairs]

    def __call__(self, address: int) -> int:
        i = bisect_right(self.news, address) - 1
        return self.origs[i] if i >= 0 else address


def _pi_detour(detour: Detour) -> tuple[object, ...] | None:
    """The detour as position-independent data: each instruction's bytes with its branch or
    rip-relative field cut out, and what the field names (an absolute original address, or
    an offset into the detour); None when a field cannot be found unambiguously."""
    got = sweep(detour.code, detour.address)
    if got.bad:
        return None
    lo, hi = detour.address, detour.end
    out: list[object] = []
    for ins in got.insns:
        raw = detour.code[ins.address - lo : ins.end - lo]
        target = ins.target if ins.target is not None else ins.rip_target
        if target is None:
            out.append(raw)
            continue
        rel = target - ins.end
        cut = None
        for width in (4, 1):
            if not -(1 << (8 * width - 1)) <= rel < 1 << (8 * width - 1):
                continue
            field_ = rel.to_bytes(width, "little", signed=True)
            if raw.count(field_) == 1:
                cut = (raw.index(field_), width)
                break
        if cut is None:
            return None
        at, width = cut
        where = ("in", target - lo) if lo <= target < hi else ("abs", target)
        out.append((raw[:at] + raw[at + width:], at, width, where))
    return tuple(out)


class Prover:
    """Proves detours of one rewrite, keeping every answer by the question's
    position-independent form."""

    def __init__(self, rlimit: int = RLIMIT) -> None:
        self.rlimit = rlimit
        self.cache: dict[object, Proof] = {}
        self.hits = 0

    def prove(self, window: PatchWindow, code: bytes, detour: Detour,
              probes: tuple[int, ...], *, entries: tuple[tuple[int, int], ...] = (),
              patches: tuple[tuple[int, bytes], ...] = ()) -> Proof:
        """Whether `detour` does what the window `code` (at window.start) does."""
        t0 = time.perf_counter()
        if patches:
            return Proof(NOT_PROVABLE, "ways into the window from outside it (retargeted "
                         "branches) are left to the emulator")
        pi = _pi_detour(detour)
        a = detour.address
        key: object = (window.start, code, probes, tuple(sorted(window.calls)),
                       pi if pi is not None else (detour.code, a),
                       tuple((o, n - a) for o, n in detour.insn_map), detour.probe_address - a,
                       tuple((x, y - a) for x, y in entries))
        got = self.cache.get(key)
        if got is not None:
            self.hits += 1
            return got
        proof = self._guarded(window, code, detour, probes, entries)
        if proof.outcome == DIFFERS or proof.reason == OVER_BUDGET:
            # asked again from nothing but the question: which counterexample z3 finds
            # among many, and the work it spends, follow the terms this process made
            # before (a proof needs far less than the budget: docs/rewrite.md)
            with fresh_context():
                proof = self._guarded(window, code, detour, probes, entries)
        proof = Proof(outcome=proof.outcome, reason=proof.reason, model=proof.model,
                      entry=proof.entry, ms=(time.perf_counter() - t0) * 1000, work=proof.work)
        self.cache[key] = proof
        return proof

    def _guarded(self, window: PatchWindow, code: bytes, detour: Detour,
                 probes: tuple[int, ...], entries: tuple[tuple[int, int], ...]) -> Proof:
        try:
            return self._prove(window, code, detour, probes, entries)
        except (NotLiftable, Unprovable) as exc:
            return Proof(NOT_PROVABLE, str(exc))
        except Exception as exc:  # a fault of the prover must not stop a rewrite:
            # the emulator decides (the tests check no fixture or real binary gets here)
            return Proof(NOT_PROVABLE, f"internal error of the prover: {exc!r}")

    def _prove(self, window: PatchWindow, code: bytes, detour: Detour,
               probes: tuple[int, ...], entries: tuple[tuple[int, int], ...]) -> Proof:
        mapping = dict(detour.insn_map)
        if any(p not in mapping for p in probes):
            return Proof(NOT_PROVABLE, "a probe has no place in the detour")
        sites = frozenset(mapping[p] for p in probes)
        tracer, skip = tracer_nops(detour, probes)
        w_region = Region(window.start, window.start + len(code), code,
                          stops=frozenset({window.start}), marks=frozenset(probes))
        d_region = Region(detour.address, detour.end, detour.code, marks=sites | tracer,
                          stops=_relaid_stops(window, detour))
        returns = call_returns(window, detour)
        pairs = [(window.start, detour.address), *entries,
                 *((r, c[0]) for r, c in sorted(returns.items()) if (r, c[0]) not in entries)]
        back = _Back(detour)
        code_ranges = [(window.start, window.start + len(code)), (detour.address, detour.end)]
        used = 0
        for e_w, e_d in pairs:
            shared = Shared()
            m_w = Machine(shared, w_region, hits=frozenset(probes), tracer=frozenset(),
                          origin=lambda x: x)
            m_d = Machine(shared, d_region, hits=sites, tracer=tracer, origin=back)
            w_paths = m_w.run(e_w)
            d_paths = m_d.run(e_d)
            questions = []
            for pw in w_paths:
                for pd in d_paths:
                    diffs = differences(pw, pd, m_w, m_d, shared, returns,
                                        Dead(skip) if tracer else None)
                    questions.append(([*pw.cond, *pd.cond], diffs, [*pw.loads, *pd.loads],
                                      plausible(pw, pd, code_ranges),
                                      partial(fault_witness, pw, pd),  # when needed
                                      partial(replayable, pw, pd)))
            verdict, model, spent = solve(questions, shared, self.rlimit - used)
            used += spent
            if verdict == "differs" and model is not None:
                return Proof(DIFFERS, model.what, model, (e_w, e_d), work=used)
            if verdict == "vacuous":
                return Proof(NOT_PROVABLE, "on a feasible path every state accesses the bytes "
                             "the rewrite changes (the window's or the detour's code: code "
                             "reading its own bytes is not modelled), below 64 KiB or outside "
                             "user space", entry=(e_w, e_d), work=used)
            if verdict == "unknown" or used >= self.rlimit:
                return Proof(NOT_PROVABLE, OVER_BUDGET, work=used)
        return Proof(PROVED, "equivalent on every path", work=used)
