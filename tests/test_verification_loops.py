"""The equivalence check on the sites of debug builds and loops (issue 22).

Programs built here as other projects build their test programs (-O0
-fno-omit-frame-pointer, and -O2), with gcc and clang:
- `while (1)` loops that only probe: the window is the whole loop, or holds the loop's jump
  back to the probe. The original never leaves the window; the check compares both runs at
  the loop's back edge (the first return to an instruction already run).
- a probe followed by `mov -0x10(%rbp),%rax` (bpftrace's usdt_test): a random %rbp pointing
  at the code being patched made the two runs read different bytes (a false failure).
- a probe followed by `movl $imm,-0x48(%rbp)`: a random %rbp made the original write into its
  own window (self-modifying code the rewrite does not run), another false failure.
Each must be rewritten with the check on; hand-made wrong detours of the same windows must
still be rejected.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import build_programs
from usdtpatch.analysis.windows import PatchWindow
from usdtpatch.api import load, rewrite_plan
from usdtpatch.elf.image import ElfImage
from usdtpatch.rewriter.plan import Action, SiteDecision
from usdtpatch.verification.equivalence import _gprs, _new_pair, verify_detour
from usdtpatch.x86.nops import NOP5
from usdtpatch.x86.relocate import Detour, jmp_rel32

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]

SRC = r"""
#include <sys/sdt.h>
#include <sys/time.h>

static long myclock(void)
{
    struct timeval tv;
    gettimeofday(&tv, 0);
    DTRACE_PROBE2(t, first, tv.tv_sec, "Hello world");
    DTRACE_PROBE2(t, second, tv.tv_sec, "Hello world2");
    DTRACE_PROBE2(t, third, tv.tv_sec, "Hello world3");
    return tv.tv_sec;
}

__attribute__((noinline)) static void stores(void)
{
    volatile unsigned long a = 0xfffffffffffffff0UL;
    volatile unsigned int b = 0xf3f2f1f0U;
    DTRACE_PROBE1(t, s64, a);
    a = 0xf3f2f1f0U;
    DTRACE_PROBE1(t, s32, b);
    b = 0xf1f0U;
    DTRACE_PROBE1(t, s16, b);
}

int main(int argc, char **argv)
{
    (void)argv;
    if (argc > 2) {
        stores();
        return (int)myclock();
    }
    if (argc > 1)
        return 0;
    while (1) {
        DTRACE_PROBE(t, spin);
    }
    return 0;
}
"""

BUILDS = {
    "gcc-O0": ("gcc", ["-g", "-O0", "-fno-omit-frame-pointer", "-no-pie"]),
    "gcc-O2": ("gcc", ["-g", "-O2", "-no-pie"]),
    "clang-O0": ("clang", ["-g", "-O0", "-fno-omit-frame-pointer", "-no-pie"]),
    "clang-O2": ("clang", ["-g", "-O2", "-no-pie"]),
    "gcc-O0-pie": ("gcc", ["-g", "-O0", "-fno-omit-frame-pointer", "-fPIE", "-pie"]),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_programs(tmp_path_factory.mktemp("loops"), SRC, BUILDS, "loops.c")


def _decisions(path: Path) -> dict[str, SiteDecision]:
    return _plan(path)[1]


@pytest.mark.parametrize("name", list(BUILDS))
def test_every_site_converts_with_the_check(built: dict[str, Path], name: str) -> None:
    """The spin loop, the `mov -0x10(%rbp)` and `movl $imm,-0x48(%rbp)` sites: none is
    skipped, and none for a verification failure (each was, before the fix, at -O0)."""
    if name not in built:
        pytest.skip(f"no compiler for {name}")
    got = _decisions(built[name])
    assert set(got) == {"first", "second", "third", "s64", "s32", "s16", "spin"}
    bad = {n: (d.code, d.reason) for n, d in got.items() if d.action is Action.SKIPPED}
    assert bad == {}


@functools.cache
def _plan(path: Path) -> tuple[ElfImage, dict[str, SiteDecision]]:
    """The file's image and its decisions (one rewrite_plan per file for the module)."""
    rp = rewrite_plan(str(path), form="nop5", jobs=1)
    return load(str(path)).image, {d.probe.name: d for d in rp.sites}


def _site(path: Path, probe: str) -> tuple[ElfImage, PatchWindow, Detour]:
    image, decided = _plan(path)
    d = decided[probe]
    assert d.detour is not None and d.window is not None
    return image, d.window, d.detour


def _body(w: PatchWindow, d: Detour, change: dict[int, bytes]) -> Detour:
    """`d` laid out again with the instructions at the addresses in `change` replaced."""
    where = dict(d.insn_map)
    out = bytearray(d.code)
    for addr, raw in change.items():
        at = where[addr] - d.address
        ins = next(i for i in w.insns if i.address == addr)
        size = ins.size if addr != w.probe_address else len(NOP5)
        assert len(raw) <= size
        out[at:at + size] = raw + b"\x90" * (size - len(raw))
    return Detour(d.address, bytes(out), d.probe_address, d.site_length, d.insn_map)


