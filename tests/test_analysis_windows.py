"""Patch windows: shapes, blocking reasons, and the window rules checked against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import fixture
from usdtpatch.analysis.check import check
from usdtpatch.analysis.functions import FunctionBounds
from usdtpatch.analysis.targets import ENTRY, JUMP, FunctionCode, Target
from usdtpatch.analysis.windows import (
    MAX_BACKWARD_INSNS,
    MAX_WINDOW,
    PatchWindow,
    WindowResult,
    WindowShape,
    find_window,
)
from usdtpatch.api import load
from usdtpatch.x86.decode import Flow, sweep
from usdtpatch.x86.nops import NOP5

BASE = 0x401000

# Instruction bytes used to build functions (with their AT&T disassembly).
NOP = "90"  # nop
NOP4 = "0f1f4000"  # nopl 0x0(%rax)
MOV = "4889c7"  # movq %rax, %rdi
ADD = "4883c001"  # addq $1, %rax
CMP = "4839f8"  # cmpq %rdi, %rax
JE = "7400"  # je .+2
CALL = "e800000000"  # callq .+5
RET = "c3"  # retq


def make(*hexes: str, targets: tuple[int, ...] = (), all_targets: str | None = None,
         padding: int = 0, base: int = BASE) -> tuple[FunctionCode, bytes]:
    """A function of the given instructions. `targets` are reached from elsewhere (sources
    unknown); the direct jumps in the code add their own targets, with their sources."""
    code = bytes.fromhex("".join(hexes))
    sw = sweep(code, base)
    bounds = FunctionBounds(base, base + len(code), "symbol", "f", None)
    incoming: dict[int, list[Target]] = {base: [Target(base, ENTRY, None)]}
    for t in targets:
        incoming.setdefault(t, []).append(Target(t, JUMP, None))
    for ins in sw.insns:
        if ins.flow in (Flow.JMP, Flow.JCC) and ins.target is not None \
                and bounds.contains(ins.target):
            incoming.setdefault(ins.target, []).append(Target(ins.target, JUMP, ins.address))
    tg = {a: v[0] for a, v in incoming.items()}
    fc = FunctionCode(bounds, sw.insns, tuple(i.address for i in sw.insns), tg, all_targets,
                      (), sw.bad, padding, {a: tuple(v) for a, v in incoming.items()})
    return fc, code + bytes([0x90]) * padding


def offset(*hexes: str) -> int:
    return BASE + sum(len(h) // 2 for h in hexes)


def window(r: WindowResult) -> PatchWindow:
    assert r.window is not None, r.reason
    return r.window


def test_in_place_into_padding() -> None:
    fc, code = make(MOV, NOP, NOP4, RET)
    w = window(find_window(fc, offset(MOV), code))
    assert w.shape is WindowShape.IN_PLACE
    assert (w.start, w.end) == (offset(MOV), offset(MOV, NOP, NOP4))
    assert w.replacement == NOP5  # nopl 0x0(%rax,%rax,1)
    assert w.relocated_bytes == 0 and w.extra_jumps == 0


def test_in_place_five_single_nops_fills_the_rest() -> None:
    fc, code = make(MOV, NOP, NOP, NOP, NOP, NOP, NOP, RET)
    w = window(find_window(fc, offset(MOV), code))
    assert w.shape is WindowShape.IN_PLACE
    assert w.size == 5 and w.replacement == NOP5


def test_in_place_refuses_a_target_inside_the_new_nop5() -> None:
    fc, code = make(MOV, NOP, NOP, NOP, NOP, NOP, ADD, RET, targets=(offset(MOV, NOP, NOP),))
    r = find_window(fc, offset(MOV), code)
    assert r.tried[0].startswith("in-place:") and "branch target" in r.tried[0]
    assert window(r).shape is WindowShape.BACKWARD  # mov; nop; nop (target at the end)


def test_forward_takes_whole_instructions() -> None:
    fc, code = make(MOV, NOP, MOV, ADD, RET)
    w = window(find_window(fc, offset(MOV), code))
    assert w.shape is WindowShape.FORWARD
    assert (w.start, w.end) == (offset(MOV), offset(MOV, NOP, MOV, ADD))
    assert w.probe_offset == 0 and w.probe_length == 1
    assert [i.address for i in w.insns] == [offset(MOV), offset(MOV, NOP), offset(MOV, NOP, MOV)]
    assert w.code == bytes.fromhex(NOP + MOV + ADD)
    assert w.relocated_bytes == 8 and w.extra_jumps == 2


def test_backward_when_the_next_instruction_is_a_target() -> None:
    # cmp; je L; nop; L: add   -- the PostgreSQL semaphore shape
    fc, code = make(MOV, CMP, JE, NOP, ADD, RET, targets=(offset(MOV, CMP, JE, NOP),))
    w = window(find_window(fc, offset(MOV, CMP, JE), code))
    assert w.shape is WindowShape.BACKWARD
    assert (w.start, w.end) == (offset(MOV), offset(MOV, CMP, JE, NOP))  # cmp; je; nop: 6
    assert w.probe_offset == 5
    assert w.start_reason == "fewest relocated bytes"


def test_backward_prefers_fewest_bytes() -> None:
    # add; mov; cmp; nop; L: add -- starting at cmp gives 4 bytes, at mov 7, at add 11
    fc, code = make(ADD, MOV, CMP, NOP, ADD, targets=(offset(ADD, MOV, CMP, NOP),))
    w = window(find_window(fc, offset(ADD, MOV, CMP), code))
    assert (w.start, w.end) == (offset(ADD), offset(ADD, MOV, CMP, NOP))
    assert w.relocated_bytes == 7


@pytest.mark.parametrize(("hexes", "probe_at", "targets", "code", "backward"), [
    ((MOV, NOP, CALL, RET), 1, (), "window-call", "call"),
    ((CALL, NOP, MOV, RET), 1, (2,), "window-branch-target", "call"),
    ((NOP, RET), 0, (), "window-function-end", "no start"),
], ids=["call-after", "call-before", "function-end"])
def test_blocked(hexes: tuple[str, ...], probe_at: int, targets: tuple[int, ...], code: str,
                 backward: str) -> None:
    fc, data = make(*hexes, targets=tuple(offset(*hexes[:t]) for t in targets))
    r = find_window(fc, offset(*hexes[:probe_at]), data)
    assert r.window is None and r.code == code
    assert backward in r.tried[-1]


def test_call_before_is_fine_when_forward_works() -> None:
    fc, data = make(CALL, NOP, MOV, ADD, RET, targets=(offset(CALL),))
    assert window(find_window(fc, offset(CALL), data)).shape is WindowShape.FORWARD


def test_padding_after_the_function_completes_a_window() -> None:
    # nop; ret at the end of a function followed by alignment padding (libjvm's empty probes)
    fc, data = make(NOP, RET, padding=14)
    w = window(find_window(fc, BASE, data))
    assert w.shape is WindowShape.FORWARD
    assert (w.start, w.end) == (BASE, BASE + 5)
    assert [i.text for i in w.insns] == ["nop", "retq"]
    assert "padding" in w.end_reason
    assert w.padding_bytes == 3 and w.code == bytes.fromhex(NOP + RET)  # padding not relocated
    fc, data = make(NOP, MOV, padding=14)  # no ret/jmp before the padding: it is not unused
    assert find_window(fc, BASE, data).code == "window-function-end"


def test_all_targets_blocks_with_its_own_code() -> None:
    fc, data = make(MOV, NOP, MOV, ADD, RET, all_targets="indirect jump not understood")
    r = find_window(fc, offset(MOV), data)
    assert r.window is None and r.code == "window-all-targets"


def test_probe_not_on_an_instruction_boundary() -> None:
    fc, data = make(MOV, ADD, RET)
    assert find_window(fc, BASE + 1, data).code == "probe-not-decoded"


def test_page_crossing_nop5_moves_alone() -> None:
    base = 0x401FFD  # the nop5 at page offset 0xffd crosses into the next page
    fc, data = make("0f1f440000", MOV, RET, base=base)
    r = find_window(fc, base, data)
    w = window(r)
    assert w.shape is WindowShape.FORWARD and (w.start, w.end) == (base, base + 5)
    assert "cross a page" in r.tried[0]


# ---------------------------------------------------------------------------------------------
# Property: find_window agrees with a brute-force search over every run of whole instructions.
# ---------------------------------------------------------------------------------------------

JB = "72f8"  # jb .-6 (a backward jump, often into the window)
ALPHABET = [NOP, NOP4, MOV, ADD, CMP, JE, JB, CALL, RET]


def _valid(fc: FunctionCode, a: int, b: int) -> bool:
    """[insns[a].address, insns[b].end) obeys the window rules (padding not used)."""
    insns = fc.insns
    s, e = insns[a].address, insns[b].end
    if e - s < 5 or e - s > MAX_WINDOW:
        return False
    if any(x.flow in (Flow.CALL, Flow.CALL_INDIRECT) for x in insns[a:b + 1]):
        return False
    if fc.all_targets is not None and b > a:
        return False
    for addr in fc.targets_between(s, e):
        sources = fc.incoming.get(addr, ())
        if fc.index_of(addr) is None or not sources or any(
                t.kind != JUMP or t.source is None or not s <= t.source < e for t in sources):
            return False
    return True


def _brute(fc: FunctionCode, i: int) -> list[tuple[int, int]]:
    """For every start, the shortest valid window holding insn i."""
    out = []
    for a in range(max(0, i - MAX_BACKWARD_INSNS), i + 1):
        for b in range(i, len(fc.insns)):
            if _valid(fc, a, b):
                out.append((fc.insns[a].address, fc.insns[b].end))
                break
    return out


def _reachable(fc: FunctionCode, pc: int) -> bool:
    """Whether some target reaches `pc` by falling through and direct jumps (by address)."""
    at = {x.address: x for x in fc.insns}
    todo, seen = list(fc.targets), set()
    while todo:
        a = todo.pop()
        while a in at and a not in seen:
            seen.add(a)
            x = at[a]
            if x.flow in (Flow.JMP, Flow.JCC) and x.target is not None:
                todo.append(x.target)
            if x.flow in (Flow.JMP, Flow.RET, Flow.STOP, Flow.JMP_INDIRECT):
                break
            a = x.end
    return pc in seen


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=14),
       st.data())
def test_windows_match_brute_force(seq: list[str], data: st.DataObject) -> None:
    hexes = [*seq, NOP, *data.draw(st.lists(st.sampled_from(ALPHABET), max_size=6)), RET]
    fc, code = make(*hexes)
    nops = [k for k, h in enumerate(hexes) if h == NOP]
    k = data.draw(st.sampled_from(nops))
    pc = offset(*hexes[:k])
    boundaries = [i.address for i in fc.insns]
    chosen = data.draw(st.lists(st.sampled_from(boundaries), max_size=5))
    fc, code = make(*hexes, targets=tuple(chosen))
    i = fc.index_of(pc)
    assert i is not None
    r = find_window(fc, pc, code)
    if fc.all_targets is None and not _reachable(fc, pc):
        assert r.window is None and r.code == "probe-not-code", r
        return
    brute = _brute(fc, i)
    if r.window is None:
        assert not brute, f"missed {brute} ({r.reason})"
        return
    w = r.window
    assert w.start <= pc < w.end
    assert not any(x.flow is Flow.CALL for x in w.insns)
    if w.shape is WindowShape.IN_PLACE:
        assert not any(fc.is_target(a) for a in range(w.start + 1, w.start + 5))
        return
    assert (w.start, w.end) in brute
    forward = [b for b in brute if b[0] == pc]
    if forward:
        assert w.shape is WindowShape.FORWARD and (w.start, w.end) == forward[0]
    else:
        assert w.shape is WindowShape.BACKWARD
        assert w.size == min(e - s for s, e in brute)


# ---------------------------------------------------------------------------------------------
# Fixtures: the shapes the committed binaries were built to show.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "expected"), [
    ("padded", {"in-place"}),
    ("dtrace-G5", {"in-place"}),
    ("combo10", {"in-place"}),
    ("branch-after", {"backward"}),
    ("call-after", {"backward"}),
    ("riprel-after", {"forward"}),
    ("pie", {"forward"}),
    ("stripped", {"forward"}),
    ("nop5", {"optimizable"}),
], ids=lambda v: v if isinstance(v, str) else "-".join(sorted(v)))
def test_fixture_outcomes(name: str, expected: set[str]) -> None:
    r = check(load(str(fixture(name))))
    assert {s.outcome for s in r.sites} == expected


def test_stripped_and_unstripped_agree() -> None:
    a = check(load(str(fixture("pie"))))
    b = check(load(str(fixture("stripped"))))
    assert [(s.outcome, s.window.window.size if s.window and s.window.window else None)
            for s in a.sites] == [
        (s.outcome, s.window.window.size if s.window and s.window.window else None)
        for s in b.sites]
    assert all(s.function is not None and s.function.source == "fde" for s in b.sites)
