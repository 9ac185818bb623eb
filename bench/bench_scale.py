"""How `list`, `check` and `rewrite --no-verify` grow with the number of probes.

Synthetic shared libraries (bench/synthetic_asm.py: one probe per 8-byte function, with
its FDE) with 1k, 10k, 100k and 1M probes, and one whose notes all name one pc. Each command
runs as a fresh process (`python -m usdtpatch`, output to /dev/null, so the tables are laid
out as for a file); first on a file with one probe (the fixed cost: interpreter, imports),
then per size: the median wall time, the time per probe above the fixed cost, the ratio of
that to the smallest size's (1.0 = linear; a quadratic step shows as ~10 per decade), the same
for the child's CPU time (user + system: far less moved by other processes on the machine),
and the child's peak RSS per probe (the child's own: bench.common.run_measured), whole and
above the fixed run's. A run whose peak RSS, extrapolated from the command's
previous size, would pass --max-rss-mb is skipped and said.

    .venv/bin/python -m bench.bench_scale [--sizes 1000,10000,100000,1000000] [--runs 3]
                                          [--shared-pc 1000000] [--dir DIR]
                                          [--large-commands list,check,rewrite]
                                          [--max-rss-mb 6000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.common import USDTPATCH, machine_line, run_measured, spawner_floor_kib
from bench.synthetic_asm import build

COMMANDS = {
    "list": ["list"],
    "check": ["check", "--fail-on", "never"],
    "rewrite": ["rewrite", "--no-verify", "--fork-guard", "never", "--form", "nop5", "-o"],
}


def _run(argv: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, peak RSS in bytes) of one run of `argv` as a child
    process (the CPU time, user + system, depends far less on a shared machine's load). The
    child is spawned by a small fresh interpreter (bench.common.run_measured): spawned from
    this process, which holds the generated files, its ru_maxrss would start at ours."""
    wall, cpu, peak_kib, code = run_measured(argv, cwd=tempfile.gettempdir())
    if code not in (0, 1):
        raise SystemExit(f"bench_scale: {' '.join(argv)} exited {code}")
    return wall, cpu, peak_kib * 1024


def measure(path: Path, command: str, runs: int, out: Path) -> tuple[float, float, int]:
    """Median wall and CPU seconds, and the largest peak RSS, of `runs` runs."""
    argv = [*USDTPATCH, *COMMANDS[command]]
    argv += [str(out), str(path)] if command == "rewrite" else [str(path)]
    results = [_run(argv) for _ in range(runs)]
    return (statistics.median(w for w, _, _ in results),
            statistics.median(c for _, c, _ in results), max(m for _, _, m in results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000,1000000")
    ap.add_argument("--runs", type=int, default=3, help="runs per size below 100k (1 above)")
    ap.add_argument("--shared-pc", type=int, default=1_000_000, metavar="N",
                    help="also N notes that share one pc (0: not)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "usdtpatch-scale")
    ap.add_argument("--large-commands", default="list,check,rewrite", metavar="LIST",
                    help="the commands run at 1M probes (check needs ~10 KB per site)")
    ap.add_argument("--max-rss-mb", type=float, default=6000, metavar="MB",
                    help="skip a run whose peak RSS, from the bytes per probe of the "
                         "command's previous size, would exceed this (a shared machine)")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(machine_line())
    print(f"peak memory: the child's own, spawned from a fresh interpreter (floor "
          f"{spawner_floor_kib() / 1024:.1f} MiB: what `true` reports)")
    out = args.dir / "out.so"
    cases = [(n, build(args.dir, n), False) for n in sizes]
    if args.shared_pc:
        cases.append((args.shared_pc, build(args.dir, args.shared_pc, shared_pc=True), True))
    one = build(args.dir, 1)
    fixed_runs = {c: measure(one, c, args.runs, out) for c in COMMANDS}
    fixed = {c: wall for c, (wall, _cpu, _rss) in fixed_runs.items()}
    fixed_cpu = {c: cpu for c, (_wall, cpu, _rss) in fixed_runs.items()}
    print("fixed cost (1 probe): " + ", ".join(f"{c} {t:.2f} s ({fixed_cpu[c]:.2f} s CPU)"
                                               for c, t in fixed.items()))
    base: dict[str, float] = {}
    base_cpu: dict[str, float] = {}
    per_probe: dict[str, float] = {}  # peak RSS above the fixed run's, per probe, last size
    print(f"{'probes':>9} {'command':8} {'seconds':>9} {'us/probe':>9} {'ratio':>6} "
          f"{'CPU s':>8} {'CPU us/p':>8} {'ratio':>6} {'peak MB':>8} {'B/probe':>8} "
          f"{'B/p>fix':>8}")
    for n, path, shared in cases:
        runs = args.runs if n < 100_000 else 1
        chosen = COMMANDS if n < 1_000_000 else args.large_commands.split(",")
        for command in chosen:
            need = (fixed_runs[command][2] + per_probe.get(command, 0.0) * n) / 2**20
            if need > args.max_rss_mb:
                print(f"{n:>9} {command:8} skipped: ~{need:.0f} MB at "
                      f"{per_probe[command]:.0f} B/probe (--max-rss-mb {args.max_rss_mb:.0f})",
                      flush=True)
                continue
            wall, cpu, rss = measure(path, command, runs, out)
            per_probe[command] = max(0, rss - fixed_runs[command][2]) / n
            per = max(0.0, wall - fixed[command]) / n * 1e6
            per_cpu = max(0.0, cpu - fixed_cpu[command]) / n * 1e6
            if not shared:
                base.setdefault(command, per)
                base_cpu.setdefault(command, per_cpu)
            ratio = per / base[command] if base.get(command) else float("nan")
            ratio_cpu = per_cpu / base_cpu[command] if base_cpu.get(command) else float("nan")
            label = f"{n}{' one pc' if shared else ''}"
            print(f"{label:>9} {command:8} {wall:9.2f} {per:9.1f} {ratio:6.2f} {cpu:8.2f} "
                  f"{per_cpu:8.1f} {ratio_cpu:6.2f} {rss / 2**20:8.0f} {rss / n:8.0f} "
                  f"{per_probe[command]:8.0f}",
                  flush=True)
    out.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
