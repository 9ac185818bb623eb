"""The prover (usdtpatch.prove): every detour the rewriter builds for the fixtures is proved
equivalent to its window; every mutant of those detours that the emulator (or the replay of
a counterexample) shows to behave differently is rejected, and each rejection carries a
counterexample the emulator confirms; what it does not model is refused, not proved; and the
rewrite's reports say how each site was verified.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.helpers import fixture, fixture_files, run_cli
from tests.mutants import Question, mutants, questions
from usdtpatch import api
from usdtpatch.analysis.check import check
from usdtpatch.analysis.forms import Guard
from usdtpatch.analysis.windows import PatchWindow, WindowShape
from usdtpatch.elf.image import parse_elf
from usdtpatch.io import read_input
from usdtpatch.prove.prover import DIFFERS, NOT_PROVABLE, PROVED, Proof, Prover
from usdtpatch.prove.support import provable
from usdtpatch.prove.verifier import ProvingVerifier, replay_proof
from usdtpatch.report import plain
from usdtpatch.rewriter import plan as rewriter_plan
from usdtpatch.verification.equivalence import DetourVerifier
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.nops import GUARD_ENTER, NOP5
from usdtpatch.x86.relocate import Detour, jmp_rel32

# what the prover leaves to the emulator on purpose in the fixtures
LEFT_TO_EMULATOR = ("ways into the window from outside it",)
# the fixtures whose detours cover every shape: plain, rip-relative, guarded (args-O0,
# redzone-leaf), jcc two-exit (branch-after), moved and emulated calls (call-window,
# cxx-callwin), adjacent probes (args-O2), rets (branch-onnop), a shared library
MUTATED = ("args-O0", "args-O2", "branch-after", "branch-onnop", "call-window", "cxx-callwin",
           "redzone-leaf", "riprel-after", "libprobes.so", "adjacent")


# Each fixture's mutants, at most this many of its detours: the questions of one fixture
# share a shape, so four spread over its list (first, last and between: for args-O2 two
# plain detours and two guarded ones) mutate what the others would, at a third of the time.
MUTATED_PER_FIXTURE = 4


def _spread(qs: list[Question], keep: int) -> list[Question]:
    """`keep` of `qs`, evenly spaced from the first to the last (all of them if fewer)."""
    if len(qs) <= keep:
        return qs
    return [qs[round(i * (len(qs) - 1) / (keep - 1))] for i in range(keep)]


def _prove(q: Question, prover: Prover | None = None) -> Proof:
    return (prover or Prover()).prove(q.window, q.code, q.detour, q.probes,
                                      entries=q.extra.get("entries", ()),
                                      patches=q.extra.get("patches", ()))


def _x86_fixtures() -> list[Path]:
    out = []
    for p in fixture_files():
        image = parse_elf(read_input(str(p)))
        if image.machine_name == "x86-64" and image.is64 and image.little_endian:
            out.append(p)
    return out


@pytest.fixture(scope="module")
def fixture_questions() -> dict[str, list[Question]]:
    out: dict[str, list[Question]] = {}
    for p in _x86_fixtures():
        out[p.name] = questions(str(p))
        if p.name in ("call-window", "cxx-callwin"):  # the emulated calls too
            out[p.name] += questions(str(p), calls="emulate")
        if p.name == "args-O2":  # guarded detours of adjacent probes
            out[p.name] += questions(str(p), guard=Guard.ALWAYS)
    return out


def test_every_fixture_detour_is_proved(fixture_questions: dict[str, list[Question]]) -> None:
    proved = 0
    for name, qs in fixture_questions.items():
        for q in qs:
            proof = _prove(q)
            if proof.outcome == PROVED:
                proved += 1
                continue
            assert proof.outcome == NOT_PROVABLE, (name, hex(q.window.start), proof.reason)
            assert proof.reason.startswith(LEFT_TO_EMULATOR), (name, proof.reason)
    assert proved >= 90  # every fixture detour but the retargeted ways in


def test_mutants_rejected_with_confirmed_counterexamples(
        fixture_questions: dict[str, list[Question]]) -> None:
    """No mutant the emulator rejects is proved; every one that changes behaviour (the
    emulator rejects it, or the counterexample's replay shows the difference) is rejected by
    the rewrite's verifier with the prover's reason; each mutation kind is rejected at least
    once."""
    emulator = DetourVerifier()
    kinds: dict[str, int] = {}
    for name in MUTATED:
        for q in _spread(fixture_questions[name], MUTATED_PER_FIXTURE):
            if _prove(q).outcome != PROVED:
                continue
            for what, m in mutants(q):
                proof = _prove(m)
                emulated = emulator(m.image, m.window, m.detour, m.probes, **m.extra)
                confirmed = replay_proof(proof, m.window, m.code, m.detour, m.probes) \
                    if proof.outcome == DIFFERS else None
                where = (name, hex(q.window.start), what, proof.reason, emulated)
                assert not (proof.outcome == PROVED and emulated is not None), where
                if emulated is None and confirmed is None:
                    continue  # the same behaviour (e.g. an unreachable instruction changed)
                assert proof.outcome == DIFFERS and confirmed is not None, where
                verifier = ProvingVerifier(lambda *_a, **_k: None)
                why = verifier(m.image, m.window, m.detour, m.probes, **m.extra)
                assert why is not None and why.startswith("proved not equivalent"), where
                assert verifier.last_method == PROVED
                kind = what.rsplit(" ", 2)[-1] if "field" not in what else "field"
                kinds[kind] = kinds.get(kind, 0) + 1
    assert set(kinds) >= {"field", "flipped", "dropped", "swapped", "restore"}, kinds


def _window(name: str, shape: WindowShape | None = None) -> tuple[Question, PatchWindow]:
    qs = questions(str(fixture(name)))
    for q in qs:
        if shape is None or q.window.shape is shape:
            return q, q.window
    pytest.skip(f"{name} has no such window")


def _hand_detour(q: Question, body: list[bytes]) -> Question:
    """q's detour rebuilt from `body`, one entry per window instruction (the probe's being
    the new site), then `jmp end`."""
    w, d = q.window, q.detour
    pairs = []
    code = b""
    for insn, raw in zip(w.insns, body, strict=True):
        pairs.append((insn.address, d.address + len(code)))
        code += raw
    pairs.append((w.end, d.address + len(code)))
    code += jmp_rel32(d.address + len(code), w.end)
    probe = dict(pairs)[q.probes[0]]
    return Question(q.image, w, Detour(d.address, code, probe, len(NOP5), tuple(pairs)),
                    q.probes, {})


@pytest.mark.parametrize(("insn", "why"), [
    (bytes.fromhex("0f05"), "Sys_syscall"),  # syscall
    (bytes.fromhex("0f31"), "RDTSC"),  # rdtsc
    (bytes.fromhex("f348a5"), "loops"),  # rep movsq: a loop of unknown length
    (bytes.fromhex("48f7f1"), "SigFPE_IntDiv"),  # div %rcx
    (bytes.fromhex("d9e8"), "GetI"),  # fld1 (x87)
])
def test_not_modelled_is_not_provable(insn: bytes, why: str) -> None:
    """A detour holding an instruction outside the model is never proved (nor refuted): the
    emulator decides."""
    q, w = _window("riprel-after")
    body = [NOP5 if i.address in q.probes else insn for i in w.insns]
    proof = _prove(_hand_detour(q, body))
    assert proof.outcome == NOT_PROVABLE and why in proof.reason, proof.reason
    calls: list[int] = []

    def fallback(*_a: object, **_k: object) -> None:
        calls.append(1)

    verifier = ProvingVerifier(fallback)
    m = _hand_detour(q, body)
    assert verifier(m.image, m.window, m.detour, m.probes) is None
    assert calls == [1] and verifier.last_method == "emulated"


def test_guard_that_moves_too_little_is_rejected() -> None:
    """`lea -0x40(%rsp)` instead of -0x80: a traced hit's 32 bytes land in the red zone; the
    prover finds it (the emulator's untraced runs cannot) and the replay confirms it."""
    q, _w = _window("args-O0")
    assert q.detour.code.find(GUARD_ENTER) >= 0
    code = q.detour.code.replace(GUARD_ENTER, bytes.fromhex("488d6424c0"), 1)
    code = code.replace(bytes.fromhex("488da42480000000"), bytes.fromhex("488da424" "40000000"),
                        1)
    m = q.with_code(code)
    proof = _prove(m)
    assert proof.outcome == DIFFERS and proof.model is not None and proof.model.traced
    assert replay_proof(proof, m.window, m.code, m.detour, m.probes) is not None


def test_answers_are_kept_by_position_independent_bytes() -> None:
    """The same window relocated to another address is answered from the cache; a changed
    detour is not."""
    q, _w = _window("branch-after", WindowShape.BACKWARD)
    prover = Prover()
    first = _prove(q, prover)
    assert first.outcome == PROVED and prover.hits == 0
    d = q.detour
    delta = 0x1000
    moved_code = _relocate_copy(q, delta)
    moved = Question(q.image, q.window,
                     Detour(d.address + delta, moved_code, d.probe_address + delta,
                            d.site_length, tuple((o, n + delta) for o, n in d.insn_map)),
                     q.probes, q.extra)
    assert moved_code != d.code  # its jmp back has another displacement
    assert _prove(moved, prover).outcome == PROVED and prover.hits == 1
    bad = next(m for what, m in mutants(q) if "field +1" in what)
    assert _prove(bad, prover).outcome == DIFFERS and prover.hits == 1


def _relocate_copy(q: Question, delta: int) -> bytes:
    """q's detour bytes as they are `delta` bytes further on: every branch to outside the
    detour (its targets are original addresses) gets its displacement less delta."""
    from usdtpatch.x86.relocate import Replacement, relocate_window

    w, d = q.window, q.detour
    reps = [Replacement(p, next(i.size for i in w.insns if i.address == p),
                        d.code[d.probe_address - d.address:
                               d.probe_address - d.address + d.site_length])
            for p in q.probes]
    return relocate_window(w.code, w.start, reps, d.address + delta).code


def test_rewrite_reports_how_each_site_was_verified(tmp_path: Path) -> None:
    src = str(fixture("args-O2"))
    proved = api.rewrite_plan(src, form="nop5")
    detours = [s for s in proved.sites if s.detour is not None]
    assert detours and all(s.verification == "proved" for s in detours)
    assert all(s.verification == "not verified" for s in proved.sites
               if s.action is rewriter_plan.Action.IN_PLACE)
    emulated = api.rewrite_plan(src, form="nop5", prove=False)
    assert all(s.verification == "emulated" for s in emulated.sites if s.detour is not None)
    unverified = api.rewrite_plan(src, form="nop5", verify=False)
    assert all(s.verification == "not verified" for s in unverified.sites
               if s.detour is not None)
    r = run_cli("rewrite", "--dry-run", "--form", "nop5", "--json", src)
    doc = json.loads(r.out)
    f = doc["files"][0]
    assert f["verification"] == {"proved": len(detours), "emulated": 0,
                                 "not verified": len(proved.sites) - len(detours)}
    assert [s["verification"] for s in f["sites"]] == [s.verification for s in proved.sites]
    text = run_cli("rewrite", "--dry-run", "--form", "nop5", src).out
    assert f"{len(detours)} proved, 0 emulated" in text
    page = tmp_path / "report.html"
    run_cli("rewrite", "--dry-run", "--form", "nop5", "--report", page, src)
    assert f"{len(detours)} proved, 0 emulated" in page.read_text()


def test_no_prove_flag_emulates_every_detour(tmp_path: Path) -> None:
    """`rewrite --no-prove`: every detour emulated (the report says so per site and in the
    counts), in place sites not verified, and the same file written as with the proof."""
    src = str(fixture("args-O2"))
    with_proof, without = tmp_path / "proved", tmp_path / "emulated"
    r = run_cli("rewrite", "--form", "nop5", "--json", "--no-prove", src, "-o", without)
    assert r.rc == 0, r.err
    f = json.loads(r.out)["files"][0]
    plan = api.rewrite_plan(src, form="nop5")
    detours = sum(1 for s in plan.sites if s.detour is not None)
    assert detours and f["verification"] == {"proved": 0, "emulated": detours,
                                             "not verified": len(plan.sites) - detours}
    assert [s["verification"] for s in f["sites"]] == [
        "emulated" if s.detour is not None else s.verification for s in plan.sites]
    assert run_cli("rewrite", "--form", "nop5", src, "-o", with_proof).rc == 0
    assert with_proof.read_bytes() == without.read_bytes()


def test_verification_names_agree() -> None:
    assert plain.VERIFICATIONS == rewriter_plan.VERIFICATIONS


@pytest.mark.parametrize("name", ["retarget", "args-O2", "call-window", "branch-after",
                                  "riprel-after", "redzone-leaf"])
def test_check_predicts_provable_detours(name: str) -> None:
    """`check` says which windows a rewrite should prove, and every detour the rewrite makes
    is proved exactly when check said so (retarget's ways in are not)."""
    src = str(fixture(name))
    summary = json.loads(run_cli("check", "--json", src).out)["files"][0]["summary"]
    text = run_cli("check", src).out
    assert f"{summary['provable']} of {summary['windows']} window(s) provable" in text
    ps = api.load(src)
    predicted = {sc.probe.address: provable(sc.window.window) is None
                 for sc in check(ps).sites if sc.window is not None and
                 sc.window.window is not None}
    assert sum(predicted.values()) == summary["provable"]
    plan = api.rewrite_plan(src, form="nop5")
    detours = [s for s in plan.sites if s.action is rewriter_plan.Action.DETOUR]
    assert detours
    for s in detours:
        assert (s.verification == "proved") == predicted[s.probe.address], s.probe.address
    if name == "retarget":
        assert summary["windows"] == 3 and summary["provable"] == 0


@pytest.mark.parametrize(("code", "why"), [
    ("0f05", "not modelled"), ("0f31", "not modelled"), ("f348a5", "rep-prefixed"),
    ("48f7f1", "not modelled"), ("48f7f9", "not modelled"), ("d9e8", "x87"),
    ("0fa2", "not modelled"),
])
def test_support_refuses(code: str, why: str) -> None:
    _q, w = _window("riprel-after")
    ins = sweep(bytes.fromhex(code), w.start).insns[0]
    bad = dataclasses.replace(w, insns=(ins,))
    assert provable(w) is None
    got = provable(bad)
    assert got is not None and why in got


def test_check_loads_neither_engine() -> None:
    """`check`'s prediction reads decoded instructions only: no pyvex, no z3."""
    import subprocess
    import sys

    code = ("import sys, io; from usdtpatch.cli import main; "
            f"main(['check', '--json', {str(fixture('args-O2'))!r}], out=io.StringIO(), "
            "err=io.StringIO()); print('z3' in sys.modules, 'pyvex' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]


# instruction kinds beyond the fixtures' windows: nop, then the snippet (bytes, the same
# snippet changed so that it computes something else)
KINDS = {
    "sse": ("f20f58c1", "f20f58c2"),  # addsd %xmm1,%xmm0 / addsd %xmm2,%xmm0
    "avx": ("c5fc58c1", "c5fc58c2"),  # vaddps %ymm1,%ymm0,%ymm0 / ... %ymm2 ...
    "cmpxchg": ("f0480fb10f", "f0480fb117"),  # lock cmpxchg %rcx,(%rdi) / %rdx,(%rdi)
    "push-pop": ("5358", "5258"),  # push %rbx; pop %rax / push %rdx; pop %rax
    "setcc-cmov": ("4839f00f94c0480f4fd1", "4839f00f95c0480f4fd1"),  # sete / setne
    "jcc": ("4885c07403ffc390", "4885c07503ffc390"),  # test; je +3 / jne +3; inc %ebx; nop
    "ret": ("4883c408c3", "4883c410c3"),  # add $8,%rsp; ret / add $16
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_instruction_kinds_proved_and_changes_rejected(kind: str) -> None:
    """A window `nop; SNIPPET` relocated by the rewriter's relocator is proved; the detour of
    the changed snippet is refuted, and the emulator confirms the counterexample."""
    from usdtpatch.x86.relocate import Replacement, relocate_window

    _q, base = _window("riprel-after")
    start, at = 0x40_1000, 0x50_0000
    good, bad = (b"\x90" + bytes.fromhex(h) for h in KINDS[kind])

    def window_of(code: bytes) -> PatchWindow:
        insns = sweep(code, start).insns
        return dataclasses.replace(base, start=start, end=start + len(code),
                                   probe_address=start, probe_length=1, insns=insns,
                                   code=code, internal_targets=(), calls=(),
                                   retargets=())

    w = window_of(good)
    detour = relocate_window(good, start, [Replacement(start, 1, NOP5)], at)
    proof = Prover().prove(w, good, detour, (start,))
    assert proof.outcome == PROVED, proof.reason
    wrong = relocate_window(bad, start, [Replacement(start, 1, NOP5)], at)
    assert len(wrong.code) == len(detour.code)
    proof = Prover().prove(w, good, wrong, (start,))
    assert proof.outcome == DIFFERS, proof.reason
    confirmed = replay_proof(proof, w, good, wrong, (start,))
    if kind == "avx":
        # unicorn 2 (QEMU 5) does not decode AVX: the replay cannot confirm, so the rewrite's
        # verifier hands the site to the emulator (test_unconfirmed_goes_to_the_emulator)
        assert confirmed is None
    else:
        assert confirmed is not None


def test_unconfirmed_goes_to_the_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    """A counterexample the replay does not confirm rejects nothing: the emulator decides."""
    import usdtpatch.prove.verifier as pv

    q, _w = _window("riprel-after")
    bad = next(m for what, m in mutants(q) if "field +1" in what)
    proof = _prove(bad)
    assert proof.outcome == DIFFERS
    monkeypatch.setattr(pv, "replay_proof", lambda *_a: None)
    verifier = ProvingVerifier(lambda *_a, **_k: "the emulator's answer")
    assert verifier(bad.image, bad.window, bad.detour, bad.probes) == "the emulator's answer"
    assert verifier.last_method == "emulated"
    monkeypatch.undo()
    verifier = ProvingVerifier(lambda *_a, **_k: "the emulator's answer")
    why = verifier(bad.image, bad.window, bad.detour, bad.probes)
    assert why is not None and why.startswith("proved not equivalent")
    assert "the emulator replaying the counterexample confirms it" in why


def test_naive_moved_call_is_rejected() -> None:
    """`nop; call X; mov %rax,%rbx`: the relocated call returns into the detour and is
    proved; `push $RET; jmp X` in its place (RET the original return address, inside the
    window, where the rewritten file holds int3) is refuted, and the replay confirms it."""
    from usdtpatch.x86.relocate import Replacement, relocate_window

    _q, base = _window("riprel-after")
    start, at, callee = 0x40_1000, 0x50_0000, 0x40_2000
    code = b"\x90" + b"\xe8" + (callee - (start + 6)).to_bytes(4, "little", signed=True) + \
        bytes.fromhex("4889c3")
    insns = sweep(code, start).insns
    w = dataclasses.replace(base, start=start, end=start + len(code), probe_address=start,
                            probe_length=1, insns=insns, code=code, internal_targets=(),
                            calls=(start + 1,), retargets=())
    good = relocate_window(code, start, [Replacement(start, 1, NOP5)], at)
    assert Prover().prove(w, code, good, (start,)).outcome == PROVED
    naive = NOP5 + b"\x68" + (start + 6).to_bytes(4, "little") + \
        jmp_rel32(at + 10, callee) + bytes.fromhex("4889c3") + jmp_rel32(at + 18, start + 9)
    bad = Detour(at, naive, at, len(NOP5),
                 ((start, at), (start + 1, at + 5), (start + 6, at + 15), (start + 9, at + 18)))
    proof = Prover().prove(w, code, bad, (start,))
    assert proof.outcome == DIFFERS, proof.reason
    confirmed = replay_proof(proof, w, code, bad, (start,))
    assert confirmed is not None and "returns there" in confirmed


def _synthetic(code: bytes) -> tuple[PatchWindow, Detour]:
    """The window `code` (a 1-byte probe `nop` first) at 0x401000 and its detour, relocated
    by the rewriter's relocator."""
    from usdtpatch.x86.relocate import Replacement, relocate_window

    _q, base = _window("riprel-after")
    start = 0x40_1000
    insns = sweep(code, start).insns
    w = dataclasses.replace(base, start=start, end=start + len(code), probe_address=start,
                            probe_length=1, insns=insns, code=code, internal_targets=(),
                            calls=(), retargets=())
    return w, relocate_window(code, start, [Replacement(start, 1, NOP5)], 0x50_0000)


# windows every state of some feasible path of which reads the bytes the rewrite changes, or
# accesses memory below 64 KiB: a proof under the prover's assumptions would say nothing
VACUOUS = {
    # nop; mov -8(%rip),%rax: the window's own 8 bytes (jmp + int3 once rewritten)
    "rip-relative-self": "90488b05f8ffffff",
    # nop; lea -8(%rip),%rax; mov (%rax),%rbx: a register set to the window's own address
    "lea-self": "90488d05f8ffffff488b18",
    # nop; cmp $0xfff,%rax; ja +3 (the end); mov (%rax),%rbx: the path where rax <= 0xfff
    # accesses page zero in every state
    "below-64k": "90483dff0f00007703488b18",
}


@pytest.mark.parametrize("kind", sorted(VACUOUS))
def test_accesses_the_proof_excludes_are_not_provable(kind: str) -> None:
    """A window whose feasible path accesses, in every state, the window's own bytes (a
    rip-relative load of them, a load through a register `lea` set to them) or page zero is
    not provable (the emulator decides), never proved; the same access elsewhere is."""
    w, d = _synthetic(bytes.fromhex(VACUOUS[kind]))
    proof = Prover().prove(w, w.code, d, (w.start,))
    assert proof.outcome == NOT_PROVABLE, (proof.outcome, proof.reason)
    assert "the bytes the rewrite changes" in proof.reason
    # controls: the load 0x100 bytes past the window, the comparison against a high bound
    for ok in ("90488b05f8000000", "90488d05f8000000488b18",
               "9048b8ffffff0000000000483dff0f00007703488b18"):
        w, d = _synthetic(bytes.fromhex(ok))
        proof = Prover().prove(w, w.code, d, (w.start,))
        assert proof.outcome == PROVED, (ok, proof.reason)


def test_replay_judges_faults_by_instruction() -> None:
    """`nop; mov (%rdi),%rax; mov (%rsi),%rbx` with the two loads swapped in the detour: the
    prover finds a state where the two fault at different instructions, and the replay
    confirms it (it judged any two faults equal, and mapped page zero); the same state
    replayed against the faithful detour shows no difference."""
    from usdtpatch.verification.replay import Side, State, replay

    code = bytes.fromhex("90488b07488b1e")
    w, good = _synthetic(code)
    at = good.address
    swapped = NOP5 + bytes.fromhex("488b1e488b07") + jmp_rel32(at + 11, w.end)
    bad = Detour(at, swapped, at, len(NOP5),
                 ((w.start, at), (w.start + 1, at + 5), (w.start + 4, at + 8), (w.end, at + 11)))
    assert Prover().prove(w, code, good, (w.start,)).outcome == PROVED
    proof = Prover().prove(w, code, bad, (w.start,))
    assert proof.outcome == DIFFERS and proof.model is not None, proof.reason
    confirmed = replay_proof(proof, w, code, bad, (w.start,))
    assert confirmed is not None and "faults at the copy of" in confirmed, (confirmed,
                                                                            proof.model)
    # the second load faults in page zero: the faithful copy faults where the original does
    state = State({**dict.fromkeys(proof.model.gprs, 0x7000_0000), "rsi": 16},
                  (0,) * 16, 0, {}, 0, False)
    original = Side(w.start, code, w.start, frozenset({w.start}), stops=frozenset({w.start}))
    for detour, differs in ((good, False), (bad, True)):
        rewritten = Side(detour.address, detour.code, detour.address,
                         frozenset({detour.address}), origin=detour.insn_map)
        got = replay(original, rewritten, state, dead_skip=None)
        assert (got is not None) is differs, got
