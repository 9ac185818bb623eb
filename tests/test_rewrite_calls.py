"""Windows that hold a call, and branch targets inside a window (issue 12, items 1 and 2).

Fixtures (fixtures/src): call-window (C, the only window holds `call step`), call-window-shstk
(the same, marked SHSTK), cxx-callwin (C++: the call throws inside try/catch, and in a noexcept
function), retarget (the instruction after the nop is the target of a rel8, a rel32 and a cold
part's jump; switch tables of 4-byte relative and 8-byte absolute entries land in the window).

- every site of each is rewritten, and the program prints what the original prints (with
  every call technique); the noexcept variant still ends in std::terminate;
- the call technique chosen per site (moved by default, emulated on request, never emulated in
  a SHSTK-marked file), the detour's own LSDA (its call-site row has the original landing pad),
  and a build without that LSDA misses the handler (so the LSDA is what makes it work);
- each way into a window from outside is retargeted (rel8 through a padding stub, rel32, both
  table kinds);
- the emulator rejects a moved call whose return address or callee is wrong, and a retargeted
  branch aimed at the wrong copy.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import fixture
from tests.test_fork_support import SRC
from usdtpatch import api
from usdtpatch.analysis.calls import EMULATED, MOVED, shadow_stack_marked
from usdtpatch.analysis.windows import REL8_STUB, REL32, TABLE4, TABLE8
from usdtpatch.elf.cfi import load_cfi, parse_lsda
from usdtpatch.elf.image import parse_elf
from usdtpatch.rewriter.build import build_rewrite
from usdtpatch.rewriter.plan import Action, RewritePlan, SiteDecision, Status, plan_rewrite
from usdtpatch.verification.equivalence import verify_detour
from usdtpatch.x86.relocate import Detour

FIXTURES = ["call-window", "call-window-shstk", "cxx-callwin", "retarget", "retarget-pie"]


def _run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(path), *args], capture_output=True, text=True, timeout=30,
                          check=False)


def _rewritten(name: str, tmp_path: Path, calls: str = "auto") -> tuple[Path, api.RewriteOutcome]:
    out = tmp_path / f"{name}.{calls}"
    o = api.rewrite(fixture(name), out, calls=calls)
    assert not o.failed
    return out, o


def _plan(name: str, calls: str = "auto") -> RewritePlan:
    return plan_rewrite(parse_elf(fixture(name).read_bytes()), verify=None, calls=calls)


def _site(plan: RewritePlan, name: str) -> SiteDecision:
    (d,) = [d for d in plan.sites if d.probe.name == name]
    return d


@pytest.mark.parametrize("calls", ["auto", "move", "emulate"])
@pytest.mark.parametrize("name", FIXTURES)
def test_every_site_rewritten_and_the_program_runs_like_the_original(
        name: str, calls: str, tmp_path: Path) -> None:
    out, o = _rewritten(name, tmp_path, calls)
    assert o.changed
    assert all(s.status is Status.REWRITTEN for s in o.sites), [s.reason for s in o.sites]
    want, got = _run(fixture(name)), _run(out)
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout)
    assert want.returncode == 0 and want.stdout


@pytest.mark.parametrize("calls", ["auto", "emulate"])
def test_noexcept_still_terminates(calls: str, tmp_path: Path) -> None:
    out, _ = _rewritten("cxx-callwin", tmp_path, calls)
    for path in (fixture("cxx-callwin"), out):
        res = _run(path, "terminate")
        assert res.returncode == -signal.SIGABRT, (path, res.returncode, res.stderr)
        assert "terminate called after throwing" in res.stderr
        assert "never:" not in res.stdout


def test_call_technique_per_site() -> None:
    assert not shadow_stack_marked(parse_elf(fixture("call-window").read_bytes()))
    assert shadow_stack_marked(parse_elf(fixture("call-window-shstk").read_bytes()))
    # the default emulates where the window allows: the callee sees its original return
    # address (issue 30, class 7); `move` moves it
    assert _site(_plan("call-window"), "each").calls == EMULATED
    assert _site(_plan("call-window", "move"), "each").calls == MOVED
    assert _site(_plan("call-window", "emulate"), "each").calls == EMULATED
    # a file marked for shadow stacks never gets an emulated call: the call is moved
    assert _site(_plan("call-window-shstk", "emulate"), "each").calls == MOVED
    # a site without a call in its window says nothing about calls
    assert _site(_plan("retarget"), "relbr").calls is None
    with pytest.raises(ValueError, match="calls must be one of"):
        _plan("call-window", "sometimes")


def test_cli_reports_the_technique(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    res = run_cli("rewrite", "--dry-run", "--json", "--calls", "emulate", fixture("cxx-callwin"))
    assert res.rc == 0, res.err
    import json

    sites = json.loads(res.out)["files"][0]["sites"]
    assert {s["name"]: s["calls"] for s in sites} == {"in_try": EMULATED,
                                                      "in_noexcept": EMULATED}
    assert all(s["retargeted"] == [] for s in sites)
    bad = run_cli("rewrite", "--dry-run", "--calls", "never", fixture("cxx-callwin"))
    assert bad.rc == 2


def test_moved_call_gets_an_lsda_with_the_original_landing_pad(tmp_path: Path) -> None:
    image = parse_elf(fixture("cxx-callwin").read_bytes())
    plan = plan_rewrite(image, verify=None, calls="move")
    d = _site(plan, "in_try")
    assert d.calls == MOVED and "LSDA" in d.reason
    assert d.window is not None and d.detour is not None
    (call,) = d.window.calls
    fde = load_cfi(image).lookup(call)
    assert fde is not None and fde.lsda is not None
    orig = [c for c in parse_lsda(image, fde.lsda, fde.pc_begin).call_sites
            if c.start <= call < c.end]
    assert orig and orig[0].landing_pad is not None

    out, _ = _rewritten("cxx-callwin", tmp_path, "move")
    new = parse_elf(out.read_bytes())
    dfde = load_cfi(new).lookup(d.detour.address)
    assert dfde is not None and dfde.pc_begin == d.detour.address and dfde.lsda is not None
    assert dfde.cie.personality is not None
    copy = dict(d.detour.insn_map)[call]
    rows = [c for c in parse_lsda(new, dfde.lsda, dfde.pc_begin).call_sites
            if c.start <= copy < c.end]
    assert [(r.landing_pad, r.action) for r in rows] == [(orig[0].landing_pad,
                                                           orig[0].action)]
    # the noexcept function's call is left out of its table: the detour's has no row for it
    e = _site(plan, "in_noexcept")
    assert e.detour is not None and e.window is not None
    efde = load_cfi(new).lookup(e.detour.address)
    assert efde is not None and efde.lsda is not None
    ecopy = dict(e.detour.insn_map)[e.window.calls[0]]
    assert not [c for c in parse_lsda(new, efde.lsda, efde.pc_begin).call_sites
                if c.start <= ecopy < c.end]


def test_without_the_detours_lsda_the_handler_is_missed(tmp_path: Path) -> None:
    plan = plan_rewrite(parse_elf(fixture("cxx-callwin").read_bytes()), verify=None,
                        calls="move")
    assert any(u.lsda is not None for u in plan.unwind)
    stripped = replace(plan, unwind=tuple(replace(u, lsda=None, personality=None)
                                          for u in plan.unwind))
    out = tmp_path / "no-lsda"
    out.write_bytes(build_rewrite(stripped))
    out.chmod(0o755)
    res = _run(out)
    assert res.returncode == -signal.SIGABRT  # the exception left tryloop uncaught
    good = tmp_path / "with-lsda"
    good.write_bytes(build_rewrite(plan))
    good.chmod(0o755)
    assert _run(good).stdout == _run(fixture("cxx-callwin")).stdout


def test_ways_in_are_retargeted() -> None:
    plan = _plan("retarget")
    relbr = _site(plan, "relbr")
    assert relbr.window is not None
    assert {r.how for r in relbr.window.retargets} == {REL8_STUB, REL32}
    assert any("rel8, via the stub" in w for w in relbr.retargeted)
    # the nop is the target of a jump from the .text.unlikely part: at the window's start,
    # where the `jmp` to the detour takes it, so that jump stays as it is
    assert relbr.window.start == relbr.probe.address
    assert all(r.target != relbr.window.start for r in relbr.window.retargets)
    # the instruction after it is also reached by a `jnz` of that part: retargeted (rel32)
    assert any(r.kind == "jump-from-other-part" and r.how == REL32
               for r in relbr.window.retargets)
    assert {r.how for r in _site(plan, "swtab").window.retargets} == {TABLE4}  # type: ignore
    assert {r.how for r in _site(plan, "swtab8").window.retargets} == {TABLE8}  # type: ignore
    # the PIE build: the 8-byte entries come from R_X86_64_RELATIVE relocations, whose addends
    # are rewritten with the entries
    pie = _site(_plan("retarget-pie"), "swtab8")
    assert {r.how for r in pie.window.retargets} == {TABLE8}  # type: ignore
    assert any("R_X86_64_RELATIVE addend" in w for w in pie.retargeted)


def _verify(plan: RewritePlan, name: str, detour: Detour | None = None,
            patches: tuple[tuple[int, bytes], ...] | None = None) -> str | None:
    d = _site(plan, name)
    assert d.window is not None and d.detour is not None
    from usdtpatch.rewriter.plan import Relocations, _entries, _retarget_patches

    det = detour or d.detour
    ways = _retarget_patches(plan.image, d.window, d.detour, [], Relocations(plan.image))
    got = patches if patches is not None else tuple((a, b) for a, _o, b, _w in ways)
    return verify_detour(plan.image, d.window, det, (d.probe.address,), runs=16,
                         patches=got, entries=_entries(d.window, d.detour))


def test_verifier_accepts_the_moved_call_and_rejects_a_wrong_one() -> None:
    plan = _plan("call-window", "move")
    assert _verify(plan, "each") is None
    d = _site(plan, "each")
    assert d.detour is not None and d.window is not None
    code = bytearray(d.detour.code)
    call_at = dict(d.detour.insn_map)[d.window.calls[0]] - d.detour.address
    assert code[call_at] == 0xE8
    code[call_at + 1] ^= 0x10  # the call goes elsewhere
    assert _verify(plan, "each", replace(d.detour, code=bytes(code))) is not None
    # the return address must be the detour's copy of the original one
    wrong = tuple((o, n + 1 if o == d.window.end else n) for o, n in d.detour.insn_map)
    why = _verify(plan, "each", Detour(d.detour.address, d.detour.code,
                                       d.detour.probe_address, d.detour.site_length, wrong))
    assert why is not None and "memory written differs" in why


def test_verifier_accepts_emulated_calls_and_rejects_a_wrong_return_address() -> None:
    plan = _plan("call-window", "emulate")
    d = _site(plan, "each")
    assert d.calls == EMULATED
    assert _verify(plan, "each") is None
    assert d.detour is not None and d.window is not None
    at = dict(d.detour.insn_map)[d.window.calls[0]] - d.detour.address
    code = bytearray(d.detour.code)
    assert code[at] == 0x50 and code[at + 1 : at + 3] == b"\x48\x8d"  # push; lea
    code[at + 4] ^= 0x01  # the lea's displacement: a return address one byte off
    why = _verify(plan, "each", replace(d.detour, code=bytes(code)))
    assert why is not None and "memory written differs" in why


def test_verifier_rejects_a_way_in_aimed_at_the_wrong_copy() -> None:
    plan = _plan("retarget")
    for name in ("relbr", "swtab"):
        assert _verify(plan, name) is None
        d = _site(plan, name)
        assert d.window is not None and d.detour is not None
        from usdtpatch.rewriter.plan import Relocations, _retarget_patches

        ways = _retarget_patches(plan.image, d.window, d.detour, [],
                                 Relocations(plan.image))
        bad = []
        for a, _o, b, _w in ways:
            n = int.from_bytes(b, "little", signed=True)
            bad.append((a, (n + 4).to_bytes(len(b), "little", signed=True)))  # past the copy
        why = _verify(plan, name, patches=tuple(bad))
        assert why is not None, name


@pytest.mark.parametrize("name", ["retarget", "retarget-pie", "cxx-callwin"])
def test_restore_undoes_the_patched_ways_in(name: str, tmp_path: Path) -> None:
    out, _ = _rewritten(name, tmp_path)
    back = tmp_path / "back"
    api.restore(out, back)
    assert back.read_bytes() == fixture(name).read_bytes()


def test_table_of_code_pointers_with_a_spilled_base_in_a_shared_object() -> None:
    """libpython's ceval dispatch (`mov (%rdi,%rdx,8),%rdx; jmp *%rdx`, %rdi reloaded from
    the stack): its targets are the function's R_X86_64_RELATIVE addends, and python:line's
    window avoids them."""
    lib = Path("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0")
    if not lib.exists():
        pytest.skip("needs Debian's libpython3.11")
    from usdtpatch.analysis.check import check
    from usdtpatch.elf.relocs import relative_relocations

    rep = check(api.load(lib))
    (sc,) = [s for s in rep.sites if s.probe.name == "line"]
    assert sc.window is not None and sc.window.window is not None, sc.window
    image = parse_elf(lib.read_bytes())
    fde = load_cfi(image).lookup(sc.probe.address)
    assert fde is not None
    labels = {a for a in relative_relocations(image).values() if fde.contains(a)}
    assert len(labels) > 100  # the opcode targets
    w = sc.window.window
    assert not [a for a in labels if w.start < a < w.end]


@pytest.mark.parametrize(("call", "jmp"), [
    (bytes.fromhex("e8 00 01 00 00"), "jmp 0x1106"),  # call rel32
    (bytes.fromhex("ff d0"), "jmpq *%rax"),  # call *%rax: %rax is back before the jmp
    (bytes.fromhex("ff 54 24 08"), "jmpq *0x10(%rsp)"),  # the pushed slot moved rsp by 8
    (bytes.fromhex("ff 15 00 10 00 00"), "jmpq *-0x"),  # call *X(%rip): still X
])
def test_emulated_call_encoding(call: bytes, jmp: str) -> None:
    from usdtpatch.x86.decode import sweep
    from usdtpatch.x86.relocate import Replacement, relocate_window

    start = 0x1000
    code = b"\x90" + call
    d = relocate_window(code, start, [Replacement(start, 1, bytes.fromhex("0f1f440000"))],
                        0x9000, frozenset({start + 1}))
    texts = [i.text for i in sweep(d.code, d.address).insns]
    ret = start + len(code)
    assert texts[1] == "pushq %rax"
    assert texts[2].startswith("leaq") and texts[3].startswith("xchgq")
    lea = sweep(d.code, d.address).insns[2]
    assert lea.rip_target == ret  # the original return address
    assert texts[4].startswith(jmp), texts
    if call[0] == 0xFF and call[1] == 0x15:
        orig = sweep(code, start).insns[1]
        assert sweep(d.code, d.address).insns[4].rip_target == orig.rip_target


def test_emulated_call_must_end_the_window() -> None:
    from usdtpatch.x86.relocate import RelocationError, Replacement, relocate_window

    code = b"\x90" + bytes.fromhex("e8 00 01 00 00") + b"\x90"
    with pytest.raises(RelocationError, match="last"):
        relocate_window(code, 0x1000, [Replacement(0x1000, 1, bytes.fromhex("0f1f440000"))],
                        0x9000, frozenset({0x1001}))


STUB_BEFORE_C = r"""
#include <stdio.h>
#include "custom_note.h"
/* pre: the nop and the instruction after it are reached by `jnz`/`jmp rel8` from more than
 * 64 bytes after the window (no window holds them), the function ends right where the next
 * one starts (no padding after it), and 16 int3 bytes of padding lie before it: the stub for
 * the instruction after the nop goes there */
