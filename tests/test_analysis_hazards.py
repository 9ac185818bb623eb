"""Hazards: the red-zone analysis (fixtures and hand-made code), fork imports, arguments."""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers import REAL_BINARIES, fixture
from usdtpatch.analysis.check import check
from usdtpatch.analysis.functions import FunctionBounds
from usdtpatch.analysis.hazards import imported_fork_family, red_zone
from usdtpatch.analysis.probes import Probe
from usdtpatch.analysis.targets import ENTRY, FunctionCode, Target
from usdtpatch.api import load
from usdtpatch.elf.args import parse_args
from usdtpatch.x86.decode import sweep
from usdtpatch.x86.nops import SiteClass, SiteForm

BASE = 0x1000


@pytest.mark.parametrize(("name", "codes"), [
    ("redzone-leaf-nop5", {"red-zone-live"}),
    ("redzone-leaf", {"red-zone-rewrite", "arg-uses-rsp"}),
    ("redzone-leaf-nored", set()),
    ("redzone-nonleaf-nop5", set()),
])
def test_red_zone_fixtures_flag_exactly_the_unsafe_ones(name: str, codes: set[str]) -> None:
    r = check(load(str(fixture(name))))
    found = {f.code for f in r.all_findings if f.code.startswith(("red-zone", "arg-uses-rsp"))}
    assert found == codes
    (site,) = r.sites
    assert site.red_zone is not None
    assert site.red_zone.may_use == bool(codes)


def test_red_zone_live_is_an_error_with_evidence() -> None:
    r = check(load(str(fixture("redzone-leaf-nop5"))))
    (f,) = [f for f in r.all_findings if f.code == "red-zone-live"]
    assert f.severity.value == "error"
    assert "below %rsp" in f.message


def _probe(args: str = "") -> Probe:
    p = load(str(fixture("pie"))).probes[0]
    return dataclasses.replace(p, address=BASE + 0x40, args=parse_args(args))


def _fc(hexcode: str) -> FunctionCode:
    code = bytes.fromhex(hexcode)
    sw = sweep(code, BASE)
    bounds = FunctionBounds(BASE, BASE + len(code), "symbol", "f", None)
    return FunctionCode(bounds, sw.insns, tuple(i.address for i in sw.insns),
                        {BASE: Target(BASE, ENTRY, None)}, None, (), sw.bad)


@pytest.mark.parametrize(("code", "may"), [
    # movq %rdi, -8(%rsp); movq -8(%rsp), %rax; retq
    ("48897c24f8" "488b4424f8" "c3", True),
    # subq $0x18, %rsp; movq %rdi, 8(%rsp); addq $0x18, %rsp; retq
    ("4883ec18" "48897c2408" "4883c418" "c3", False),
    # pushq %rbp; movq %rsp, %rbp; movl %edi, -0x14(%rbp); popq %rbp; retq   (-O0 leaf)
    ("55" "4889e5" "897dec" "5d" "c3", True),
    # pushq %rbp; movq %rsp, %rbp; subq $0x20, %rsp; movl %edi, -0x14(%rbp); leave; retq
    ("55" "4889e5" "4883ec20" "897dec" "c9" "c3", False),
    # pushq %rbp; movq %rsp, %rbp; pushq %rbx; subq $8, %rsp; movq -8(%rbp), %rbx; leave;
    # retq  (libjvm's jni_DetachCurrentThread shape: -8(%rbp) is the pushed %rbx, reserved)
    ("55" "4889e5" "53" "4883ec08" "488b5df8" "c9" "c3", False),
    # the same reading 0x18 below the frame pointer: deeper than the 16 bytes reserved
    ("55" "4889e5" "53" "4883ec08" "488b5de8" "c9" "c3", True),
    # leaq -0x60(%rsp), %rax; retq   (the address of red-zone memory escapes)
    ("488d4424a0" "c3", True),
    # movq %rsp, %rax; movq %rdi, -8(%rax); retq
    ("4889e0" "488978f8" "c3", True),
    # movq %rdi, %rax; addq $1, %rax; retq
    ("4889f8" "4883c001" "c3", False),
    # bytes that do not decode: nothing is proven
    ("4889f8" "0f0b" "ffff" "c3", True),
], ids=["leaf-store-below", "lowers-first", "O0-leaf-frame", "O0-frame-reserved",
        "frame-pushed-slot", "frame-below-reserved", "lea-below", "copy-of-rsp", "no-stack",
        "undecodable"])