@pytest.mark.parametrize("name", ["gcc-O0", "clang-O0"])
def test_spin_loop_is_compared_at_its_back_edge(built: dict[str, Path], name: str) -> None:
    """The loop's window is accepted; its detour with the probe's nop5 replaced by an
    instruction that changes a register is rejected (at the back edge: the original never
    leaves the window)."""
    if name not in built:
        pytest.skip(f"no compiler for {name}")
    image, w, d = _site(built[name], "spin")
    assert verify_detour(image, w, d, (w.probe_address,)) is None
    bad = _body(w, d, {w.probe_address: b"\x48\xff\xc0"})  # inc %rax
    why = verify_detour(image, w, bad, (w.probe_address,))
    assert why is not None and "rax" in why


def test_spin_loop_that_skips_the_probe_is_rejected(built: dict[str, Path]) -> None:
    """A detour whose loop never reaches the probe again (the probe's copy is a jmp to the
    window's end): rejected."""
    if "gcc-O0" not in built:
        pytest.skip("no gcc")
    image, w, d = _site(built["gcc-O0"], "spin")
    at = dict(d.insn_map)[w.probe_address]
    bad = _body(w, d, {w.probe_address: jmp_rel32(at, w.end)})
    assert verify_detour(image, w, bad, (w.probe_address,)) is not None


@pytest.mark.parametrize("seed", range(1, 9))
def test_frame_pointer_reads_never_alias_the_code(built: dict[str, Path], seed: int) -> None:
    """`nop; mov -0x10(%rbp),%rax` relocated: equivalent in every seed's 64 states (a random
    %rbp pointing at the patched window used to read `jmp`/int3 bytes in one run and the
    original instructions in the other)."""
    if "gcc-O0" not in built:
        pytest.skip("no gcc")
    for probe in ("second", "third", "s32", "s16"):
        image, w, d = _site(built["gcc-O0"], probe)
        assert verify_detour(image, w, d, (w.probe_address,), seed=seed) is None, probe


def test_changed_frame_offset_is_rejected(built: dict[str, Path]) -> None:
    """The same window with the load's displacement changed (-0x10 -> -0x18): rejected."""
    if "gcc-O0" not in built:
        pytest.skip("no gcc")
    image, w, d = _site(built["gcc-O0"], "second")
    load_insn = next(i for i in w.insns if i.address != w.probe_address
                     and "-0x10(%rbp)" in i.op_str)
    raw = bytearray(w.code[load_insn.address - w.start: load_insn.end - w.start])
    assert raw[-1] == 0xF0  # disp8 -0x10
    raw[-1] = 0xE8
    bad = _body(w, d, {load_insn.address: bytes(raw)})
    why = verify_detour(image, w, bad, (w.probe_address,))
    assert why is not None


def test_random_pointers_avoid_code_and_stack_frame(built: dict[str, Path]) -> None:
    """Register values drawn as pointers never land in an executable segment, and a pointer
    into the stack lies above the frame being run."""
    import random

    if "gcc-O0" not in built:
        pytest.skip("no gcc")
    image = load(str(built["gcc-O0"])).image
    pair = _new_pair(image)
    code = [(s.vaddr & ~0xFFF, (s.vaddr + s.memsz + 0xFFF) & ~0xFFF)
            for s in image.segments if s.type == 1 and s.flags & 1]
    assert code
    rng = random.Random(7)
    rsp = 0x7FFF_EFFF_0000
    values = [v for _ in range(2000) for v in _gprs(rng, pair, rsp)]
    for v in values:
        assert not any(lo <= v < hi for lo, hi in code), hex(v)
        assert not rsp - 0x1000 <= v < rsp + 0x100, hex(v)
    # and each kind is drawn: data pointers, stack pointers above the frame, small ints
    data = [(lo, hi) for lo, hi in pair.segments]
    assert sum(any(lo <= v < hi for lo, hi in data) for v in values) > len(values) // 8
    assert sum(rsp + 0x100 <= v < 0x7FFF_F000_0000 for v in values) > len(values) // 8
    assert sum(v < 1 << 32 for v in values) > len(values) // 8


SELF_READ_C = r"""
#include <sys/sdt.h>
int main(void)
{
    long v;
    STAP_PROBE(t, selfread);
    /* reads the 8 bytes from the probe's nop on: the bytes a rewrite changes */
    __asm__ __volatile__ ("movq -8(%%rip), %0" : "=r" (v));
    return (int)v;
}
"""


def test_a_window_reading_its_own_bytes_is_refused(tmp_path: Path) -> None:
    """A window that loads the bytes the rewrite changes (its own code) behaves differently
    once rewritten: no state can be judged, and the site is skipped, not converted."""
    src = tmp_path / "selfread.c"
    src.write_text(SELF_READ_C)
    exe = tmp_path / "selfread"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True, capture_output=True)
    (d,) = rewrite_plan(str(exe), form="nop5", jobs=1).sites
    assert d.action is Action.SKIPPED and d.code == "verification-failed"
    assert "could be judged" in d.reason