asm(".text\n"
    ".globl before_pad\n.type before_pad, @function\n.p2align 4\n"
    "before_pad:\n.cfi_startproc\n\tret\n.cfi_endproc\n.size before_pad, .-before_pad\n"
    "\t.fill 16, 1, 0xcc\n"
    ".globl pre\n.type pre, @function\n"
    "pre:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n"
    "\ttest $1, %al\n\tjnz .Lpre_odd\n"
    ".Lpre_nop:\n990: nop\n"
    ".Lpre_after: add $3, %rax\n"
    "\tret\n"
    "\t.fill 60, 1, 0xcc\n"
    ".Lpre_odd: add $5, %rax\n\ttest $4, %al\n\tjnz .Lpre_nop\n\tjmp .Lpre_after\n"
    ".cfi_endproc\n.size pre, .-pre\n"
    ".globl next_fn\n.type next_fn, @function\n"
    "next_fn:\n.cfi_startproc\n\tret\n.cfi_endproc\n.size next_fn, .-next_fn\n"
    CN_NOTE("990b", "0", "stub", "pre", "8@%rax") CN_BASE);
long pre(long);
int main(void)
{
    long s = 0;
    for (long i = 0; i < 20; i++)
        s += pre(i) * (i + 1);
    printf("stub-before: s=%ld\n", s);
    return 0;
}
"""


@pytest.mark.needs_cc
def test_rel8_stub_in_the_padding_before_the_function(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    src = tmp_path / "pre.c"
    src.write_text(STUB_BEFORE_C)
    prog = tmp_path / "pre"
    inc = fixture("pie").parent.parent / "src"
    subprocess.run(["gcc", "-O2", "-fPIE", "-pie", "-g0", f"-I{inc}", "-o", str(prog),
                    str(src)], check=True, capture_output=True)
    plan = plan_rewrite(parse_elf(prog.read_bytes()), verify=None)
    d = _site(plan, "pre")
    assert d.window is not None
    stubs = [r for r in d.window.retargets if r.how == REL8_STUB]
    assert stubs and all(r.stub is not None and r.stub < d.window.function_start
                         for r in stubs), d.window.retargets
    out = tmp_path / "pre.rw"
    o = api.rewrite(prog, out)
    assert all(s.status is Status.REWRITTEN for s in o.sites), [s.reason for s in o.sites]
    assert _run(out).stdout == _run(prog).stdout


@pytest.fixture(scope="module")
def cxx_static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cxx-callwin linked -static: gcc writes no PT_GNU_EH_FRAME for a static link, so a
    detour's FDE cannot be written where the unwinder looks."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    out = tmp_path_factory.mktemp("cxxstatic") / "cxx-callwin-static"
    built = subprocess.run(["g++", "-O2", "-static", str(SRC / "cxx-callwin.cpp"), "-o",
                            str(out)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"g++ cannot link a static C++ program here: {built.stderr[-300:]}")
    return out


@pytest.mark.needs_cc
def test_static_link_emulates_the_call_and_the_exception_is_caught(cxx_static: Path,
                                                                   tmp_path: Path) -> None:
    """Without PT_GNU_EH_FRAME a moved call's exception would unwind into a detour with no
    FDE and end in std::terminate (it did: exit 134): the call is emulated (it returns to
    the original code), and with --calls move the window is refused, as check says."""
    out = tmp_path / "auto"
    o = api.rewrite(cxx_static, out)
    assert not o.failed
    (site,) = [s for s in o.sites if s.probe.name == "in_try"]
    assert site.status is Status.REWRITTEN and site.calls == EMULATED, site
    want, got = _run(cxx_static), _run(out)
    assert want.returncode == 0 and (got.returncode, got.stdout) == (0, want.stdout)
    plan = plan_rewrite(parse_elf(cxx_static.read_bytes()), verify=None, calls="move")
    moved = _site(plan, "in_try")
    assert moved.action is Action.SKIPPED and moved.code == "window-call-unwind", moved
    predicted = api.check(cxx_static, calls="move")
    (sc,) = [s for s in predicted.report.sites if s.probe.name == "in_try"]
    assert sc.blocked == "window-call-unwind"
