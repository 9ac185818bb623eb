"""The plan and the emulator against the real kernel (root, Linux with the uprobe syscall).

A test program built here (gcc, systemtap's sys/sdt.h with the nop5 header trick) loops until
killed. Its maps are read before the first hit, the trampoline is predicted from them, a
uprobe is attached with perf_event_open, and the site is read through /proc/PID/mem: the
optimized bytes must equal the plan's, the trampoline must be where predicted, and after the
perf fd is closed the bytes must be the unoptimize end state. The red-zone program shows
which bytes below rsp the optimized path clobbers; the emulator must report the same ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Started, StartProcess
from tests.helpers import fixture
from tests.test_verification_machine import RED_ZONE_FIXTURES, leaf_results
from usdtpatch.api import load
from usdtpatch.live import procfs
from usdtpatch.live.perf import Uprobe, open_uprobe
from usdtpatch.sequences.plan import Plan, build_plan
from usdtpatch.sequences.trampoline import TRAMPOLINE_NAME, load_base_from_maps
from usdtpatch.verification.plans import PASS, verify_plan

pytestmark = [pytest.mark.live, pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None,
                                 reason="needs gcc to build the test programs")]

NOP5_TRICK = ("#include <sys/sdt.h>\n#undef _SDT_NOP\n"
              "#define _SDT_NOP .byte 0x0f; .byte 0x1f; .byte 0x44; .byte 0x00; .byte 0x00\n")

LOOP_C = NOP5_TRICK + r"""
#include <stdio.h>
#include <unistd.h>
volatile unsigned long counter;
__attribute__((noinline)) void site(unsigned long x)
{
    STAP_PROBE1(live, site, x);
    counter += x;
}
int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("ready\n");
    for (unsigned long i = 0;; i++) {
        site(i);
        usleep(500);
    }
}
"""

# The same loop with 32 KiB of text before the site: the free page above the executable is
# closer to the site than the one below it, so the kernel puts the trampoline above.
UP_C = LOOP_C.replace("volatile unsigned long counter;",
                      'asm(".text\\n.skip 0x8000, 0xcc\\n");\nvolatile unsigned long counter;')

# Two sites: the second one reuses the trampoline the first one's hit created.
TWO_C = LOOP_C.replace("    counter += x;\n}", """    counter += x;
}
__attribute__((noinline)) void second(unsigned long x)
{
    STAP_PROBE1(live, second, x);
    counter ^= x;
}""").replace("        site(i);", "        site(i);\n        second(i);")

# A leaf that fills [rsp-128, rsp) with a5, passes a nop5 probe, and copies the 128 bytes out;
# main prints the offsets (relative to rsp) it ever saw changed.
REDZONE_S = NOP5_TRICK + r"""
	.text
	.globl rz_probe
	.type rz_probe, @function
rz_probe:
	movabs $0xa5a5a5a5a5a5a5a5, %rax
	mov $-128, %rcx
1:	mov %rax, (%rsp,%rcx)
	add $8, %rcx
	jnz 1b
	mov $1, %eax	/* no register holds the a5 pattern at the probe: every write shows */
	STAP_PROBE(rz, site)
	mov $-128, %rcx
2:	mov (%rsp,%rcx), %rax
	mov %rax, 128(%rdi,%rcx)
	add $8, %rcx
	jnz 2b
	ret
	.size rz_probe, .-rz_probe
	.section .note.GNU-stack,"",@progbits
