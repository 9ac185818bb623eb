"""The fork guard's cost: per fork (untraced and traced) and per probe pass (untraced).

Builds the pre-fork server fixture (fixtures/src/forkserver.c) four ways: with usdtpatch's
sys/sdt.h with and without the guard (-DUSDTPATCH_FORK_GUARD=0), and with systemtap's header
rewritten with `--fork-guard auto` and `never`. Then, guarded and unguarded runs interleaved,
it prints medians and the guarded/unguarded ratio of:

- fork + exit + wait per child, untraced: the child handler walks the table and finds no
  optimized site (the only cost is the handler's walk);
- the same with a counting uprobe on the probe (the parent's site optimized before it forks):
  the handler finds the `call`, checks the page with mincore, writes the int3 state through
  /proc/self/mem (needs root and Linux 6.18's uprobe syscall; skipped otherwise);
- a guarded child's first hit after the fork (int3, then the kernel optimizes the site again
  in the child), traced: there is no unguarded reference (that child dies), so absolute;
- a probe pass, untraced (the guard does not touch the site: expected ratio 1.00);
- the routes the guard interposes in a dynamically linked executable's GOT (issue 31): a
  program (ROUTES_SRC) forks N children by `_Fork()`, `syscall(SYS_fork)` and `clone(fn,
  stack, SIGCHLD)`, and calls `syscall(SYS_getpid)` M times (the stub's number check on a
  call that is no fork) and `dlsym(RTLD_DEFAULT, "syscall")` M/10 times (the interposed
  lookup: the real dlsym, then its result compared with the stubbed functions; the program
  imports dlsym, so every route's child re-arms through the link map walk), rewritten with
  `--fork-guard auto` (the stubs) and `never`.

    .venv/bin/python -m bench.bench_fork [--forks 2000] [--passes 20000000] [--runs 7]
                                         [--routes-only]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.common import ROOT, machine_line

SRC = ROOT / "fixtures" / "src" / "forkserver.c"

# the interposed routes, timed by the program's own clock (ns per call, one line per route)
ROUTES_SRC = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include "custom_note.h"
__attribute__((noinline)) long site(long x)
{
    asm volatile(CN_PROBE("nop", "bench", "site", "8@%[x]") :: [x] "r"(x));
    return x + 1;
}
static int child(void *a) { (void)a; _exit(0); }
static char stack[16384] __attribute__((aligned(16)));
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
int main(int argc, char **argv)
{
    const char *route = argv[1];
    long n = atol(argv[2]), sum = site(1);
    double t0 = now();
    for (long i = 0; i < n; i++) {
        pid_t pid;
        if (!strcmp(route, "getpid")) {
            sum += syscall(SYS_getpid);
            continue;
        }
        if (!strcmp(route, "dlsym")) {
            sum += (long)dlsym(RTLD_DEFAULT, "syscall") & 1;
            continue;
        }
        if (!strcmp(route, "_Fork"))
            pid = _Fork();
        else if (!strcmp(route, "sysfork"))
            pid = (pid_t)syscall(SYS_fork);
        else
            pid = clone(child, stack + sizeof stack, SIGCHLD, 0);
        if (pid == 0)
            _exit(0);
        waitpid(pid, 0, 0);
    }
    printf("ns %.1f %ld\n", (now() - t0) / n, sum & 1);
    return 0;
}
"""
ROUTES = ("_Fork", "sysfork", "clone", "getpid", "dlsym")
CALLS = {"getpid": 1000, "dlsym": 100}  # calls a run per fork of the other routes
SDT = ROOT / "sdt_headers"


def build(d: Path) -> dict[str, Path]:
    out = {"sdt.h guarded": d / "hg", "sdt.h unguarded": d / "h0"}
    subprocess.run(["gcc", "-O2", f"-I{SDT}", str(SRC), "-o", str(out["sdt.h guarded"])],
                   check=True)
    subprocess.run(["gcc", "-O2", f"-I{SDT}", "-DUSDTPATCH_FORK_GUARD=0", str(SRC), "-o",
                    str(out["sdt.h unguarded"])], check=True)
    stap = d / "stap"
    subprocess.run(["gcc", "-O2", str(SRC), "-o", str(stap)], check=True)
    from usdtpatch.api import rewrite

    for g, name in (("auto", "rewrite guarded"), ("never", "rewrite unguarded")):
        out[name] = d / f"rw-{g}"
        rewrite(stap, out[name], fork_guard=g)
    return out


PIN: set[int] = set()


def _pin() -> None:
    """Run the server (and its children) on one CPU: fewer migrations, less noise."""
    if PIN:
        os.sched_setaffinity(0, PIN)


def per_fork(binary: Path, forks: int, before: int = 1, after: int = 0) -> float:
    """Seconds per fork + exit + wait, as the server's own clock measures its fork loop."""
    proc = subprocess.run([str(binary), str(before), str(forks), str(after)], input="go\n",
                          capture_output=True, text=True, timeout=600, check=False,
                          preexec_fn=_pin)
    m = re.search(r"children ok=(\d+) signaled=0 lastsig=0 ns=(\d+)", proc.stdout)
    if proc.returncode != 0 or m is None or int(m[1]) != forks:
        raise RuntimeError(f"{binary}: exit {proc.returncode}, {proc.stdout!r}")
    return int(m[2]) / 1e9 / forks


