"""Benchmark helpers: run a command several times, report the median wall time."""

from __future__ import annotations

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
