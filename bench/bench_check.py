"""`usdtpatch check` against `readelf --debug-dump=frames` on OpenJDK 17's libjvm.so.

Prints, from one run: the median wall time of `readelf --debug-dump=frames` (the reference:
it reads every CIE and FDE of the file), `readelf -n`, `usdtpatch check` (the table, written to
/dev/null) and `usdtpatch check --json`, each a fresh process, the commands taking turns in every
round so that a busy machine slows all of them alike; then the ratios and the issue's target
(check at most 5x readelf --debug-dump=frames). `--profile` adds where check's own time goes
(the analysis in-process, on an already loaded file).

    .venv/bin/python -m bench.bench_check [--runs 9] [--profile] [--compare TREE] [FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.bench_list import medians, tree_env
from bench.common import USDTPATCH, machine_line

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
TARGET = 5.0  # check at most 5x readelf --debug-dump=frames


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", type=Path, default=LIBJVM)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--compare", type=Path, metavar="TREE",
                    help="also time `check` of another source tree, in the same rounds")
    args = ap.parse_args(argv)
    if not args.file.exists():
        print(f"bench_check: {args.file}: not present")
        return 2
    path = str(args.file)
    print(f"machine: {machine_line()}")
    commands = {"readelf --debug-dump=frames": ["readelf", "--debug-dump=frames", path],
                "readelf -n": ["readelf", "-n", path],
                "usdtpatch check (table)": [*USDTPATCH, "check", "--fail-on", "never", path],
                "usdtpatch check --json": [*USDTPATCH, "check", "--json", "--fail-on", "never",
                                           path]}
    envs: dict[str, dict[str, str] | None] = {}
    if args.compare is not None:
        commands["compared: check (table)"] = commands["usdtpatch check (table)"]
        envs["compared: check (table)"] = tree_env(args.compare)
        print(f"compared tree: {args.compare}")
    cpu: dict[str, float] = {}
    m = medians(commands, args.runs, envs, cpu)
    ref = m["readelf --debug-dump=frames"]
    cref = max(cpu["readelf --debug-dump=frames"], 1e-4)
    print(f"{path}: median of {args.runs} rounds (wall; CPU user+system)")
    for name, t in m.items():
        print(f"  {name:<28} {t:7.3f} s  {t / ref:6.2f}x readelf --debug-dump=frames;  "
              f"CPU {cpu[name]:6.3f} s {cpu[name] / cref:6.2f}x")
    ratio = m["usdtpatch check (table)"] / ref
    ok = ratio <= TARGET
    print(f"target check <= {TARGET:.0f}x readelf --debug-dump=frames: "
          f"{'met' if ok else 'MISSED'} ({ratio:.1f}x)")
    if args.profile:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from usdtpatch.analysis.check import check
        from usdtpatch.api import load

        t0 = time.perf_counter()
        ps = load(path)
        t1 = time.perf_counter()
        check(ps)
        t2 = time.perf_counter()
        print(f"in-process: load {t1 - t0:.3f} s, check() {t2 - t1:.3f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
