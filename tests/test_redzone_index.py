"""Value ranges for the index registers of the red-zone analysis (issue 36): a leaf built
with -mno-red-zone (as red-zone-live's hint advises) whose stack array is indexed by a loop
counter was flagged red-zone-live, an error, because the index's sign was not known. The
analysis now follows the definitions that reach the index: a 32-bit write (zero-extended),
a zero extension, a mask, a right shift, a copy, or a small step added to one of these around
a loop keep it non-negative; an argument does not (tests/data/redzone/index.c: table_sum
clears, table_at stays flagged). Against the kernel: the cleared site, optimized, leaves the
program's output as it was."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cpu0_reason, pinned_to_cpu0
from tests.helpers import ROOT, build_programs
from usdtpatch.analysis.check import check
from usdtpatch.api import load

SOURCE = (ROOT / "tests" / "data" / "redzone" / "index.c").read_text()
FLAGS = ["-mno-red-zone", f"-I{ROOT / 'sdt_headers'}", "-DUSDTPATCH_REDZONE_GUARD=0"]
BUILDS = {f"{cc}-{o}": (cc, [f"-{o}", *FLAGS]) for cc in ("gcc", "clang")
          for o in ("O1", "O2", "O3", "Os")}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_programs(tmp_path_factory.mktemp("rzindex"), SOURCE, BUILDS, "index.c")


def _codes(path: Path) -> dict[str, set[str]]:
    report = check(load(str(path)))
    return {s.probe.name: {f.code for f in s.findings} for s in report.sites}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_counted_index_is_not_red_zone_live_an_argument_is(programs: dict[str, Path],
                                                             build: str) -> None:
    if build not in programs:
        pytest.skip(f"{BUILDS[build][0]} is not installed")
    codes = _codes(programs[build])
    assert "red-zone-live" not in codes["sum"], codes  # flagged before: a false error
    assert "red-zone-live" in codes["at"], codes  # table_at's index is its argument
    # an int counter, sign-extended (movslq) before each store: counted up from 0, not
    # negative (issue 47, item 12: flagged before); an int argument, sign-extended: flagged
    assert "red-zone-live" not in codes["intsum"], codes
    assert "red-zone-live" in codes["intat"], codes


def test_what_does_not_bound_an_index_is_rejected() -> None:
    """The rule on instructions made here: each definition that does not keep the register
    non-negative (a sign extension, a subtraction, a byte write, a call's result, an
    argument, a large step) leaves the store below %rsp possible."""
    from usdtpatch.analysis.hazards import nonnegative
    from usdtpatch.analysis.targets import _Graph
    from usdtpatch.x86.decode import sweep

    store = "48 89 14 cc"  # mov %rdx,(%rsp,%rcx,8)
    cases = {
        "31 c9": True,  # xor %ecx,%ecx
        "89 c1": True,  # mov %eax,%ecx
        "48 0f b6 c8": True,  # movzbq %al,%rcx
        "48 83 e1 0f": True,  # and $0xf,%rcx ... of an argument: masked
        "48 c1 e9 04": True,  # shr $4,%rcx
        "48 63 c8": False,  # movslq %eax,%rcx: sign-extended, of an argument
        "31 c0 48 63 c8": True,  # xor %eax,%eax; movslq %eax,%rcx: 0
        "b8 07 00 00 00 48 63 c8": True,  # mov $7,%eax; movslq: 7
        "b8 ff ff ff ff 48 63 c8": False,  # mov $-1,%eax; movslq: -1, a negative index
        "b8 00 00 00 80 48 63 c8": False,  # mov $0x80000000,%eax; movslq: negative
        "31 c0 83 e8 01 48 63 c8": False,  # xor %eax,%eax; sub $1,%eax; movslq: -1
        "89 f8 48 63 c8": False,  # mov %edi,%eax; movslq: an int argument
        "89 f8 83 e0 07 48 63 c8": True,  # mov %edi,%eax; and $7,%eax; movslq: masked
        "89 f8 d1 e8 48 63 c8": True,  # mov %edi,%eax; shr %eax; movslq: below 2^31
        "48 83 e9 01": False,  # sub $1,%rcx
        "88 c1": False,  # mov %al,%cl: the upper bits stay the argument's
        "48 89 f9": False,  # mov %rdi,%rcx: an argument
        "48 83 e1 f0": False,  # and $-16,%rcx: may stay negative
        "": False,  # %rcx as it arrived
        "e8 00 00 00 00": False,  # call: %rcx clobbered
        "31 c9 48 81 c1 00 00 01 00": False,  # a step of 64 KiB: not taken as bounded
    }
    for prefix, nonneg in cases.items():
        code = bytes.fromhex(prefix + store)
        insns = sweep(code, 0x1000).insns
        g = _Graph(insns, {0x1000})
        assert nonnegative(g, len(insns) - 1, "rcx", frozenset()) is nonneg, prefix


def test_a_loop_counter_is_followed_around_its_loop() -> None:
    from usdtpatch.analysis.hazards import nonnegative
    from usdtpatch.analysis.targets import _Graph
    from usdtpatch.x86.decode import sweep

    # xor %ecx,%ecx; L: mov %rdx,(%rsp,%rcx,8); add $1,%rcx; cmp $16,%rcx; jne L; ret
    ok = bytes.fromhex("31c9" "488914cc" "4883c101" "4883f910" "75f2" "c3")
    insns = sweep(ok, 0x1000).insns
    assert nonnegative(_Graph(insns, {0x1000}), 1, "rcx", frozenset())
    # the same loop entered with %rcx as the caller left it: not known
    bad = bytes.fromhex("488914cc" "4883c101" "4883f910" "75f4" "c3")
    insns = sweep(bad, 0x1000).insns
    assert not nonnegative(_Graph(insns, {0x1000}), 0, "rcx", frozenset())


def test_a_sign_extended_int_counter_is_followed_around_its_loop() -> None:
    """gcc's int loop counter: xor %eax,%eax; L: movslq %eax,%rdx; mov %rcx,(%rsp,%rdx,8);
    add $1,%eax; cmp $8,%eax; jne L: the stores' index is the counter counted up from 0, so
    its sign extension is not negative. Counted down from 0 (sub $1), it is."""
    from usdtpatch.analysis.hazards import nonnegative
    from usdtpatch.analysis.targets import _Graph
    from usdtpatch.x86.decode import sweep

    ok = bytes.fromhex("31c0" "4863d0" "48890cd4" "83c001" "83f808" "75f1" "c3")
    insns = sweep(ok, 0x1000).insns
    assert [i.mnemonic for i in insns][:3] == ["xorl", "movslq", "movq"]
    assert nonnegative(_Graph(insns, {0x1000}), 2, "rdx", frozenset())
    down = bytes.fromhex("31c0" "4863d0" "48890cd4" "83e801" "83f8f8" "75f1" "c3")
    insns = sweep(down, 0x1000).insns
    assert not nonnegative(_Graph(insns, {0x1000}), 2, "rdx", frozenset())


def _run(exe: Path) -> str:
    return subprocess.run([str(exe), "3000"], capture_output=True, text=True, timeout=60,
                          check=True, preexec_fn=pinned_to_cpu0).stdout


@pytest.mark.live
@pytest.mark.skipif(cpu0_reason() is not None, reason=cpu0_reason() or "")
def test_the_cleared_site_optimized_leaves_the_output_as_it_was(programs: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    from usdtpatch.live.perf import open_uprobe

    for build in ("gcc-O2", "clang-O2"):
        if build not in programs:
            continue
        exe = tmp_path / build
        shutil.copy2(programs[build], exe)
        site = next(s for s in check(load(str(exe))).sites if s.probe.name == "sum")
        assert site.outcome == "optimizable" and site.probe.offset is not None

        reference = _run(exe)
        probe = open_uprobe(str(exe), site.probe.offset, pid=-1, cpu=0)
        try:
            probed = _run(exe)
            hits = probe.count()
        finally:
            probe.close()
        assert hits == 3000 and probed == reference, (build, hits)
