"""Rewritten files on the real kernel (root, the uprobe PMU, the uprobe syscall 336).

- Every site the rewrite moved to a nop5 becomes `call` (e8) into `[uprobes-trampoline]` once
  probed (a counting perf uprobe at the site's file offset in the rewritten file, the bytes read
  from /proc/PID/mem), and is a NOP again after the probe is closed.
- bpftrace reads the same argument values from the rewritten file as from the original.
- The red-zone fixture: guarded, the optimized probe leaves the program's result alone;
  with `--redzone-guard never`, the same probe corrupts it (so the guard is the fix).

Skipped with the reason where root, the uprobe syscall, gcc or bpftrace is missing. Every
process is stopped by pid and every probe closed in a finally block.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    assert_optimized_after_hits,
    cpu0_reason,
    pinned_to_cpu0,
    runtime_address,
    started,
)
from tests.helpers import (
    bpftrace_lines,
    bpftrace_original_and_rewritten,
    fixture,
    readelf_sdt_notes,
    run_cli,
)
from usdtpatch.analysis.forms import Form
from usdtpatch.elf.image import parse_elf
from usdtpatch.live.perf import open_uprobe
from usdtpatch.live.procfs import read_mem
from usdtpatch.sequences.trampoline import TRAMPOLINE_NAME
from usdtpatch.x86.nops import NOP5

TRAMPOLINE = TRAMPOLINE_NAME


pytestmark = [pytest.mark.live,
              pytest.mark.skipif(cpu0_reason() is not None, reason=cpu0_reason() or "")]

# stock sys/sdt.h (1-byte nops), several site shapes, looping until killed
LOOP_C = r"""
#include <stdio.h>
#include <unistd.h>
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
volatile unsigned long counter;
/* every note records a semaphore; only `guarded` tests it before its probe */
unsigned short loop_plain_semaphore __attribute__((section(".probes"))) = 0;
unsigned short loop_leaf_semaphore __attribute__((section(".probes"))) = 0;
unsigned short loop_guarded_semaphore __attribute__((section(".probes"))) = 0;
__attribute__((noinline)) void plain(unsigned long x)
{
    STAP_PROBE1(loop, plain, x);
    counter += x;
}
__attribute__((noinline)) long leaf(long x)
{
    long buf[8];
    for (int i = 0; i < 8; i++)
        buf[i] = x * (i + 1);
    asm volatile ("" :: "r" (buf) : "memory");
    STAP_PROBE2(loop, leaf, x, buf[3]);
    asm volatile ("" ::: "memory");
    return buf[3] + buf[7];
}
__attribute__((noinline)) void guarded(unsigned long x)
{
    if (__builtin_expect(loop_guarded_semaphore, 0))
        STAP_PROBE1(loop, guarded, x);
    counter ^= x;
}
int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("ready\n");
    for (unsigned long i = 0;; i++) {
        plain(i);
        counter += leaf((long)i);
        guarded(i);
        usleep(300);
    }
}
"""


@pytest.fixture(scope="module")
def loop_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the looping test program")
    d = tmp_path_factory.mktemp("loop")
    (d / "loop.c").write_text(LOOP_C)
    done = subprocess.run(["gcc", "-O2", "-o", str(d / "loop"), str(d / "loop.c")],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot build the looping program: {done.stderr.strip()[:200]}")
    return d / "loop"


def _rewrite(src: Path, out: Path, *opts: str) -> dict[str, object]:
    res = run_cli("rewrite", src, "-o", out, "--json", *opts)
    assert res.rc in (0, 1), res.err
    doc = json.loads(res.out)["files"][0]
    assert isinstance(doc, dict)
    return doc


@pytest.mark.needs_cc
@pytest.mark.parametrize("form", ["nop5", "combo5"])
def test_rewritten_sites_become_calls_into_the_trampoline(loop_program: Path, form: str,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "loop"
    doc = _rewrite(loop_program, out, "--form", form)
    sites = [s for s in doc["sites"] if s["action"] in ("detour", "in-place")]  # type: ignore
    assert len(sites) == 3, doc["sites"]
    image = parse_elf(out.read_bytes())
    skip = Form(form).optimized_offset  # combo5: libbpf attaches at pc + 1, on the nop5
    offsets = {}
    for s in sites:
        off = image.vaddr_to_offset(s["new_pc"] + skip)
        assert off is not None
        assert out.read_bytes()[off : off + 5] == NOP5
        offsets[s["name"]] = off
    addr: dict[str, int] = {}
    with started([out], stdout=subprocess.PIPE) as proc:
        probes = []
        try:
            assert proc.line(10) == "ready"
            addr = {n: runtime_address(proc.pid, out, o) for n, o in offsets.items()}
            sems = {x.name: image.vaddr_to_offset(x.semaphore) for x in readelf_sdt_notes(out)}
            for n, o in offsets.items():
                # the guarded probe runs only with its semaphore raised: attach with ref_ctr
                sem = sems[n]
                assert sem is not None
                probes.append(open_uprobe(str(out), o, pid=proc.pid, ref_ctr_offset=sem))
            assert_optimized_after_hits(proc.pid, addr, probes)
        finally:
            for p in probes:
                p.close()
        assert proc.proc.poll() is None, "the program died while probed"
        for n, a in addr.items():  # detached: NOPs again
            assert read_mem(proc.pid, a, 5) == NOP5, n


BPFTRACE_FIXTURES = ["pie", "args-O2", "args-clang", "redzone-leaf", "sema-explicit",
                     "branch-after"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize("name", BPFTRACE_FIXTURES)
def test_bpftrace_reads_the_same_arguments(name: str, tmp_path: Path) -> None:
    def rewrite(orig: Path, out: Path) -> None:
        assert _rewrite(orig, out)["changed"]

    want, got = bpftrace_original_and_rewritten(name, tmp_path, rewrite)
    assert want, "bpftrace saw no probe hit in the original"
    assert got == want


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
def test_bpftrace_without_the_guard_reads_clobbered_red_zone_args(tmp_path: Path) -> None:
    """args-clang passes arguments below rsp: unguarded, the optimized call overwrites them
    before bpftrace reads them (the first hit, on the int3 path, is still right)."""
    orig = tmp_path / "orig" / "args-clang"
    orig.parent.mkdir()
    shutil.copy2(fixture("args-clang"), orig)
    out = tmp_path / "never" / "args-clang"
    out.parent.mkdir()
    _rewrite(orig, out, "--redzone-guard", "never")
    assert bpftrace_lines(out) != bpftrace_lines(orig)


CALLS = 1000  # redzone.c calls leaf() 1000 times


def _pinned(path: Path) -> str:
    res = subprocess.run([str(path)], capture_output=True, text=True, timeout=60, check=True,
                         preexec_fn=pinned_to_cpu0)
    return res.stdout


@pytest.mark.parametrize(("guard", "corrupted"), [("auto", False), ("always", False),
                                                  ("never", True)])
def test_red_zone_leaf_probed(guard: str, corrupted: bool, tmp_path: Path) -> None:
    """redzone-leaf (1-byte nop, live data below rsp) rewritten to nop5 and probed with a
    system-wide uprobe on CPU 0: with the guard the result is right, without it, wrong."""
    out = tmp_path / "redzone-leaf"
    doc = _rewrite(fixture("redzone-leaf"), out, "--redzone-guard", guard)
    sites = doc["sites"]
    assert isinstance(sites, list) and len(sites) == 1
    site: dict[str, Any] = sites[0]
    assert site["action"] == "detour" and site["guarded"] == (guard != "never")
    off = parse_elf(out.read_bytes()).vaddr_to_offset(site["new_pc"])
    assert off is not None
    reference = _pinned(fixture("redzone-leaf"))
    assert _pinned(out) == reference  # unprobed
    probe = open_uprobe(str(out), off, pid=-1, cpu=0)
    try:
        probed = _pinned(out)
        hits = probe.count()
    finally:
        probe.close()
    assert hits == CALLS
    assert (probed != reference) == corrupted, (probed, reference)
    assert _pinned(out) == reference  # detached
