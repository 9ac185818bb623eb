"""Benchmark helpers: run a command several times, report the median wall time."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USDTPATCH = [sys.executable, "-m", "usdtpatch"]


def median_seconds(argv: list[str], runs: int = 9, warmup: int = 1) -> float:
    """Median wall time of running `argv` to completion, output discarded."""
    times: list[float] = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine_line() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    return (f"{platform.node()}: {cpu}, {os.cpu_count()} cpus, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


# Peak memory of a child. Linux keeps a process's ru_maxrss across execve (and a vfork()ed
# child, as subprocess spawns, records the peak of the memory it shared with its spawner), so a
# command spawned straight from this process reports at least this process's own peak: the
# bench's hundreds of MB after building a large synthetic file. The command is therefore
# spawned by a fresh, small interpreter (`python -S -I`, ~10 MiB), which times it, waits for it
# with wait4 and prints the child's own figures: its peak includes the largest process it
# waited for (a verified rewrite's workers) and is never below the spawner's own peak, the
# floor SPAWNER_FLOOR_KIB reports (measured by spawning `true`).
_SPAWNER = """
import json, os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        if sys.argv[1] != "-":
            os.chdir(sys.argv[1])
        fd = os.open(os.devnull, os.O_RDWR)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_pid, status, ru = os.wait4(pid, 0)
print(json.dumps([time.perf_counter() - start, ru.ru_utime + ru.ru_stime, ru.ru_maxrss,
                  os.waitstatus_to_exitcode(status)]))
"""


def run_measured(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None
                 ) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds (user + system, with the children it waited for), peak
    resident memory in KiB, exit code) of one run of `argv`, output discarded, spawned from a
    fresh small interpreter so that the peak is the command's own (see _SPAWNER)."""
    done = subprocess.run([sys.executable, "-S", "-I", "-c", _SPAWNER, cwd or "-", *argv],
                          capture_output=True, text=True, check=True, env=env)
    wall, cpu, peak, code = json.loads(done.stdout)
    return float(wall), float(cpu), int(peak), int(code)


def spawner_floor_kib() -> int:
    """The smallest peak run_measured can report: that of `true`, the spawner's own."""
    return run_measured(["true"])[2]
