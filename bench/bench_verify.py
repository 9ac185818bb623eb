"""`usdtpatch verify` throughput: sites/s on a synthetic binary with N nop5 probe sites.

Builds (with gcc and systemtap's sys/sdt.h, nop5 header trick) a program with N noinline
functions, each holding one nop5 USDT site, then prints, from several runs: the median wall
time of plan + verify in-process and of the `usdtpatch verify` command, sites/s, emulated
thread runs per site, and the ratio to the target (500 sites in <= 10 s). It prints medians
and ratios; it is not a timed test.

    .venv/bin/python -m bench.bench_verify [--sites 500] [--runs 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import USDTPATCH, machine_line, median_seconds

TARGET_SITES = 500
TARGET_SECONDS = 10.0

NOP5_TRICK = ("#include <sys/sdt.h>\n#undef _SDT_NOP\n"
              "#define _SDT_NOP .byte 0x0f; .byte 0x1f; .byte 0x44; .byte 0x00; .byte 0x00\n")


def build(n: int, folder: Path) -> Path:
    lines = [NOP5_TRICK, "volatile long v;"]
    for i in range(n):
        lines.append(f"__attribute__((noinline)) void f{i}(long x) "
                     f"{{ STAP_PROBE1(bench, p{i}, x); v += x; }}")
    lines.append("int main(void) { return 0; }")
    src = folder / "sites.c"
    src.write_text("\n".join(lines) + "\n")
    out = folder / f"sites-{n}"
    subprocess.run(["gcc", "-O2", "-o", str(out), str(src)], check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, default=TARGET_SITES)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    if shutil.which("gcc") is None:
        print("bench_verify: needs gcc to build the synthetic binary", file=sys.stderr)
        return 2
    from usdtpatch.api import load
    from usdtpatch.sequences.plan import build_plan
    from usdtpatch.sequences.trampoline import default_load_base
    from usdtpatch.verification.plans import PASS, verify_plan

    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        path = build(args.sites, Path(tmp))
        times: list[float] = []
        runs = passed = sites = 0
        for _ in range(args.runs):
            t0 = time.perf_counter()
            ps = load(str(path))
            plan = build_plan(ps, str(path), "nop5", default_load_base(ps.image))
            rep = verify_plan(plan, ps.image)
            times.append(time.perf_counter() - t0)
            runs, sites = rep.runs, len(rep.verdicts)
            passed = sum(1 for v in rep.verdicts if v.status == PASS)
        med = statistics.median(times)
        cli = median_seconds([*USDTPATCH, "verify", str(path)], runs=args.runs, warmup=0)
    print(f"verify, in-process: {sites} nop5 sites ({passed} pass), {runs} emulated thread runs "
          f"({runs / max(sites, 1):.0f}/site): median {med:.2f} s of {args.runs} = "
          f"{sites / med:.0f} sites/s, {med / max(sites, 1) * 1e3:.2f} ms/site")
    print(f"verify, command:    median {cli:.2f} s = {sites / cli:.0f} sites/s")
    scaled = cli * TARGET_SITES / max(sites, 1)
    print(f"target: {TARGET_SITES} sites in <= {TARGET_SECONDS:.0f} s; "
          f"here {scaled:.2f} s for {TARGET_SITES} (ratio {scaled / TARGET_SECONDS:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
