"""The emulator's kernel model, one behaviour at a time (docs/kernel.md, Linux 6.18)."""

from __future__ import annotations

import pytest

from tests.helpers import NOP5_GEN, fixture
from usdtpatch.api import load
from usdtpatch.sequences.plan import SitePlan, build_plan
from usdtpatch.sequences.trampoline import default_load_base
from usdtpatch.verification.machine import ARRIVAL_RSP, KernelState, Machine
from usdtpatch.x86.nops import NOP5


@pytest.fixture(scope="module")
def setup() -> tuple[Machine, SitePlan]:
    ps = load(str(fixture("nop5")))
    plan = build_plan(ps, "nop5", "nop5", default_load_base(ps.image))
    site = plan.sites[0]
    assert site.sequences is not None and site.sequences.trampoline is not None
    return Machine(ps.image, plan.load_base, {site.sequences.trampoline: NOP5_GEN.trampoline}), site


def test_original_nop_runs_through(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    r = m.run(site.entry, site.exit, site.address, NOP5, KernelState(True, 5))
    assert r.end_rip == site.exit and r.fault is None and not r.hits
    assert {k: v for k, v in r.regs.items() if k != "rip"} == \
        {k: v for k, v in m.arrival.items() if k != "rip"}


def test_int3_with_probe_is_a_hit_at_the_site(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    r = m.run(site.entry, site.exit, site.address, b"\xcc" + NOP5[1:], KernelState(True, 5))
    assert r.end_rip == site.exit and len(r.hits) == 1 and r.hits[0].via == "int3"
    assert r.hits[0].regs["rip"] == site.address and r.hits[0].regs["rsp"] == ARRIVAL_RSP
    assert r.stack_writes == ()


def test_int3_without_probe_is_sigtrap(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    r = m.run(site.entry, site.exit, site.address, b"\xcc" + NOP5[1:], KernelState(False, 5))
    assert r.fault is not None and "SIGTRAP" in r.fault


def test_int3_after_the_uprobe_is_gone_restarts(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    r = m.run(site.entry, site.exit, site.address, b"\xcc" + NOP5[1:],
              KernelState(False, 5, late=NOP5))
    assert r.end_rip == site.exit and r.fault is None and not r.hits
    assert m.read(site.address, 5) == NOP5


def test_optimized_call_reports_site_registers(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    assert site.sequences is not None and site.sequences.optimized is not None
    r = m.run(site.entry, site.exit, site.address, site.sequences.optimized,
              KernelState(True, 5))
    assert r.end_rip == site.exit and r.fault is None
    assert [h.via for h in r.hits] == ["syscall"]
    hit = r.hits[0].regs
    assert hit["rip"] == site.address and hit["rsp"] == ARRIVAL_RSP
    assert all(hit[n] == m.arrival[n] for n in ("rax", "rcx", "r11", "rbx", "rflags"))
    assert r.stack_writes == tuple(range(-32, 0))
    assert r.regs["rcx"] == m.arrival["rcx"] and r.regs["r11"] == m.arrival["r11"]


def test_parked_thread_returns_after_unoptimize(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    s = site.sequences
    assert s is not None and s.optimized is not None
    # call + push, push, push, mov: parked before the syscall; the site is restored meanwhile
    r = m.run(site.entry, site.exit, site.address, s.optimized, KernelState(True, 5),
              park=(5, NOP5, KernelState(False, 5)))
    assert r.end_rip == site.exit and r.fault is None and not r.hits
    assert r.regs["rsp"] == ARRIVAL_RSP and r.regs["rax"] == m.arrival["rax"]


def test_syscall_336_outside_a_trampoline_is_enxio(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    code = bytes.fromhex("48c7c050010000" "0f05")  # mov $336,%rax; syscall
    r = m.run(site.address, site.address + len(code), site.address, code, KernelState(True, 5))
    assert r.fault is None and r.regs["rax"] == (-6) & (2**64 - 1) and not r.hits


def test_other_syscall_is_a_fault(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    code = bytes.fromhex("48c7c03c000000" "0f05")  # mov $60,%rax; syscall (exit)
    r = m.run(site.address, site.address + len(code), site.address, code, KernelState(True, 5))
    assert r.fault is not None and "syscall 60" in r.fault


def test_memory_is_restored_after_a_stray_write(setup: tuple[Machine, SitePlan]) -> None:
    m, site = setup
    data = site.address + 0x3000  # somewhere in the file's mappings
    before = m.read(data & ~0xFFF, 64)
    code = bytes.fromhex("48b8") + (data & ~0xFFF).to_bytes(8, "little") + \
        bytes.fromhex("c60042")  # movabs $addr,%rax; movb $0x42,(%rax)
    r = m.run(site.address, site.address + len(code), site.address, code, KernelState(True, 5))
    assert r.fault is None and r.other_writes
    assert m.read(data & ~0xFFF, 64) == before


RED_ZONE_FIXTURES = [("redzone-leaf-nop5", True), ("redzone-leaf-nored", False),
                     ("redzone-nonleaf-nop5", False)]


def leaf_results(name: str, xs: tuple[int, ...] = (0, 5, 77)) -> list[tuple[int, int]]:
    """(unprobed, optimized-probe) return values of the fixture's probed function."""
    ps = load(str(fixture(name)))
    plan = build_plan(ps, name, "nop5", default_load_base(ps.image))
    site = plan.sites[0]
    s = site.sequences
    assert s is not None and s.trampoline is not None and s.optimized is not None
    probe = ps.probes[0]
    function = plan.load_base + probe.address - probe.function_offset
    m = Machine(ps.image, plan.load_base, {s.trampoline: NOP5_GEN.trampoline})
    out = []
    for x in xs:
        a = m.call(function, (x,), s.address, s.original, KernelState(True, 5))
        b = m.call(function, (x,), s.address, s.optimized, KernelState(True, 5))
        assert a.fault is None and b.fault is None and a.instructions_left
        assert not a.hits and len(b.hits) == 1
        out.append((a.regs["rax"], b.regs["rax"]))
    return out


@pytest.mark.parametrize(("name", "corrupted"), RED_ZONE_FIXTURES,
                         ids=[n for n, _ in RED_ZONE_FIXTURES])
def test_red_zone_fixture_functions(name: str, corrupted: bool) -> None:
    """The gcc -O2 leaf keeps buf[] below rsp across the probe: the optimized path changes
    its result; with -mno-red-zone, or in a non-leaf, it does not."""
    results = leaf_results(name)
    assert all((a != b) == corrupted for a, b in results), results
