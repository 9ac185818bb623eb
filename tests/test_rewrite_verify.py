"""The detour equivalence check (usdtpatch.verification.equivalence) and the relocator, on real
fixture windows: what they must accept and what they must reject.

Three of the bugs found while validating issue 5 have a test here: a branch from inside a
backward window to an instruction strictly inside it was left pointing at the original
(now `int3`); unicorn kept stale translations, so a detour laid at the address of an earlier
one was checked against the earlier code; and a window ending in `ret` (or loading through a
register) faulted in nearly every random state, so it could not be checked at all.
"""

from __future__ import annotations

import pytest

from tests.helpers import fixture
from usdtpatch.analysis.check import check
from usdtpatch.analysis.windows import PatchWindow, WindowShape
from usdtpatch.api import load
from usdtpatch.elf.image import ElfImage
from usdtpatch.verification.equivalence import DetourVerifier, verify_detour
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.nops import NOP5
from usdtpatch.x86.relocate import Detour, Replacement, jmp_rel32, relocate_window

DETOUR_AT = 0x40_0000  # far from the fixtures' code (PIE, linked at 0)


def _window(name: str, want: str) -> tuple[ElfImage, PatchWindow]:
    ps = load(str(fixture(name)))
    for sc in check(ps).sites:
        w = sc.window.window if sc.window is not None else None
        if w is None:
            continue
        if want == "inner" and w.internal_targets and w.shape is WindowShape.BACKWARD:
            return ps.image, w
        if want == "ret" and w.shape is not WindowShape.IN_PLACE and \
                any(i.base_mnemonic.startswith("ret") for i in w.insns):
            return ps.image, w
    pytest.skip(f"{name} has no {want} window")


def _detour(w: PatchWindow) -> Detour:
    return relocate_window(w.code, w.start, [Replacement(w.probe_address, w.probe_length, NOP5)],
                           DETOUR_AT)


def _rebuild(w: PatchWindow, body: list[bytes]) -> Detour:
    """A hand-made detour: `body` (one entry per window instruction, the probe's being the
    new site) then `jmp end`."""
    pairs = []
    code = b""
    for insn, raw in zip(w.insns, body, strict=True):
        pairs.append((insn.address, DETOUR_AT + len(code)))
        code += raw
    pairs.append((w.end, DETOUR_AT + len(code)))
    code += jmp_rel32(DETOUR_AT + len(code), w.end)
    probe = dict(pairs)[w.probe_address]
    return Detour(DETOUR_AT, code, probe, len(NOP5), tuple(pairs))


def test_inner_branch_lands_on_its_copy() -> None:
    """`je L; nop; L:` relocated: the je goes to L's copy in the detour, not to L (int3)."""
    image, w = _window("branch-after", "inner")
    d = _detour(w)
    where = dict(d.insn_map)
    new = sweep(d.code, d.address).insns
    branches = [i for i in new if i.target is not None and i.target != w.end]
    assert branches
    for b in branches:
        assert b.target in {where[t] for t in w.internal_targets}
    assert verify_detour(image, w, d, (w.probe_address,)) is None


def test_rejects_a_branch_into_the_old_window() -> None:
    """What the relocator used to emit: the inner branch kept at its original target."""
    image, w = _window("branch-after", "inner")
    body: list[bytes] = []
    for insn in w.insns:
        raw = w.code[insn.address - w.start : insn.end - w.start]
        if insn.address == w.probe_address:
            raw = NOP5
        elif insn.target is not None:  # jcc rel8 -> jcc rel32 to the ORIGINAL address
            at = DETOUR_AT + sum(len(b) for b in body)
            raw = bytes([0x0F, 0x80 | (raw[0] & 0x0F)]) + \
                (insn.target - (at + 6)).to_bytes(4, "little", signed=True)
        body.append(raw)
    why = verify_detour(image, w, _rebuild(w, body), (w.probe_address,))
    assert why is not None


def test_rejects_a_changed_instruction() -> None:
    image, w = _window("branch-after", "inner")
    d = _detour(w)
    code = bytearray(d.code)
    last = sweep(d.code, d.address).insns[-2]  # the instruction before `jmp end`
    assert last.base_mnemonic.startswith("lea")
    code[last.end - d.address - 1] ^= 0x01  # lea disp8 +1 -> +0
    bad = Detour(d.address, bytes(code), d.probe_address, d.site_length, d.insn_map)
    why = verify_detour(image, w, bad, (w.probe_address,))
    assert why is not None and "differ" in why


def test_rejects_a_detour_that_skips_the_probe() -> None:
    image, w = _window("branch-after", "inner")
    d = _detour(w)
    # claim the probe is where no instruction starts: it is never reached
    pairs = tuple((o, n + 1 if o == w.probe_address else n) for o, n in d.insn_map)
    bad = Detour(d.address, d.code, d.probe_address + 1, d.site_length, pairs)
    why = verify_detour(image, w, bad, (w.probe_address,))
    assert why is not None and "probe" in why


def test_no_stale_code_between_sites() -> None:
    """A good detour, then a bad one at the same address: the bad one must be rejected
    (unicorn's translation cache once made it pass), and the good one accepted again."""
    image, w = _window("branch-after", "inner")
    good = _detour(w)
    code = bytearray(good.code)
    last = sweep(good.code, good.address).insns[-2]
    code[last.end - good.address - 1] ^= 0x01
    bad = Detour(good.address, bytes(code), good.probe_address, good.site_length,
                 good.insn_map)
    verifier = DetourVerifier()  # one verifier for the whole rewrite, as api.rewrite uses it
    assert verifier(image, w, good, (w.probe_address,)) is None
    assert verifier(image, w, bad, (w.probe_address,)) is not None
    assert verifier(image, w, good, (w.probe_address,)) is None


@pytest.mark.parametrize("name", ["branch-onnop", "forms-mixed", "args-clang"])
def test_window_ending_in_ret_is_checked(name: str) -> None:
    """`nop; ...; ret`: leaving through a random return address is the window's exit."""
    image, w = _window(name, "ret")
    d = _detour(w)
    assert verify_detour(image, w, d, (w.probe_address,)) is None
    # the same detour with the ret's popped address changed (ret -> ret $8) is rejected
    code = bytearray(d.code)
    ret = next(i for i in sweep(d.code, d.address).insns if i.base_mnemonic.startswith("ret"))
    off = ret.address - d.address
    code[off : off + 1] = b"\xc2\x08\x00"
    bad = Detour(d.address, bytes(code), d.probe_address, d.site_length,
                 tuple((o, n if n <= ret.address else n + 2) for o, n in d.insn_map))
    assert verify_detour(image, w, bad, (w.probe_address,)) is not None
