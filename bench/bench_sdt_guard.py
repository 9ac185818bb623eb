"""The red-zone guard's cost to an untraced probe pass: `sys/sdt.h` by default (the guard on)
against the same header with -DUSDTPATCH_REDZONE_GUARD=0 and against systemtap's header,
measured in the same run.

The loop program (written here, built three ways per shape) times its own loop with
clock_gettime, so only the loop is measured. Two shapes:

- `O2 call`: gcc -O2, a noinline function with one probe of two arguments, called in a loop
  (the arguments are in registers anyway: the guard adds its two `lea`s);
- `O0 leaf`: gcc -O0, the red-zone leaf of tests/data/sdt/redzone_leaf.c (locals in the
  red zone, the probe's arguments in memory): guarded, each argument is first loaded into a
  register (the "nr" constraint), so this is the guard's worst case.

Builds run interleaved (systemtap, unguarded, guarded, then again), RUNS times; medians of
the nanoseconds per pass, and the ratios of the medians.

    .venv/bin/python -m bench.bench_sdt_guard [--passes 50000000] [--runs 9] [--cpu N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, machine_line

SDT = ROOT / "sdt_headers"
VARIANTS = ("systemtap", "unguarded", "guarded")
FLAGS = {"systemtap": [], "unguarded": [f"-I{SDT}", "-DUSDTPATCH_REDZONE_GUARD=0"],
         "guarded": [f"-I{SDT}"]}

PROGRAM = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/sdt.h>

#ifdef SHAPE_LEAF
static unsigned long step(unsigned long i) {
  unsigned int magic = 0xdeadbeefu;
  unsigned int inc = 3u;
  unsigned long acc = i * 7ul;
  STAP_PROBE2(bench, step, i, acc);
  return ((unsigned long)magic << 32 | inc) + acc;
}
#else
__attribute__((noinline)) static unsigned long step(unsigned long i) {
  unsigned long acc = i * 7ul;
  STAP_PROBE2(bench, step, i, acc);
  return acc ^ (i >> 3);
}
#endif

int main(int argc, char **argv) {
  unsigned long n = strtoul(argv[1], NULL, 10), i, sum = 0;
  struct timespec a, b;
  (void)argc;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (i = 0; i < n; i++)
    sum += step(i);
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("%.0f %lu\n", (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec), sum);
  return 0;
}
"""

SHAPES = {"O2 call": ["-O2"], "O0 leaf": ["-O0", "-DSHAPE_LEAF"]}


def build(d: Path) -> dict[tuple[str, str], Path]:
    src = d / "loop.c"
    src.write_text(PROGRAM)
    out = {}
    for shape, sflags in SHAPES.items():
        for v in VARIANTS:
            exe = d / f"{shape.replace(' ', '-')}-{v}"
            subprocess.run(["gcc", *sflags, *FLAGS[v], str(src), "-o", str(exe)], check=True)
            out[(shape, v)] = exe
    return out


def ns_per_pass(exe: Path, passes: int, cpu: int | None = None) -> tuple[float, str]:
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    out = subprocess.run([str(exe), str(passes)], capture_output=True, text=True, check=True,
                         timeout=600, preexec_fn=pin).stdout.split()
    return float(out[0]) / passes, out[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_sdt_guard")
    ap.add_argument("--passes", type=int, default=50_000_000)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--cpu", type=int, default=None, help="run the loops pinned to this CPU")
    args = ap.parse_args(argv)
    if not shutil.which("gcc"):
        print("bench_sdt_guard: needs gcc", file=sys.stderr)
        return 2
    print(machine_line())
    pinned = "" if args.cpu is None else f", pinned to CPU {args.cpu}"
    print(f"{args.passes} passes per run, {args.runs} runs interleaved{pinned}; medians; "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="bench-sdt-guard-") as tmp:
        exes = build(Path(tmp))
        for shape in SHAPES:
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            sums = set()
            for _ in range(args.runs):
                for v in VARIANTS:
                    ns, total = ns_per_pass(exes[(shape, v)], args.passes, args.cpu)
                    times[v].append(ns)
                    sums.add(total)
            if len(sums) != 1:
                print(f"{shape}: the builds computed different results: {sums}",
                      file=sys.stderr)
                return 1
            med = {v: statistics.median(t) for v, t in times.items()}
            print(f"  {shape}: systemtap {med['systemtap']:.3f} ns, "
                  f"unguarded {med['unguarded']:.3f} ns, guarded {med['guarded']:.3f} ns; "
                  f"guarded/unguarded {med['guarded'] / med['unguarded']:.3f}, "
                  f"guarded/systemtap {med['guarded'] / med['systemtap']:.3f} "
                  f"(spread guarded {min(times['guarded']):.3f}-{max(times['guarded']):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
