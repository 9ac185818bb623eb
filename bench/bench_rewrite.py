"""`usdtpatch rewrite`: how long a rewrite takes, and what a rewritten probe costs untraced.

1. Rewrite of OpenJDK 17's libjvm.so (531 sites): median wall time of the CLI without
   verification (target <= 5 s) and with the default verification (64 random states per
   site; target <= 30 s), next to references measured in the same run: `cp` of the file and
   `readelf -n` (binutils listing its notes).
2. Untraced cost per pass of a probe in a tight trigger loop (a C program built here with
   systemtap's sys/sdt.h, timing N iterations with clock_gettime inside the program): the
   original 1-byte-nop build, a build with a native nop5 (the `_SDT_NOP` trick), and the
   original rewritten with each form (nop5, combo5, combo10) and with the red-zone guard
   forced on. Medians of ns/pass, and ratios to the 1-byte build.

It prints figures; it is not a timed test.

    .venv/bin/python -m bench.bench_rewrite [--runs 5] [--verify-runs 3] [--iterations N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import USDTPATCH, machine_line, median_seconds

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
TARGET_NO_VERIFY = 5.0
TARGET_VERIFY = 30.0

NOP5_TRICK = ("#undef _SDT_NOP\n"
              "#define _SDT_NOP .byte 0x0f; .byte 0x1f; .byte 0x44; .byte 0x00; .byte 0x00\n")

LOOP_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/sdt.h>
%(trick)s
int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000000L;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        STAP_PROBE1(bench, trig, i);
        asm volatile ("" :: "r" (i) : "memory");
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%%.4f\n", ns / n);
    return 0;
}
"""


def _rewrite_times(runs: int, verify_runs: int) -> None:
    print(f"\nrewrite of {LIBJVM} ({LIBJVM.stat().st_size / 1e6:.1f} MB)")
    with tempfile.TemporaryDirectory(prefix="bench-rewrite-") as tmp:
        out = Path(tmp) / "libjvm.so"
        cp = median_seconds(["cp", str(LIBJVM), str(out)], runs=runs)
        readelf = median_seconds(["readelf", "-n", str(LIBJVM)], runs=runs)
        base = [*USDTPATCH, "rewrite", str(LIBJVM), "-o", str(out), "--json"]
        nov = median_seconds([*base, "--no-verify"], runs=runs)
        ver = median_seconds(base, runs=verify_runs, warmup=0)
        done = subprocess.run(base, capture_output=True, text=True, check=False)
        doc = json.loads(done.stdout)["files"][0]
    total = len(doc["sites"])
    converted = sum(1 for s in doc["sites"] if s["action"] != "skipped")
    print(f"  reference cp          {cp:8.3f} s")
    print(f"  reference readelf -n  {readelf:8.3f} s")
    print(f"  rewrite --no-verify   {nov:8.3f} s  (target <= {TARGET_NO_VERIFY:.0f} s: "
          f"{nov / TARGET_NO_VERIFY:.2f} of it; {nov / cp:.0f}x cp)")
    print(f"  rewrite (verified)    {ver:8.3f} s  (target <= {TARGET_VERIFY:.0f} s: "
          f"{ver / TARGET_VERIFY:.2f} of it; {ver / total * 1000:.0f} ms/site)")
    print(f"  sites converted       {converted}/{total} ({100 * converted / total:.1f}%): "
          f"{doc['counts']}")


def _build(folder: Path, name: str, trick: str) -> Path:
    src = folder / f"{name}.c"
    src.write_text(LOOP_C % {"trick": trick})
    exe = folder / name
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def _ns_per_pass(exe: Path, iterations: int, runs: int) -> float:
    vals = []
    for i in range(runs + 1):
        done = subprocess.run([str(exe), str(iterations)], capture_output=True, text=True,
                              check=True)
        if i:  # the first run warms up
            vals.append(float(done.stdout.strip()))
    return statistics.median(vals)


def _loop_costs(runs: int, iterations: int) -> None:
    print(f"\nuntraced cost per pass of a probe in a tight loop ({iterations} iterations, "
          f"median of {runs} runs, ns/pass)")
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        d = Path(tmp)
        variants: list[tuple[str, Path, str]] = []
        orig = _build(d, "orig", "")
        variants.append(("original (1-byte nop)", orig, ""))
        variants.append(("native nop5 (_SDT_NOP)", _build(d, "native", NOP5_TRICK), ""))
        for form in ("nop5", "combo5", "combo10"):
            for guard in ("auto", "always"):
                out = d / f"rw-{form}-{guard}"
                done = subprocess.run([*USDTPATCH, "rewrite", str(orig), "-o", str(out),
                                       "--form", form, "--redzone-guard", guard, "--json"],
                                      capture_output=True, text=True, check=False)
                site = json.loads(done.stdout)["files"][0]["sites"][0]
                how = f"{site['action']}" + (", guarded" if site["guarded"] else "")
                variants.append((f"rewritten {form}, guard {guard}", out, how))
        ref = None
        for label, exe, how in variants:
            ns = _ns_per_pass(exe, iterations, runs)
            ref = ns if ref is None else ref
            print(f"  {label:34} {ns:7.3f}  x{ns / ref:5.2f}  {how}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--verify-runs", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=200_000_000)
    ap.add_argument("--skip-libjvm", action="store_true")
    args = ap.parse_args(argv)
    if shutil.which("gcc") is None:
        print("bench_rewrite: needs gcc to build the trigger loop", file=sys.stderr)
        return 2
    print(machine_line())
    if args.skip_libjvm or not LIBJVM.exists():
        print(f"\n(libjvm rewrite skipped: {LIBJVM} "
              f"{'not installed' if not LIBJVM.exists() else 'not asked for'})")
    else:
        _rewrite_times(args.runs, args.verify_runs)
    _loop_costs(args.runs, args.iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
