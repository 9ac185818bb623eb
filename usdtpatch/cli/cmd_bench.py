"""`usdtpatch bench [--only trigger|jvm] [--iterations N] [--repeats R] [--jvm-calls N]
[--json] [--chart PNG]`: how much faster tracing is on this machine with 5-byte sites
(usdtpatch.live.bench.runner; the figures for this kind of machine are in docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import IO, Any, Literal

from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE
from usdtpatch.errors import UsdtpatchError
from usdtpatch.live.bench.runner import JVM_REFERENCE, REFERENCE, SYSTEM_JDK, BenchReport, Row


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


def _table(title: str, rows: list[Row], jvm: bool, out: IO[str]) -> None:
    from usdtpatch.report.render import render_table

    names = ["variant", "site bytes", "hits", "M hits/s traced", "x ref (rounds)"]
    names += (["wall s traced", "wall s untraced", "x ref untraced"] if jvm else
              ["ns/hit traced", "ns/pass untraced", "x ref untraced"])
    columns: list[tuple[str, Literal["left", "right"]]] = [
        (n, "left" if n in ("variant", "site bytes") else "right") for n in names]
    cells: list[list[str]] = []
    for r in rows:
        lo, hi = r.ratio_traced_range
        row = [r.name, r.site, str(r.hits), f"{r.traced_hits_per_s / 1e6:.3f}",
               f"{r.ratio_traced:.2f} ({lo:.2f}-{hi:.2f})"]
        if jvm:
            row += [f"{r.traced_wall_s or 0:.2f}", f"{r.untraced_wall_s or 0:.2f}",
                    f"{r.ratio_untraced:.2f}"]
        else:
            row += [f"{r.traced_ns_per_hit:.1f}", f"{r.untraced_ns_per_pass:.2f}",
                    f"{r.ratio_untraced:.2f}"]
        cells.append(row)
    render_table(out, title, columns, cells)


def render(rep: BenchReport, out: IO[str]) -> None:
    out.write(f"Linux {rep.kernel}, {rep.cpu}; medians of {rep.repeats} interleaved "
              f"round(s); x ref = median of the per-round ratios to the reference (lowest-"
              f"highest round); untraced: time ratio, below 1 is faster\n")
    if rep.trigger:
        _table(f"trigger program, {rep.iterations} passes per run (x ref: against "
               f"{REFERENCE})", rep.trigger, False, out)
    if rep.jvm:
        _table(f"OpenJDK 17, Bench.java, {rep.jvm_calls} calls per run (x ref: against "
               f"{JVM_REFERENCE})", rep.jvm, True, out)
    for n in rep.notes:
        out.write(f"note: {n}\n")


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from usdtpatch.live.bench.runner import bench, chart

    def progress(msg: str) -> None:
        if not args.json and err.isatty():
            print(f"bench: {msg}", file=err)

    try:
        rep = bench(iterations=args.iterations, repeats=args.repeats,
                    jvm_calls=args.jvm_calls, trigger=args.only in (None, "trigger"),
                    jvm=args.only in (None, "jvm"), cc=args.cc, jdk=args.jdk,
                    workdir=args.workdir, progress=progress)
    except UsdtpatchError as exc:
        print(f"usdtpatch: {exc}", file=err)
        return EXIT_UNUSABLE
    if args.json:
        json.dump(rep.to_json(), out, indent=2)
        out.write("\n")
    else:
        render(rep, out)
    if args.chart is not None:
        if chart(rep, args.chart):
            if not args.json:
                out.write(f"chart: {args.chart}\n")
        else:
            print("usdtpatch: bench: --chart needs matplotlib (pip install "
                  "'usdtpatch[chart]'); no chart written", file=err if err else sys.stderr)
            return EXIT_UNUSABLE
    return EXIT_OK
