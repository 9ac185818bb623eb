"""`usdtpatch list` (JSON and table) against `readelf -n` on OpenJDK 17's libjvm.so.

Prints, from one run: the median wall time of `readelf -n`, `usdtpatch list --json` and
`usdtpatch list` (the table, written to /dev/null) on libjvm.so (531 probes), and `bpftrace -l`
of the file's USDT probes when bpftrace is installed, each a fresh process, the commands
taking turns in every round so that a busy machine slows all of them alike; then the ratios
against readelf and the issues' targets (JSON <= 20x readelf, table no slower than JSON, JSON
no slower than `bpftrace -l`). `--synthetic N` adds probes/s on synthetic binaries with N and
10*N probes (built by fixtures/gen_synthetic.py), to show that the cost grows no faster than
the probe count.

    .venv/bin/python -m bench.bench_list [--runs 15] [--compare TREE] [--synthetic N] [FILE]
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
from pathlib import Path

from bench.common import ROOT, USDTPATCH, machine_line

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
JSON_TARGET = 20.0  # list --json at most 20x readelf -n


def _once(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + system) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # from a neutral folder: `python -m` puts the working directory first on sys.path
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   env=env, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def python_env(tree: Path | None = None) -> dict[str, str]:
    """The environment of a timed `python -m usdtpatch` (from `tree` when given): bytecode
    caching on, as for a user (PYTHONDONTWRITEBYTECODE would recompile every changed module on
    every run), with the caches under a temporary folder rather than in the source trees."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "usdtpatch-bench-pycache")
    if tree is not None:
        env["PYTHONPATH"] = str(tree.resolve())
    return env


def tree_env(tree: Path | None) -> dict[str, str]:
    """The environment that runs `python -m usdtpatch` from another source tree."""
    return python_env(tree)


def medians(commands: dict[str, list[str]], runs: int,
            envs: dict[str, dict[str, str] | None] | None = None,
            cpu: dict[str, float] | None = None) -> dict[str, float]:
    """Median wall time of each command (output to /dev/null, which is not a terminal: the
    tables take their plain-text path), all of them run once per round, `runs` rounds (after
    one warm-up round). `cpu`, when given, receives the median CPU time of each (less
    sensitive than wall time to other jobs on the machine)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    for i in range(runs + 1):
        for name, argv in commands.items():
            env = (envs or {}).get(name)
            if env is None and argv[0] == sys.executable:
                env = python_env()
            wall, used = _once(argv, env)
            if i:
                times[name].append(wall)
                cpus[name].append(used)
    if cpu is not None:
        cpu.update({name: statistics.median(ts) for name, ts in cpus.items()})
    return {name: statistics.median(ts) for name, ts in times.items()}


def synthetic(n: int) -> Path:
    """Build (once) the synthetic binary with n probes through the fixtures Makefile."""
    out = ROOT / "fixtures" / "build" / f"synthetic-{n}"
    if not out.exists():
        subprocess.run(["make", "-s", "-C", str(ROOT / "fixtures"), "synthetic", f"N={n}"],
                       check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", type=Path, default=LIBJVM)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--compare", type=Path, metavar="TREE",
                    help="also time the commands of another source tree (e.g. the starting "
                         "commit's checkout), in the same rounds")
    ap.add_argument("--synthetic", type=int, default=0, metavar="N",
                    help="also measure synthetic binaries with N and 10*N probes")
    args = ap.parse_args(argv)
    print(f"machine: {machine_line()}")
    status = 0
    if args.file.exists():
        path = str(args.file)
        commands = {"readelf -n": ["readelf", "-n", path],
                    "usdtpatch list --json": [*USDTPATCH, "list", "--json", path],
                    "usdtpatch list (table)": [*USDTPATCH, "list", path]}
        bpftrace = shutil.which("bpftrace")
        if bpftrace is not None:  # issue 38's reference: no slower than `bpftrace -l`
            commands["bpftrace -l"] = [bpftrace, "-l", f"usdt:{path}:*"]
        envs: dict[str, dict[str, str] | None] = {}
        if args.compare is not None:
            commands["compared: list --json"] = commands["usdtpatch list --json"]
            commands["compared: list (table)"] = commands["usdtpatch list (table)"]
            envs = {"compared: list --json": tree_env(args.compare),
                    "compared: list (table)": tree_env(args.compare)}
            print(f"compared tree: {args.compare}")
        cpu: dict[str, float] = {}
        m = medians(commands, args.runs, envs, cpu)
        ref = m["readelf -n"]
        print(f"{path}: median of {args.runs} rounds (wall; CPU user+system)")
        for name, t in m.items():
            print(f"  {name:<24} {t:7.3f} s  {t / ref:6.1f}x readelf -n;  CPU {cpu[name]:6.3f} s "
                  f"{cpu[name] / max(cpu['readelf -n'], 1e-4):6.1f}x")
        js, table = m["usdtpatch list --json"], m["usdtpatch list (table)"]
        ok_json = js / ref <= JSON_TARGET
        ok_table = table <= js * 1.05  # within the noise of a median
        print(f"target list --json <= {JSON_TARGET:.0f}x readelf -n: "
              f"{'met' if ok_json else 'MISSED'} ({js / ref:.1f}x)")
        print(f"target table no slower than JSON: {'met' if ok_table else 'MISSED'} "
              f"(table/json {table / js:.2f})")
        if "bpftrace -l" in m:
            bw, bc = m["bpftrace -l"], cpu["bpftrace -l"]
            print(f"target list --json no slower than bpftrace -l: "
                  f"{'met' if js <= bw else 'MISSED'} (wall {js / bw:.2f}x, CPU "
                  f"{cpu['usdtpatch list --json'] / max(bc, 1e-4):.2f}x)")
        status = 0 if ok_json and ok_table else 1
    else:
        print(f"{args.file}: not present, skipped")
    if args.synthetic:
        rates = []
        for n in (args.synthetic, 10 * args.synthetic):
            p = str(synthetic(n))
            m = medians({"ours": [*USDTPATCH, "list", "--json", p],
                         "readelf": ["readelf", "-n", p]}, max(3, args.runs // 5))
            rates.append(n / m["ours"])
            print(f"synthetic {n} probes: usdtpatch {m['ours']:.3f} s "
                  f"({n / m['ours']:,.0f} probes/s); readelf -n {m['readelf']:.3f} s; "
                  f"ratio {m['ours'] / m['readelf']:.1f}x")
        print(f"probes/s at 10x the probes / at 1x: {rates[1] / rates[0]:.2f} "
              f"(>= ~1 means cost grows no faster than the probe count)")
    return status


if __name__ == "__main__":
    sys.exit(main())