def test_red_zone_analysis(code: str, may: bool) -> None:
    assert red_zone(_fc(code), _probe()).may_use is may


def test_red_zone_argument_below_rsp_is_evidence_enough() -> None:
    fc = _fc("4889f8" "c3")
    assert not red_zone(fc, _probe("8@%rdi")).may_use
    rz = red_zone(fc, _probe("8@-16(%rsp)"))
    assert rz.may_use and "-16(%rsp)" in rz.reason


def test_unknown_bounds_means_may() -> None:
    assert red_zone(None, _probe()).may_use


@pytest.mark.parametrize(("name", "names"), [
    ("fork", {"fork"}),
    ("nofork", set()),
    ("pie", set()),
])
def test_fork_imports(name: str, names: set[str]) -> None:
    ps = load(str(fixture(name)))
    assert set(imported_fork_family(ps.image)) == names
    codes = {f.code for f in check(ps).all_findings}
    assert ("process-can-fork" in codes) == bool(names)


def test_fork_severity_follows_exposure() -> None:
    (f,) = [f for f in check(load(str(fixture("fork")))).all_findings
            if f.code == "process-can-fork"]
    assert f.severity.value == "error"  # its nop5 site is optimized as it is


def test_python_imports_fork() -> None:
    path = REAL_BINARIES["python3.11"]
    if not path.exists():
        pytest.skip(f"{path} not installed")
    assert {"fork", "vfork"} <= set(imported_fork_family(load(str(path)).image))


def test_rip_relative_argument_of_a_moved_probe() -> None:
    r = check(load(str(fixture("args-O2"))))
    rip = [s for s in r.sites if any(a.kind == "rip-relative" for a in s.probe.args)]
    assert rip
    for s in rip:
        moved = s.outcome in ("forward", "backward")
        assert ("arg-uses-rip" in {f.code for f in s.findings}) == moved


def test_guarded_site_is_safe_even_in_a_red_zone_leaf() -> None:
    """usdtpatch's sdt.h guard: lea -0x80(%rsp),%rsp; nop5; lea 0x80(%rsp),%rsp."""
    store = "48897c24f8"  # movq %rdi, -8(%rsp): the function does use the red zone
    guard_in, nop5, guard_out = "488d642480", "0f1f440000", "488da42480000000"
    site = SiteClass(SiteForm.NOP5, 5, 5)
    probe = dataclasses.replace(_probe(), address=BASE + 10, site=site)
    guarded = red_zone(_fc(store + guard_in + nop5 + guard_out + "c3"), probe)
    assert not guarded.may_use and "wrapped" in guarded.reason
    # half a guard is no guard
    unguarded = red_zone(_fc(store + guard_in + nop5 + "9090909090909090" + "c3"), probe)
    assert unguarded.may_use
    # and a function that only adjusts %rsp with lea does not use the red zone
    assert not red_zone(_fc("488d642480" + "488da42480000000" + "c3"), _probe()).may_use


def test_a_stack_memo_gives_each_probe_the_answer_of_a_fresh_walk() -> None:
    from usdtpatch.analysis.hazards import StackMemo

    memo = StackMemo()
    store = _fc("48c744248000000000" + "90" + "c3")  # mov $0,-0x80(%rsp)
    clean = _fc("90" + "c3")
    for fc in (store, clean, store, clean):
        for probe in (_probe(), _probe("8@%rdi")):
            assert red_zone(fc, probe, memo) == red_zone(fc, probe)
    assert red_zone(store, _probe(), memo).may_use and not red_zone(clean, _probe(), memo).may_use
