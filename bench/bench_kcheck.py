"""kcheck's attach and detach cost on a many-threaded process (issue 24, item 3).

A copy of OpenJDK 17's libjvm.so (531 sites; the original is never modified) is dlopen()ed by
a C program that starts THREADS threads and waits. Measured, runs interleaved, medians:

- kcheck as it is: every site a probe of one trace event, one sampling event per CPU
  (`usdtpatch.live.perf.SiteSampler`): seconds to open and to close, for all the sites;
- the reference, the per-site design: one uprobe perf event per site, counting, for the
  process (`usdtpatch.live.perf.open_uprobe`, pid = the process): seconds per event to open
  and to close, measured on SAMPLE sites, and what that makes for sites x threads events
  (the per-thread design kcheck had) and for sites x CPUs (one per site and CPU).

Needs root, the uprobe PMU and tracefs; Linux 6.18 for the figures in docs/performance.md.

    .venv/bin/python -m bench.bench_kcheck [--threads 200] [--runs 5] [--sample 20]
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

from bench.common import machine_line

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
THREADS_C = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void *idle(void *arg) { (void)arg; pause(); return NULL; }
int main(int argc, char **argv) {
    if (argc < 3 || !dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) return 1;
    int n = atoi(argv[2]);
    pthread_t t;
    for (int i = 0; i < n; i++) pthread_create(&t, NULL, idle, NULL);
    printf("ready\n");
    fflush(stdout);
    pause();
    return 0;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sample", type=int, default=20)
    args = ap.parse_args()
    from usdtpatch.live.kcheck import kernel_support, load_probes, site_specs
    from usdtpatch.live.perf import SiteSampler, online_cpus, open_uprobe

    kernel_support()
    if not LIBJVM.exists():
        print(f"needs {LIBJVM}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-kcheck-") as tmp:
        d = Path(tmp)
        lib = d / "libjvm.so"
        shutil.copy2(LIBJVM, lib)
        (d / "t.c").write_text(THREADS_C)
        subprocess.run(["gcc", "-O2", "-pthread", str(d / "t.c"), "-o", str(d / "t"), "-ldl"],
                       check=True)
        proc = subprocess.Popen([str(d / "t"), str(lib), str(args.threads)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            specs = [s for s in site_specs(load_probes(str(lib)), str(lib)) if not s.unprobeable]
            sites = [(s.file_offset, s.semaphore_offset) for s in specs]
            new_open, new_close, old_open, old_close = [], [], [], []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                sampler = SiteSampler(str(lib), sites)
                t1 = time.perf_counter()
                sampler.close()
                t2 = time.perf_counter()
                new_open.append(t1 - t0)
                new_close.append(t2 - t1)
                t0 = time.perf_counter()
                evs = [open_uprobe(str(lib), off, pid=proc.pid, ref_ctr_offset=ref)
                       for off, ref in sites[: args.sample]]
                t1 = time.perf_counter()
                for ev in evs:
                    ev.close()
                t2 = time.perf_counter()
                old_open.append((t1 - t0) / len(evs))
                old_close.append((t2 - t1) / len(evs))
        finally:
            proc.kill()
            proc.wait()
    n, threads, cpus = len(sites), args.threads + 1, len(online_cpus())
    no, nc = statistics.median(new_open), statistics.median(new_close)
    oo, oc = statistics.median(old_open), statistics.median(old_close)
    print(machine_line())
    print(f"libjvm.so copy: {n} sites; process with {threads} threads; {cpus} CPUs; "
          f"medians of {args.runs} runs")
    print(f"one trace event, {cpus} CPU event(s): open {no:.3f} s, close {nc:.3f} s")
    print(f"per-site uprobe event (reference, {args.sample} sites): open {oo * 1e3:.2f} ms, "
          f"close {oc * 1e3:.1f} ms per event")
    for what, count in (("sites x threads", n * threads), ("sites x CPUs", n * cpus)):
        print(f"  {what} = {count} events: open {count * oo:.1f} s, close {count * oc:.1f} s "
              f"(close {count * oc / nc:.0f}x the trace event's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
