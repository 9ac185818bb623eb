"""Every instruction with a relative target is a branch (issue 46, class 3), on
tests/data/xbegin.c: the instruction after a probe is the fallback address of an `xbegin`
(another function's rel32: xfar; the next function's rel16: xnear; the probed function's
own, after the probe: xown, or before it: xback), and xin's `xbegin` follows its probe.

Before, the sweep knew branches by mnemonic (jmp, jcc, call, loop) and the file-wide scan by
opcode (e8, e9, 0f 8x, ...): an `xbegin` was no branch, its fallback no target, and each of
those sites was given a detour over its fallback address (an abort would have jumped into the
int3 filler or the middle of the new jump). Now the sweep asks iced-x86's operand kinds of
every instruction that shows a bare address (a NEAR_BRANCH operand is a target, whatever the
mnemonic), the scan's opcodes are held here to every encoding iced decodes with one, a way in
from an `xbegin` is never aimed at the detour (window-branch-target names it) and no window
moves an `xbegin` (window-transaction: no verifier models its fallback). Check predicts
rewrite; the rewritten programs run as the originals (the transactions themselves only where
the CPU has RTM).
"""

from __future__ import annotations

import re
from pathlib import Path

import iced_x86
import pytest

from tests.helpers import ROOT, build_variant
from tests.test_analysis_waysin import _site, _sources, _symbol, rewritten_runs_alike
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.analysis.waysin import REL8_OPCODE, REL16_OPCODE, REL32_OPCODES
from usdtpatch.api import load
from usdtpatch.x86.decode import Flow, sweep

SOURCE = ROOT / "tests" / "data" / "xbegin.c"
BUILDS = {"gcc-O0-pie": ("gcc", ["-O0", "-fPIE", "-pie"]),
          "gcc-O2-nopie": ("gcc", ["-O2", "-fno-pie", "-no-pie"]),
          "clang-O2-pie": ("clang", ["-O2", "-fPIE", "-pie"]),
          "gcc-O2-static": ("gcc", ["-O2", "-static"])}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xbegin")


def _program(folder: Path, variant: str) -> Path:
    cc, flags = BUILDS[variant]
    return build_variant(SOURCE, folder / variant, cc, flags)


def test_the_sweep_takes_xbegin_as_a_branch() -> None:
    """xbegin rel32 and rel16 have their fallback as target; movabs's bare address is no
    branch (its operand is memory, not a near branch)."""
    code = bytes.fromhex("c7f810000000" "66c7f81000" "a10000000000000000" "90")
    got = sweep(code, 0x1000).insns
    assert [(i.flow, i.target) for i in got] == [
        (Flow.JCC, 0x1016), (Flow.JCC, 0x101B), (Flow.NONE, None), (Flow.NONE, None)]


def _near_branch_encodings() -> list[bytes]:
    """The bytes before the displacement of every legacy encoding whose operand iced-x86
    knows as a near branch (BR*, XBEGIN_*) that 64-bit code decodes as one."""
    kinds = {v for k, v in vars(iced_x86.OpCodeOperandKind).items()
             if k.startswith(("BR16", "BR32", "BR64", "XBEGIN"))}
    out: set[bytes] = set()
    for name, code in vars(iced_x86.Code).items():
        if name.startswith("_") or not isinstance(code, int):
            continue
        info = iced_x86.OpCodeInfo(code)  # type: ignore[arg-type]  # Code is an int enum
        if not info.mode64 or info.encoding != iced_x86.EncodingKind.LEGACY or \
                not any(info.op_kind(i) in kinds for i in range(info.op_count)):
            continue
        head = b""
        for tok in info.op_code_string.split():
            if tok == "o16":
                head += b"\x66"
            elif tok == "a32":
                head += b"\x67"
            elif re.fullmatch(r"[0-9A-F]{2}", tok):
                head += bytes.fromhex(tok)
        ins = iced_x86.Decoder(64, head + bytes(8), ip=0x1000).decode()
        if not ins.is_invalid and ins.op_kind(0) == iced_x86.OpKind.NEAR_BRANCH64:
            out.add(head[:ins.len])
    return sorted(out)


def test_the_scan_knows_every_encoding_with_a_relative_target() -> None:
    """Each encoding iced decodes with a near-branch operand in 64-bit code is found by one
    of the file-wide scan's patterns, with its displacement where the pattern reads it."""
    missing = []
    for head in _near_branch_encodings():
        ins = iced_x86.Decoder(64, head + bytes(8), ip=0).decode()
        width = ins.len - len(head)
        bare = head.lstrip(b"\x66\x67")
        if width == 4:
            ok = any(re.fullmatch(p, bare, re.S) and n == len(bare) for p, n, _ in REL32_OPCODES)
        elif width == 1:
            ok = REL8_OPCODE.fullmatch(bare) is not None
        else:
            ok = REL16_OPCODE.fullmatch(head) is not None
        if not ok:
            missing.append((head.hex(), width, str(ins)))
    assert missing == []
    assert b"\xc7\xf8" in _near_branch_encodings()


@pytest.mark.needs_cc
@pytest.mark.parametrize("variant", BUILDS)
def test_xbegin_fallbacks_are_ways_in(built: Path, variant: str, tmp_path: Path) -> None:
    path = _program(built, variant)
    rep = check(load(path))
    for name, other in (("xfar", "xfar_other"), ("xnear", "xnear_other")):
        s = _site(rep, name)
        assert s.blocked == "window-branch-target", (name, s.outcome)
        assert s.window is not None
        lo, hi = _symbol(path, other)
        assert "xbegin-from-elsewhere" in s.window.reason
        assert any(lo <= a < hi for a in _sources(s.window.reason)), s.window.reason
    for name in ("xown", "xback"):
        s = _site(rep, name)
        assert s.blocked == "window-branch-target", (name, s.outcome)
        assert s.window is not None
        lo, hi = _symbol(path, name)
        assert any(lo <= a < hi for a in _sources(s.window.reason)), s.window.reason
    s = _site(rep, "xin")
    assert s.blocked == "window-transaction", s.outcome
    assert s.window is not None and "begins a transaction" in s.window.reason
    assert _site(rep, "plain").outcome == "forward"
    assert _mismatches(path) == []
    rewritten_runs_alike(path, tmp_path / "out")