"""

REDZONE_MAIN_C = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
void rz_probe(unsigned char *out);
int main(void)
{
    unsigned char out[128], seen[128];
    memset(seen, 0, sizeof seen);
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("ready\n");
    for (;;) {
        rz_probe(out);
        int changed = 0;
        for (int i = 0; i < 128; i++)
            if (out[i] != 0xa5 && !seen[i]) { seen[i] = 1; changed = 1; }
        if (changed) {
            printf("clobbered");
            for (int i = 0; i < 128; i++)
                if (seen[i]) printf(" %d", i - 128);
            printf("\n");
        }
        usleep(500);
    }
}
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("live")
    (d / "loop.c").write_text(LOOP_C)
    (d / "up.c").write_text(UP_C)
    (d / "two.c").write_text(TWO_C)
    (d / "rz.S").write_text(REDZONE_S)
    (d / "rzmain.c").write_text(REDZONE_MAIN_C)
    for argv in (["gcc", "-O2", "-o", str(d / "loop"), str(d / "loop.c")],
                 ["gcc", "-O2", "-fno-toplevel-reorder", "-o", str(d / "up"), str(d / "up.c")],
                 ["gcc", "-O2", "-o", str(d / "two"), str(d / "two.c")],
                 ["gcc", "-O2", "-o", str(d / "redzone"), str(d / "rzmain.c"), str(d / "rz.S")]):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:  # e.g. no systemtap-sdt-dev: sys/sdt.h missing
            pytest.skip(f"cannot build the test program: {done.stderr.strip()[:200]}")
    return {"loop": d / "loop", "up": d / "up", "two": d / "two", "redzone": d / "redzone"}


def _launch(start_process: StartProcess, path: Path) -> Started:
    r = start_process([path], stdout=subprocess.PIPE)
    assert r.line(10) == "ready"
    return r


def _plan_from_process(path: Path, pid: int, fresh: bool = True) -> Plan:
    ps = load(str(path))
    maps = procfs.read_maps(pid)
    if fresh:
        assert not [m for m in maps if m.path == TRAMPOLINE_NAME], "trampoline before any hit"
    base = load_base_from_maps(ps.image, maps, str(path))
    assert base is not None
    return build_plan(ps, str(path), "nop5", base, "maps", maps, None, procfs.mmap_min_addr())


def _wait_bytes(pid: int, address: int, want: bytes, timeout: float = 5.0) -> bytes:
    deadline = time.monotonic() + timeout
    got = procfs.read_mem(pid, address, len(want))
    while got != want and time.monotonic() < deadline:
        time.sleep(0.005)
        got = procfs.read_mem(pid, address, len(want))
    return got


@pytest.mark.parametrize(("program", "direction"), [("loop", "below"), ("up", "above")])
def test_live_nop5_site_matches_plan(programs: dict[str, Path], start_process: StartProcess,
                                     program: str, direction: str) -> None:
    exe = programs[program]
    proc = _launch(start_process, exe)
    plan = _plan_from_process(exe, proc.pid)
    assert len(plan.sites) == 1
    site = plan.sites[0]
    seqs = site.sequences
    assert seqs is not None and seqs.optimize is not None and seqs.unoptimize is not None
    assert seqs.optimized is not None and site.file_offset is not None
    predicted = seqs.trampoline
    assert predicted is not None
    assert (predicted < site.address) == (direction == "below")
    assert procfs.read_mem(proc.pid, site.address, 5) == seqs.original
    uprobe: Uprobe | None = None
    try:
        uprobe = open_uprobe(str(exe), site.file_offset, proc.pid)
        got = _wait_bytes(proc.pid, site.address, seqs.optimized)
        assert got == seqs.optimized, f"site bytes {got.hex(' ')}"
        trampolines = [m.start for m in procfs.read_maps(proc.pid) if m.path == TRAMPOLINE_NAME]
        assert trampolines == [predicted]
        deadline = time.monotonic() + 5
        while uprobe.count() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert uprobe.count() > 0
    finally:
        if uprobe is not None:
            uprobe.close()
    got = _wait_bytes(proc.pid, site.address, seqs.unoptimize.end)
    assert got == seqs.unoptimize.end, f"after detach: {got.hex(' ')}"
    # measured fact the model relies on: the trampoline stays mapped after detach
    assert [m.start for m in procfs.read_maps(proc.pid) if m.path == TRAMPOLINE_NAME] == \
        [predicted]
    # and the emulator accepts the same plan
    assert [v.status for v in verify_plan(plan, load(str(exe)).image).verdicts] == [PASS]


def test_live_red_zone_matches_emulator(programs: dict[str, Path],
                                        start_process: StartProcess) -> None:
    exe = programs["redzone"]
    proc = _launch(start_process, exe)
    plan = _plan_from_process(exe, proc.pid)
    site = plan.sites[0]
    assert site.sequences is not None and site.file_offset is not None
    verdict = verify_plan(plan, load(str(exe)).image).verdicts[0]
    assert verdict.status == PASS
    assert [h.code for h in verdict.hazards] == ["optimized-call-clobbers-red-zone"]
    emulated = list(verdict.red_zone_writes)
    assert proc.line(0.3) is None, "red zone clobbered before any probe"
    uprobe: Uprobe | None = None
    line = None
    try:
        uprobe = open_uprobe(str(exe), site.file_offset, proc.pid)
        deadline = time.monotonic() + 20  # a loaded machine; the loop ends at the line
        while time.monotonic() < deadline:
            line = proc.line(deadline - time.monotonic())
            if line is not None and len(line.split()) - 1 >= len(emulated):
                break
        time.sleep(0.2)  # more hits: nothing beyond those bytes may show up
        while (more := proc.line(0.1)) is not None:
            line = more
    finally:
        if uprobe is not None:
            uprobe.close()
    assert line is not None and line.startswith("clobbered")
    live = [int(x) for x in line.split()[1:]]
    assert live == emulated == list(range(-32, 0))


@pytest.mark.parametrize(("name", "corrupted"), RED_ZONE_FIXTURES,
                         ids=[n for n, _ in RED_ZONE_FIXTURES])
def test_live_red_zone_fixture_agrees_with_emulator(tmp_path: Path, name: str,
                                                    corrupted: bool) -> None:
    """The fixture prints a checksum of 1000 calls; under a uprobe the real kernel changes it
    exactly when the emulator says the optimized site changes the function's result."""
    assert all((a != b) == corrupted for a, b in leaf_results(name))
    exe = tmp_path / name  # a private copy: the system-wide probe touches nobody else's runs
    shutil.copy2(fixture(name), exe)
    plain = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    ps = load(str(exe))
    offset = ps.probes[0].offset
    assert offset is not None and ps.probes[0].site.form.value == "nop5"
    probes: list[Uprobe] = []
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            probes.append(open_uprobe(str(exe), offset, -1, cpu))
        probed = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
        hits = sum(p.count() for p in probes)
    finally:
        for p in probes:
            p.close()
    assert hits == 1000
    assert (probed != plain) == corrupted, (plain, probed)


