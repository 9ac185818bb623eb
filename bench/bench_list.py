"""`usdtpatch list --json` against `readelf -n` on libjvm.so, and scaling on synthetic files.

Prints, from one run: the median wall time of both commands on OpenJDK 17's libjvm.so (531
probes) and their ratio (target: ours <= 0.3 s); then probes/s on synthetic binaries with N and
10*N probes (built by fixtures/gen_synthetic.py), to show that the cost grows no faster than the
probe count.

    .venv/bin/python -m bench.bench_list [--runs 9] [--probes 10000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench.common import ROOT, USDTPATCH, machine_line, median_seconds

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")


def synthetic(n: int) -> Path:
    """Build (once) the synthetic binary with n probes through the fixtures Makefile."""
    out = ROOT / "fixtures" / "build" / f"synthetic-{n}"
    if not out.exists():
        subprocess.run(["make", "-s", "-C", str(ROOT / "fixtures"), "synthetic", f"N={n}"],
                       check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--probes", type=int, default=10000)
    args = ap.parse_args(argv)
    print(f"machine: {machine_line()}")
    if LIBJVM.exists():
        ours = median_seconds([*USDTPATCH, "list", "--json", str(LIBJVM)], args.runs)
        ref = median_seconds(["readelf", "-n", str(LIBJVM)], args.runs)
        print(f"libjvm.so (531 probes): usdtpatch list --json median {ours:.3f} s; "
              f"readelf -n median {ref:.3f} s; ratio {ours / ref:.1f}x; "
              f"target <= 0.3 s: {'met' if ours <= 0.3 else 'MISSED'}")
    else:
        print(f"libjvm.so: {LIBJVM} not present, skipped")
    rates = []
    for n in (args.probes, 10 * args.probes):
        path = synthetic(n)
        t = median_seconds([*USDTPATCH, "list", "--json", str(path)], max(3, args.runs // 3))
        ref = median_seconds(["readelf", "-n", str(path)], max(3, args.runs // 3))
        rates.append(n / t)
        print(f"synthetic {n} probes: usdtpatch {t:.3f} s ({n / t:,.0f} probes/s); "
              f"readelf -n {ref:.3f} s; ratio {t / ref:.1f}x")
    print(f"probes/s at 10x the probes / at 1x: {rates[1] / rates[0]:.2f} "
          f"(>= ~1 means cost grows no faster than the probe count)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
