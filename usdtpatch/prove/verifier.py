"""The rewrite's verifier: the proof first, the emulator where there is none.

`ProvingVerifier(fallback)` answers the planner's question (usdtpatch.rewriter.plan's
`Verifier`: None when the detour is equivalent, else why not) with the prover
(usdtpatch.prove.prover):
- proved: accepted, without emulation;
- a counterexample the emulator confirms when it replays it (usdtpatch.verification.replay):
  rejected, the reason naming the difference and the state;
- anything else (not provable: an instruction outside the model, the solver's budget; or a
  counterexample the replay does not confirm): `fallback` decides (today's emulated check,
  usdtpatch.verification.equivalence), and the site counts as emulated.
After each call `last_method` says which ("proved" or "emulated"); `counts` adds them up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.elf.image import ElfImage
from usdtpatch.kernelfacts import PAGE
from usdtpatch.prove.prover import DIFFERS, PROVED, Proof, Prover, call_returns, tracer_nops
from usdtpatch.verification.replay import Side, State, replay
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.relocate import Detour

EMULATED = "emulated"
NOT_VERIFIED = "not verified"
METHODS = (PROVED, EMULATED, NOT_VERIFIED)


def replay_proof(proof: Proof, window: PatchWindow, code: bytes, detour: Detour,
                 probes: tuple[int, ...]) -> str | None:
    """What the emulator sees differ when it runs the proof's counterexample (None: the
    two sides behave the same there: the counterexample is not confirmed)."""
    m = proof.model
    if m is None or proof.entry is None:
        return None
    mapping = dict(detour.insn_map)
    tracer, skip = tracer_nops(detour, probes)
    e_w, e_d = proof.entry
    state = State(gprs=m.gprs, xmm=tuple(v & ((1 << 128) - 1) for v in m.ymm), rflags=m.rflags,
                  memory=m.memory, default_byte=m.default_byte, traced=m.traced)
    original = Side(window.start, code, e_w, frozenset(probes),
                    stops=frozenset({window.start}))
    rewritten = Side(lo=detour.address, code=detour.code, entry=e_d,
                     probes=frozenset(mapping[p] for p in probes), tracer=tracer,
                     origin=detour.insn_map,
                     stops=frozenset({detour.address}) if detour.address == window.start
                     else frozenset())
    # the link-time addresses the code names (rip-relative operands, at most 32 bytes wide)
    named = [i.rip_target for i in (*window.insns, *sweep(detour.code, detour.address).insns)
             if i.rip_target is not None]
    pages = frozenset(p for t in named for p in (t // PAGE * PAGE, (t + 31) // PAGE * PAGE))
    return replay(original, rewritten, state, dead_skip=skip if tracer else None,
                  returns=call_returns(window, detour), link_pages=pages)


def describe(proof: Proof, confirmed: str, window_start: int) -> str:
    """A rejection's reason: what the proof found, what the emulator saw, and the state."""
    m = proof.model
    assert m is not None and proof.entry is not None
    regs = " ".join(f"{n}={v:#x}" for n, v in m.gprs.items() if v) or "every register 0"
    if any(m.gprs.values()):
        regs += " (the others 0)"
    where = "" if proof.entry[0] == window_start else \
        f" entered at {proof.entry[0]:#x} (the detour's {proof.entry[1]:#x}),"
    return (f"proved not equivalent:{where} {m.what} can differ, and the emulator replaying "
            f"the counterexample confirms it ({confirmed}); the counterexample: {regs}, "
            f"rflags={m.rflags:#x}, {len(m.memory)} memory byte(s) set"
            + (", the probe traced" if m.traced else ""))


class ProvingVerifier:
    """Prover first, `fallback` (the emulator's verifier) for what it cannot prove. One per
    rewrite; `prover` may be shared between the planner's passes (its answers are kept)."""

    def __init__(self, fallback: Callable[..., str | None], prover: Prover | None = None
                 ) -> None:
        self.fallback = fallback
        self.prover = prover if prover is not None else Prover()
        self.last_method = EMULATED
        self.counts: Counter[str] = Counter()
        self._replayed: dict[int, str | None] = {}

    def __call__(self, image: ElfImage, window: PatchWindow, detour: Detour,
                 probes: tuple[int, ...], **extra: Any) -> str | None:
        patches = extra.get("patches", ())
        entries = extra.get("entries", ())
        code = bytes(image.read_vaddr(window.start, window.size))
        proof = self.prover.prove(window, code, detour, probes, entries=entries,
                                  patches=patches)
        if proof.outcome == PROVED:
            return self._said(PROVED, None)
        if proof.outcome == DIFFERS:
            key = id(proof)  # the prover keeps every proof: ids stay unique
            if key not in self._replayed:
                self._replayed[key] = replay_proof(proof, window, code, detour, probes)
            confirmed = self._replayed[key]
            if confirmed is not None:
                return self._said(PROVED, describe(proof, confirmed, window.start))
        return self._said(EMULATED, self.fallback(image, window, detour, probes, **extra))

    def _said(self, method: str, why: str | None) -> str | None:
        self.last_method = method
        self.counts[method] += 1
        return why
