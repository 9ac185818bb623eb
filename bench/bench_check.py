"""Benchmark: `check` on OpenJDK 17's libjvm.so (531 probes), target <= 3 s, with readelf's
time on the same file in the same run as a reference.

    .venv/bin/python bench/bench_check.py [FILE] [--runs N]

Prints the median of N runs of: the whole pipeline in-process (read, parse, list probes,
check), check() alone on an already-loaded ProbeSet, the CLI as a fresh process
(`usdtpatch check --summary`), and `readelf -n` / `readelf --debug-dump=frames` on the file.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from usdtpatch.cli.common import load  # noqa: E402
from usdtpatch.sites.check import check  # noqa: E402

LIBJVM = "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"
TARGET_S = 3.0


def median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_quiet(argv: list[str]) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default=LIBJVM)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    path = args.file
    if not Path(path).is_file():
        print(f"bench_check: {path}: not found (install openjdk-17-jre-headless)")
        return 2
    ps = load(path)
    report = check(ps)
    counts = report.outcome_counts()
    print(f"file: {path}")
    print(f"probes: {len(ps.probes)}; outcomes: "
          + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
          + (f"; blocked by reason: {report.blocked_counts()}" if report.blocked_counts() else ""))
    rows: list[tuple[str, float]] = [
        ("check pipeline in-process (read+parse+list+check)", median_time(
            lambda: check(load(path)), args.runs)),
        ("check() alone on a loaded ProbeSet", median_time(lambda: check(ps), args.runs)),
        ("usdtpatch check --summary (fresh process)", median_time(
            lambda: run_quiet([sys.executable, "-m", "usdtpatch", "check", "--summary",
                               "--fail-on", "never", path]), max(3, args.runs // 2))),
    ]
    readelf = shutil.which("readelf")
    if readelf:
        rows.append(("readelf -n (reference)", median_time(
            lambda: run_quiet([readelf, "-n", path]), args.runs)))
        rows.append(("readelf --debug-dump=frames (reference)", median_time(
            lambda: run_quiet([readelf, "--debug-dump=frames", path]), args.runs)))
    width = max(len(r[0]) for r in rows)
    print(f"median of {args.runs} runs:")
    for name, secs in rows:
        print(f"  {name:<{width}}  {secs:7.3f} s")
    pipeline = rows[0][1]
    verdict = "OK" if pipeline <= TARGET_S else "OVER TARGET"
    print(f"target: check <= {TARGET_S:.1f} s: {verdict} ({pipeline:.3f} s)")
    return 0 if pipeline <= TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