def test_live_second_site_reuses_the_trampoline(programs: dict[str, Path],
                                                start_process: StartProcess) -> None:
    exe = programs["two"]
    proc = _launch(start_process, exe)
    first = {s.probe: s for s in _plan_from_process(exe, proc.pid).sites}["live:site"]
    probes: list[Uprobe] = []
    try:
        assert first.sequences is not None and first.sequences.optimized is not None
        assert first.file_offset is not None
        probes.append(open_uprobe(str(exe), first.file_offset, proc.pid))
        assert _wait_bytes(proc.pid, first.address, first.sequences.optimized) == \
            first.sequences.optimized
        # plan again from the maps that now hold the trampoline: the second site reuses it
        plan = _plan_from_process(exe, proc.pid, fresh=False)
        second = {s.probe: s for s in plan.sites}["live:second"]
        s2 = second.sequences
        assert s2 is not None and s2.optimized is not None and second.file_offset is not None
        assert s2.trampoline == first.sequences.trampoline
        probes.append(open_uprobe(str(exe), second.file_offset, proc.pid))
        assert _wait_bytes(proc.pid, second.address, s2.optimized) == s2.optimized
        assert [m.start for m in procfs.read_maps(proc.pid) if m.path == TRAMPOLINE_NAME] == \
            [s2.trampoline]
    finally:
        for p in probes:
            p.close()
