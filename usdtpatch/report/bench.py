"""The bench document (schema `usdtpatch/bench`, version 1, docs/performance.md) and
`usdtpatch bench`'s renderings: its tables as text and, with --chart, a PNG of the medians
(matplotlib, the optional extra usdtpatch[chart], imported only for it).

Deferred imports: matplotlib (the optional chart), report/render.py (rich, for a
terminal's table).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import IO, Any, Literal

from usdtpatch.live.bench.runner import JVM_REFERENCE, REFERENCE, BenchReport, Row
from usdtpatch.report.envelope import envelope

BENCH_SCHEMA = "usdtpatch/bench"
BENCH_SCHEMA_VERSION = 1


def row_json(r: Row) -> dict[str, Any]:
    def num(v: Any) -> Any:
        return round(v, 4) if isinstance(v, float) else v
    values = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    return {k: [num(x) for x in v] if isinstance(v, tuple) else num(v)
            for k, v in values.items()}


def bench_json(rep: BenchReport) -> dict[str, Any]:
    """The document `bench --json` prints."""
    return {**envelope(BENCH_SCHEMA, BENCH_SCHEMA_VERSION, tool="none"),
            "kernel": rep.kernel, "cpu": rep.cpu, "iterations": rep.iterations,
            "jvm_calls": rep.jvm_calls, "repeats": rep.repeats,
            "reference": REFERENCE, "jvm_reference": JVM_REFERENCE,
            "trigger": [row_json(r) for r in rep.trigger],
            "jvm": [row_json(r) for r in rep.jvm],
            "seconds": round(rep.seconds, 2), "notes": rep.notes,
            "generation": rep.generation,
            "same_form": {"native": rep.same_form,
                          "ratio_traced_ns_per_hit": round(rep.same_form_ratio[0], 4),
                          "range": [round(v, 4) for v in rep.same_form_ratio[1:]]}}


NOISE = "noise"
NOISE_NOTE = ("noise: the ratio is not a difference from the reference: its rounds' ratios "
              "reach both sides of 1, or the medians of hits/s order the two the other way "
              "than the ratio")


def is_noise(r: Row, ref: Row | None) -> bool:
    """Whether a row's traced ratio says nothing: the rounds' ratios reach both sides of 1
    (the spread is wider than the effect), or the row's median hits/s and the reference's
    order them against the ratio (hdr-nop5 below stap-nop1 while its ratio read 1.65)."""
    if ref is None or r is ref:
        return False
    lo, hi = r.ratio_traced_range
    if lo <= 1.0 <= hi:
        return True
    faster = r.traced_hits_per_s > ref.traced_hits_per_s
    return (r.ratio_traced > 1.0) != faster


def _table(title: str, rows: list[Row], jvm: bool, out: IO[str]) -> None:
    from usdtpatch.report.render import render_table  # rich, for a terminal

    names = ["variant", "site bytes", "hits", "M hits/s traced", "x ref (rounds)"]
    names += (["wall s traced", "wall s untraced", "x ref untraced"] if jvm else
              ["ns/hit traced", "ns/pass untraced", "x ref untraced"])
    columns: list[tuple[str, Literal["left", "right"]]] = [
        (n, "left" if n in ("variant", "site bytes") else "right") for n in names]
    cells: list[list[str]] = []
    ref = next((r for r in rows if r.name in (REFERENCE, JVM_REFERENCE)), None)
    for r in rows:
        lo, hi = r.ratio_traced_range
        word = f" {NOISE}" if is_noise(r, ref) else ""
        row = [r.name, r.site, str(r.hits), f"{r.traced_hits_per_s / 1e6:.3f}",
               f"{r.ratio_traced:.2f} ({lo:.2f}-{hi:.2f}){word}"]
        if jvm:
            row += [f"{r.traced_wall_s or 0:.2f}", f"{r.untraced_wall_s or 0:.2f}",
                    f"{r.ratio_untraced:.2f}"]
        else:
            row += [f"{r.traced_ns_per_hit:.1f}", f"{r.untraced_ns_per_pass:.2f}",
                    f"{r.ratio_untraced:.2f}"]
        cells.append(row)
    render_table(out, title, columns, cells)


def print_bench(rep: BenchReport, out: IO[str]) -> None:
    """`usdtpatch bench`'s text: the two tables and the notes."""
    gen = f" (the {rep.generation} generation)" if rep.generation else ""
    out.write(f"Linux {rep.kernel}{gen}, {rep.cpu}; medians of {rep.repeats} interleaved "
              f"round(s); x ref = median of the per-round ratios to the reference (lowest-"
              f"highest round); untraced: time ratio, below 1 is faster\n")
    if rep.trigger:
        _table(f"trigger program, {rep.iterations} passes per run (x ref: against "
               f"{REFERENCE})", rep.trigger, False, out)
    if rep.jvm:
        _table(f"OpenJDK 17, Bench.java, {rep.jvm_calls} calls per run (x ref: against "
               f"{JVM_REFERENCE})", rep.jvm, True, out)
    rows = [*rep.trigger, *rep.jvm]
    refs = {REFERENCE: None, JVM_REFERENCE: None} | {r.name: r for r in rows
                                                     if r.name in (REFERENCE, JVM_REFERENCE)}
    if any(is_noise(r, refs[REFERENCE]) for r in rep.trigger) or \
            any(is_noise(r, refs[JVM_REFERENCE]) for r in rep.jvm):
        out.write(f"{NOISE_NOTE}\n")
    if rep.same_form and rep.same_form_ratio[0]:
        med, lo, hi = rep.same_form_ratio
        word = " (noise)" if lo <= 1.0 <= hi else ""
        out.write(f"rewritten against {rep.same_form} (a native site of the same form), "
                  f"traced: {med:.3f}x its ns per hit ({lo:.3f}-{hi:.3f}){word}\n")
    for n in rep.notes:
        out.write(f"note: {n}\n")


def chart(rep: BenchReport, path: Path) -> bool:
    """A PNG bar chart of the medians; False when matplotlib is not installed (the
    optional extra usdtpatch[chart])."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [("trigger: M hits/s traced", [r.name for r in rep.trigger],
               [r.traced_hits_per_s / 1e6 for r in rep.trigger]),
              ("trigger: ns per pass, untraced", [r.name for r in rep.trigger],
               [r.untraced_ns_per_pass for r in rep.trigger])]
    if rep.jvm:
        panels.append(("JVM: M hits/s traced", [r.name for r in rep.jvm],
                       [r.traced_hits_per_s / 1e6 for r in rep.jvm]))
        panels.append(("JVM: wall s (traced / untraced)",
                       [f"{r.name}\ntraced" for r in rep.jvm]
                       + [f"{r.name}\nuntraced" for r in rep.jvm],
                       [r.traced_wall_s or 0.0 for r in rep.jvm]
                       + [r.untraced_wall_s or 0.0 for r in rep.jvm]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2))
    for ax, (title, names, values) in zip(axes, panels, strict=True):
        ax.bar(range(len(values)), values, color="#4878a8")
        ax.set_xticks(range(len(values)), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"usdtpatch bench, Linux {rep.kernel}, medians of {rep.repeats}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
