"""The prover (usdtpatch.prove): how many sites it proves, how long a proof takes, and what it
does to the verified rewrite of libjvm.so.

1. For every x86-64 fixture, python3.11, libstdc++.so.6 and a copy of OpenJDK 17's libjvm.so:
   the share of sites the rewrite (form nop5) proved, emulated and did not verify (its
   `verification` field), and the time of one proof per detour, each proved alone with a
   cold cache (median and 90th percentile over the detours, each the median of `--repeat`
   proofs).
2. libjvm.so rewritten with the default verification twice, alternately in one run: with
   the prover (the default: proofs first, the rest emulated, in the verification workers)
   and without it (`prove=False`: every detour emulated, as before); median wall and CPU
   time of each, their ratios, and the load average.

It prints figures; it is not a timed test.

    .venv/bin/python -m bench.bench_prove [--runs 3] [--repeat 3] [--no-libjvm-rewrite]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import ROOT, machine_line
from usdtpatch import api
from usdtpatch.analysis.forms import Form
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.io import read_input
from usdtpatch.prove.prover import Prover
from usdtpatch.rewriter.plan import VERIFICATIONS, plan_rewrite

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
REAL = {"python3.11": Path("/usr/bin/python3.11"),
        "libstdc++": Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")}


def _x86(path: Path) -> bool:
    try:
        image = parse_elf(read_input(str(path)))
    except Exception:
        return False
    return image.machine_name == "x86-64" and image.is64 and image.little_endian


def proof_times(path: str, repeat: int) -> tuple[list[float], Counter[str]]:
    """Milliseconds of one cold proof of each detour the planner builds, and outcomes (and
    "cache hits": the questions one prover asked them all in turn answered from its cache,
    as a rewrite's is)."""
    image = parse_elf(read_input(path))
    asked: list[tuple[ElfImage, Any, Any, tuple[int, ...], dict[str, Any]]] = []

    def record(image: ElfImage, window: Any, detour: Any, probes: tuple[int, ...],
               **extra: Any) -> None:
        asked.append((image, window, detour, probes, extra))

    try:
        plan_rewrite(image, form=Form.NOP5, verify=record)
    except Exception:  # not rewritable (already rewritten, no notes): no detours
        return [], Counter()
    times: list[float] = []
    outcomes: Counter[str] = Counter()
    kept = Prover()
    for img, w, d, probes, extra in asked:
        kept.prove(w, bytes(img.read_vaddr(w.start, w.size)), d, probes,
                   entries=extra.get("entries", ()), patches=extra.get("patches", ()))
    outcomes["cache hits"] = kept.hits
    for img, w, d, probes, extra in asked:
        code = bytes(img.read_vaddr(w.start, w.size))
        one = []
        for _ in range(repeat):
            prover = Prover()
            t0 = time.perf_counter()
            proof = prover.prove(w, code, d, probes, entries=extra.get("entries", ()),
                                 patches=extra.get("patches", ()))
            one.append((time.perf_counter() - t0) * 1000)
        times.append(statistics.median(one))
        outcomes[proof.outcome] += 1
    return times, outcomes


def shares(path: str) -> Counter[str]:
    """The rewrite's `verification` of each site (skipped ones aside)."""
    try:
        plan = api.rewrite_plan(path, form="nop5")
    except Exception:
        return Counter()
    return Counter(s.verification for s in plan.sites if s.verification is not None)


def _timed(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (the process and the children it waited for) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-libjvm-rewrite", action="store_true")
    args = ap.parse_args(argv)
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        targets: list[tuple[str, str]] = []
        fixtures = sorted(p for p in (ROOT / "fixtures" / "bin").iterdir() if p.is_file())
        targets += [(f"fixture {p.name}", str(p)) for p in fixtures if _x86(p)]
        targets += [(name, str(p)) for name, p in REAL.items() if p.exists()]
        jvm = Path(tmp) / "libjvm.so"
        if LIBJVM.exists():
            shutil.copyfile(LIBJVM, jvm)
            targets.append(("libjvm.so", str(jvm)))
        print(f"{'file':28} {'sites':>6} " + " ".join(f"{k:>13}" for k in VERIFICATIONS)
              + f" {'detours':>8} {'median ms':>10} {'p90 ms':>8} {'max ms':>8} {'hits':>5}")
        all_times: list[float] = []
        fixture_total: Counter[str] = Counter()
        for label, path in targets:
            share = shares(path)
            times, outcomes = proof_times(path, args.repeat)
            all_times += times
            total = sum(share.values())
            if label.startswith("fixture"):
                fixture_total.update(share)
            cells = " ".join(f"{share[k]:>5} {_pct(share[k], total):>7}" for k in VERIFICATIONS)
            q = statistics.quantiles(times, n=10, method="inclusive")[-1] if len(times) >= 2 else \
                (times[0] if times else 0.0)
            print(f"{label:28} {total:>6} {cells} {len(times):>8} "
                  f"{statistics.median(times) if times else 0:>10.1f} {q:>8.1f} "
                  f"{max(times) if times else 0:>8.1f} {outcomes['cache hits']:>5}")
        total = sum(fixture_total.values())
        print(f"{'all fixtures':28} {total:>6} " + " ".join(
            f"{fixture_total[k]:>5} {_pct(fixture_total[k], total):>7}" for k in VERIFICATIONS))
        if all_times:
            print(f"one proof, every detour above: median {statistics.median(all_times):.1f} ms, "
                  f"p90 {statistics.quantiles(all_times, n=10, method='inclusive')[-1]:.1f} ms, "
                  f"max {max(all_times):.1f} ms over {len(all_times)} detours")
        if LIBJVM.exists() and not args.no_libjvm_rewrite:
            out = Path(tmp) / "out.so"
            code = ("import sys; from usdtpatch import api; "
                    "api.rewrite(sys.argv[1], sys.argv[2], form='nop5', "
                    "prove=sys.argv[3] == '1')")
            proved: list[tuple[float, float]] = []
            emulated: list[tuple[float, float]] = []
            for _ in range(args.runs):  # alternately, so that load drifts hit both
                proved.append(_timed([sys.executable, "-c", code, str(jvm), str(out), "1"]))
                emulated.append(_timed([sys.executable, "-c", code, str(jvm), str(out), "0"]))
            p, e = (statistics.median(w for w, _c in proved),
                    statistics.median(w for w, _c in emulated))
            pc, ec = (statistics.median(c for _w, c in proved),
                      statistics.median(c for _w, c in emulated))
            print(f"libjvm.so rewrite, verified: proofs first {p:.2f} s, emulation only "
                  f"{e:.2f} s (medians of {args.runs}); ratio {p / e:.2f}; CPU {pc:.2f} s vs "
                  f"{ec:.2f} s, ratio {pc / ec:.2f} (load "
                  + " ".join(f"{x:.2f}" for x in os.getloadavg()) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