def timed_passes(binary: Path, passes: int) -> float:
    """Seconds for `passes` probe passes, as the server's own clock measures its hit loop."""
    proc = subprocess.run([str(binary), str(passes), "0", "0"], input="go\n",
                          capture_output=True, text=True, timeout=600, check=True,
                          preexec_fn=_pin)
    m = re.match(r"ready ns=(\d+)", proc.stdout)
    if m is None:
        raise RuntimeError(f"{binary}: {proc.stdout!r}")
    return int(m[1]) / 1e9


def probe_offset(binary: Path) -> int:
    from usdtpatch.api import load

    (p,) = load(binary).probes
    assert p.offset is not None
    return p.offset


def traced(binary: Path) -> list[object]:
    from usdtpatch.live.perf import open_uprobe

    off = probe_offset(binary)
    return [open_uprobe(str(binary), off, pid=-1, cpu=c) for c in range(os.cpu_count() or 1)]


def can_trace() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    from usdtpatch.live.perf import has_uprobe_syscall

    if not has_uprobe_syscall():
        return "no uprobe syscall (Linux < 6.18): sites are never optimized"
    return None


def pairs(names: tuple[str, str], fn: Callable[[str], float], runs: int
          ) -> tuple[float, float]:
    """Medians of fn(name) for both names, runs interleaved A B A B ..."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(runs):
        a.append(fn(names[0]))
        b.append(fn(names[1]))
    return statistics.median(a), statistics.median(b)


def route_ns(binary: Path, route: str, n: int) -> float:
    proc = subprocess.run([str(binary), route, str(n)], capture_output=True, text=True,
                          timeout=600, check=True, preexec_fn=_pin)
    m = re.match(r"ns ([0-9.]+)", proc.stdout)
    if m is None:
        raise RuntimeError(f"{binary} {route}: {proc.stdout!r}")
    return float(m[1])


def routes_bench(d: Path, forks: int, runs: int) -> None:
    """The interposed routes' cost, untraced: the stub in front of the C library's function
    (and, in the child, the handler's walk of the table), guarded vs unguarded."""
    from usdtpatch.api import rewrite

    src = d / "routes.c"
    src.write_text(ROUTES_SRC)
    exe = d / "routes"
    subprocess.run(["gcc", "-O2", f"-I{ROOT / 'fixtures' / 'src'}", str(src), "-o", str(exe)],
                   check=True)
    bins = {g: d / f"routes-{g}" for g in ("auto", "never")}
    for g, out in bins.items():
        rewrite(exe, out, fork_guard=g)
    print("interposed routes (dynamically linked, GOT stubs), untraced, medians:")
    for route in ROUTES:
        n = forks * CALLS.get(route, 1)
        def one(p: str, r: str = route, k: int = n) -> float:
            return route_ns(Path(p), r, k)

        mg, mu = pairs((str(bins["auto"]), str(bins["never"])), one, runs)
        print(f"  {route:8} {mg / 1000:8.3f} us guarded, {mu / 1000:8.3f} us unguarded, "
              f"ratio {mg / mu:.3f} ({n} calls a run)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forks", type=int, default=2000)
    ap.add_argument("--passes", type=int, default=20_000_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1,
                    help="CPU to run the servers on (-1: any)")
    ap.add_argument("--routes-only", action="store_true",
                    help="only the interposed routes (no server, no probe passes)")
    args = ap.parse_args(argv)
    if args.cpu >= 0:
        PIN.add(args.cpu)
    if shutil.which("gcc") is None:
        print("bench_fork: needs gcc", file=sys.stderr)
        return 2
    print(machine_line() + (f"; servers pinned to CPU {args.cpu}" if PIN else ""))
    why_not = can_trace()
    if args.routes_only:
        with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
            routes_bench(Path(tmp), args.forks, args.runs)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
        bins = build(Path(tmp))
        n: int = args.forks
        print(f"{n} forks per run (timed by the server's own clock), {args.runs} runs "
              f"interleaved, medians")
        for kind in ("sdt.h", "rewrite"):
            g, u = bins[f"{kind} guarded"], bins[f"{kind} unguarded"]

            mg, mu = pairs((str(g), str(u)), lambda p: per_fork(Path(p), n), args.runs)
            print(f"  {kind:8} untraced: fork+wait {mg * 1e6:8.1f} us guarded, "
                  f"{mu * 1e6:8.1f} us unguarded, ratio {mg / mu:.3f}")
            if why_not is None:
                probes: list[object] = []
                try:
                    for b in (g, u):
                        probes += traced(b)
                    tg, tu = pairs((str(g), str(u)), lambda p: per_fork(Path(p), n, 10),
                                   args.runs)
                    hits = statistics.median(per_fork(g, n, 10, 1) for _ in range(args.runs))
                finally:
                    for p in probes:
                        p.close()  # type: ignore[attr-defined]
                print(f"  {kind:8} traced:   fork+wait {tg * 1e6:8.1f} us guarded, "
                      f"{tu * 1e6:8.1f} us unguarded, ratio {tg / tu:.3f}; guarded child "
                      f"with one hit {hits * 1e6:8.1f} us (+{(hits - tg) * 1e6:.1f} us: int3 "
                      f"+ re-optimization in the child)")
            else:
                print(f"  {kind:8} traced: skipped ({why_not})")
        routes_bench(Path(tmp), n, args.runs)
        for kind in ("sdt.h", "rewrite"):
            g, u = bins[f"{kind} guarded"], bins[f"{kind} unguarded"]
            pg, pu = pairs((str(g), str(u)), lambda p: timed_passes(Path(p), args.passes),
                           args.runs)
            print(f"  {kind:8} untraced probe pass: {pg / args.passes * 1e9:6.3f} ns guarded, "
                  f"{pu / args.passes * 1e9:6.3f} ns unguarded, ratio {pg / pu:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
