"""Unwinding through rewritten code: gdb's `bt` from a breakpoint inside a detour shows the whole
caller chain, and C++ exceptions still reach their handlers in the rewritten cxx-throw.

The detour has its own FDE (the CFA rules in force at the original window, plus the guard's
128-byte step when it is guarded) in the new segment, indexed by a new `.eh_frame_hdr` with
the original `.eh_frame`'s FDEs (the runtime unwinder), and in `.debug_frame` (gdb); without
them gdb stops at the detour and the unwinder cannot find a handler for a throw through it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch.elf.image import ET_DYN, parse_elf

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gdb") is None or shutil.which("gcc") is None,
                                 reason="needs gdb and gcc")]

GDB_PIE_BASE = 0x555555554000  # where gdb (randomization off) loads a PIE executable

CHAIN_C = r"""
#include <stdio.h>
#include <sys/sdt.h>
volatile long sink;
__attribute__((noinline)) long inner(long x)
{
    long buf[6];
    for (int i = 0; i < 6; i++)
        buf[i] = x + i;
    asm volatile ("" :: "r" (buf) : "memory");
    STAP_PROBE2(chain, inner, x, buf[2]);
    asm volatile ("" ::: "memory");
    return buf[1] * buf[4];
}
__attribute__((noinline)) long middle(long x)
{
    long r = inner(x + 1);
    sink = r;
    return r + 1;
}
__attribute__((noinline)) long outer(long x)
{
    long r = middle(x * 2);
    sink = r;
    return r - 1;
}
int main(void)
{
    printf("%ld\n", outer(5));
    return 0;
}
"""


def _build(tmp_path: Path, flags: list[str]) -> Path:
    (tmp_path / "chain.c").write_text(CHAIN_C)
    exe = tmp_path / "chain"
    done = subprocess.run(["gcc", *flags, "-o", str(exe), str(tmp_path / "chain.c")],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot build the test program: {done.stderr.strip()[:200]}")
    return exe


def _frames(exe: Path, address: int) -> list[str]:
    """Function names of gdb's `bt` at a breakpoint on `address` (a link-time address)."""
    image = parse_elf(exe.read_bytes())
    runtime = address + (GDB_PIE_BASE if image.type == ET_DYN else 0)
    text = subprocess.run(["gdb", "-nx", "-batch", "-ex", f"break *{runtime:#x}", "-ex", "run",
                           "-ex", "bt", str(exe)], capture_output=True, text=True, timeout=60,
                          check=False).stdout
    assert "Breakpoint 1, " in text, text[-2000:]
    names = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split()
            names.append(parts[3] if parts[2] == "in" else parts[1])
    return names


CASES = [["-O2", "-fPIE", "-pie"], ["-O2", "-fno-pie", "-no-pie"], ["-O0"],
         ["-O2", "-fomit-frame-pointer", "-mno-red-zone"]]


@pytest.mark.parametrize("flags", CASES, ids=["O2-pie", "O2-nopie", "O0", "O2-noredzone"])
@pytest.mark.parametrize("guard", ["auto", "always", "never"])
def test_backtrace_from_inside_a_detour(flags: list[str], guard: str, tmp_path: Path) -> None:
    exe = _build(tmp_path, flags)
    out = tmp_path / "chain.rw"
    res = run_cli("rewrite", exe, "-o", out, "--redzone-guard", guard, "--json")
    assert res.rc == 0, res.err
    (site,) = json.loads(res.out)["files"][0]["sites"]
    assert site["action"] == "detour", site
    frames = _frames(out, site["new_pc"])
    # named as compilers name split parts, `inner.usdtpatch.0` (gdb drops the `.0`)
    assert frames[0].startswith("inner.usdtpatch"), frames
    assert frames[1:] == ["middle", "outer", "main"], frames


def test_backtrace_checker_sees_a_broken_chain(tmp_path: Path) -> None:
    """The same breakpoint in a rewrite whose `.debug_frame` (where gdb finds the detours'
    FDEs; it reads the original `.eh_frame` by name) is renamed away: the chain is cut."""
    exe = _build(tmp_path, ["-O2", "-fno-pie", "-no-pie"])
    out = tmp_path / "chain.rw"
    res = run_cli("rewrite", exe, "-o", out, "--json")
    assert res.rc == 0, res.err
    (site,) = json.loads(res.out)["files"][0]["sites"]
    data = bytearray(out.read_bytes())
    image = parse_elf(bytes(data))
    assert image.section(".debug_frame") is not None
    names = image.sections[int.from_bytes(data[0x3E:0x40], "little")]
    at = data.index(b".debug_frame\0", names.offset, names.offset + names.size)
    data[at + 1] = ord("x")  # .xebug_frame
    broken = tmp_path / "broken"
    broken.write_bytes(bytes(data))
    broken.chmod(0o755)
    frames = _frames(broken, site["new_pc"])
    assert frames[1:] != ["middle", "outer", "main"], frames


@pytest.mark.parametrize("guard", ["auto", "always", "never"])
def test_cxx_exception_reaches_its_handler(guard: str, tmp_path: Path) -> None:
    """cxx-throw: probes before a throwing call, in a try block, in a catch. The rewritten
    file prints what the original prints (every exception caught where it was)."""
    out = tmp_path / "cxx-throw"
    res = run_cli("rewrite", fixture("cxx-throw"), "-o", out, "--redzone-guard", guard,
                  "--json")
    assert res.rc == 0, res.err
    sites = {s["name"]: s for s in json.loads(res.out)["files"][0]["sites"]}
    assert sites["in_try"]["action"] == "detour"  # its window precedes a call that throws
    image = parse_elf(out.read_bytes())
    assert image.section(".eh_frame_hdr.orig") is not None  # the unwinder uses the new table
    want = subprocess.run([str(fixture("cxx-throw"))], capture_output=True, timeout=30,
                          check=False)
    got = subprocess.run([str(out)], capture_output=True, timeout=30, check=False)
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout)
    assert b"caught=" in got.stdout
