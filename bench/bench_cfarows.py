"""check's and rewrite's cost in one function with a long call-frame program and many probes,
the function doubled (issue 46, class 8).

The function (`long_fde`, one FDE) repeats N times `push %rbx; <probe: nop>; add $1,%rax;
pop %rbx`, the CFA moving at each push and pop: 2N rows and N probes. Before, every site ran
the FDE's whole program again (the unwind-row questions of its window, the re-laid window's
rows, the detour's rows, the scan for unknown call frame instructions): probes x rows, and
doubling the function took 4x the time. Each FDE's rows are now computed once: the time must
grow linearly (ratio about 2, at most RATIO_LIMIT). Prints the medians of N and 2N (CPU
seconds) and the ratios, in-process (the file loaded anew each run), check and rewrite's plan
(`api.rewrite_plan`, without verification: the emulator's cost is per site anyway).

    .venv/bin/python -m bench.bench_cfarows [--n 750] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.common import machine_line

RATIO_LIMIT = 2.6  # 2N against N: linear is 2; probes x rows was 4

_NOTE = (".pushsection .note.stapsdt,\"?\",\"note\"\n.balign 4\n"
         ".4byte 2f-1f, 4f-3f, 3\n1: .asciz \"stapsdt\"\n2: .balign 4\n"
         "3: .8byte {pc}\n.8byte _.stapsdt.base\n.8byte 0\n"
         ".asciz \"cfa\"\n.asciz \"p{k}\"\n.asciz \"8@%rax\"\n4: .balign 4\n.popsection\n")


def write_asm(path: Path, n: int) -> None:
    """One function of n segments, each a push (the CFA moves), a probe, an add and a pop."""
    with path.open("w") as out:
        out.write(".section .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"
                  ".weak _.stapsdt.base\n.hidden _.stapsdt.base\n"
                  "_.stapsdt.base: .space 1\n.size _.stapsdt.base, 1\n.text\n"
                  ".globl long_fde\n.type long_fde, @function\n.balign 16\nlong_fde:\n"
                  ".cfi_startproc\n\tmov %rdi, %rax\n")
        for k in range(n):
            out.write("\tpush %rbx\n.cfi_adjust_cfa_offset 8\n"
                      f".Lp{k}: nop\n\tadd $1, %rax\n"
                      "\tpop %rbx\n.cfi_adjust_cfa_offset -8\n")
            out.write(_NOTE.format(pc=f".Lp{k}", k=k))
        out.write("\tret\n.cfi_endproc\n.size long_fde, .-long_fde\n")


def build(directory: Path, n: int) -> Path:
    """The shared library of `write_asm(n)`."""
    src, obj, out = (directory / f"cfa-{n}{ext}" for ext in (".s", ".o", ".so"))
    write_asm(src, n)
    subprocess.run(["as", "-o", str(obj), str(src)], check=True)
    subprocess.run(["ld", "-shared", "--eh-frame-hdr", "-o", str(out), str(obj)], check=True)
    return out


def median(run: Callable[[], object], runs: int) -> float:
    """Median CPU time of `run` (this process's: the machine is shared, and its wall time
    follows the other jobs), each run with the rows' memo emptied (every run computes them as
    a fresh process would)."""
    from usdtpatch.elf import ehframe

    # (an older tree, measured for comparison through PYTHONPATH, has no memo to empty)
    clear: Callable[[], None] = getattr(getattr(ehframe, "fde_rows", None), "cache_clear",
                                        lambda: None)
    times: list[float] = []
    for _ in range(runs):
        clear()
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=750, help="segments of the smaller function")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    from usdtpatch import api

    print(f"machine: {machine_line()}")
    with tempfile.TemporaryDirectory() as tmp:
        files = {n: build(Path(tmp), n) for n in (args.n, 2 * args.n)}
        got: dict[str, dict[int, float]] = {"check": {}, "rewrite plan": {}}
        api.check(files[args.n])  # the imports, once
        for n, path in files.items():
            got["check"][n] = median(partial(api.check, path), args.runs)
            got["rewrite plan"][n] = median(
                partial(api.rewrite_plan, path, verify=False, fork_guard="never"), args.runs)
    worst = 0.0
    for what, by in got.items():
        small, big = by[args.n], by[2 * args.n]
        ratio = big / small
        worst = max(worst, ratio)
        print(f"{what}: {args.n} probes, {2 * args.n} rows: {small:.2f} s CPU; "
              f"{2 * args.n} probes, {4 * args.n} rows: {big:.2f} s CPU; ratio {ratio:.2f} "
              f"(linear 2, limit {RATIO_LIMIT})")
    return 0 if worst <= RATIO_LIMIT else 1


if __name__ == "__main__":
    raise SystemExit(main())
