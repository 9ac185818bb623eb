"""`usdtpatch bench [--only trigger|jvm] [--iterations N] [--repeats R] [--jvm-calls N]
[--json] [--chart PNG]`: how much faster tracing is on this machine with 5-byte sites
(usdtpatch.live.bench.runner; the figures for this kind of machine are in docs/performance.md).

Deferred imports: integrate and report/bench.py, only when the bench runs (`usdtpatch
--help` imports every command's module).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import IO, Any

from usdtpatch import api
from usdtpatch.api import SYSTEM_JDK, UsdtpatchError
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE


def _positive(text: str) -> int:
    try:
        v = int(text.replace("_", ""))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from exc
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return v


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure traced and untraced probe cost on this machine "
                                     "(root; trigger program and OpenJDK workload)")
    p.add_argument("--only", choices=("trigger", "jvm"),
                   help="run one of the two workloads (default: both)")
    p.add_argument("--iterations", type=_positive, default=2_000_000, metavar="N",
                   help="trigger loop passes per run (default 2000000)")
    p.add_argument("--jvm-calls", type=_positive, default=2_000_000, metavar="N",
                   help="Java method calls per JVM run (default 2000000)")
    p.add_argument("--repeats", type=_positive, default=5, metavar="R",
                   help="interleaved rounds; figures are medians (default 5)")
    p.add_argument("--cc", default="cc", help="C compiler for the trigger program")
    p.add_argument("--jdk", type=Path, default=SYSTEM_JDK, metavar="DIR",
                   help=f"the JDK to copy (default {SYSTEM_JDK}; never modified)")
    p.add_argument("--workdir", type=Path, metavar="DIR",
                   help="keep builds and JDK copies here (reused by later runs) instead of "
                        "a temporary folder")
    p.add_argument("--json", action="store_true", help="print a versioned JSON document")
    p.add_argument("--chart", type=Path, metavar="PNG",
                   help="also draw the medians (needs matplotlib: pip install "
                        "'usdtpatch[chart]')")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from usdtpatch import integrate
    from usdtpatch.report.bench import bench_json, chart, print_bench

    def progress(msg: str) -> None:
        if not args.json and err.isatty():
            print(f"bench: {msg}", file=err)

    try:
        rep = api.bench(include_dir=integrate.include_dir(), iterations=args.iterations,
                        repeats=args.repeats, jvm_calls=args.jvm_calls,
                        trigger=args.only in (None, "trigger"),
                        jvm=args.only in (None, "jvm"), cc=args.cc, jdk=args.jdk,
                        workdir=args.workdir, progress=progress)
    except UsdtpatchError as exc:
        print(f"usdtpatch: {exc}", file=err)
        return EXIT_UNUSABLE
    if args.json:
        json.dump(bench_json(rep), out, indent=2)
        out.write("\n")
    else:
        print_bench(rep, out)
    if args.chart is not None:
        if chart(rep, args.chart):
            if not args.json:
                out.write(f"chart: {args.chart}\n")
        else:
            print("usdtpatch: bench: --chart needs matplotlib (pip install "
                  "'usdtpatch[chart]'); no chart written", file=err if err else sys.stderr)
            return EXIT_UNUSABLE
    return EXIT_OK
