"""bench.common.run_measured: a child's peak memory is its own (issue 38).

Linux keeps ru_maxrss across execve, so a command spawned straight from a process that has
grown (a bench holding generated files) reports at least that process's peak."""

from __future__ import annotations

import resource
import subprocess
import sys

from bench.common import run_measured

MIB = 1024  # ru_maxrss and run_measured's peak are in KiB


def test_the_peak_is_the_childs_own_not_its_spawners() -> None:
    ballast = bytearray(256 << 20)
    ballast[::4096] = bytes(len(ballast) // 4096)  # every page written: resident
    subprocess.run(["true"], check=True)
    direct = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert direct >= 256 * MIB  # what a child spawned from here reports
    _wall, _cpu, peak, code = run_measured(["true"])
    assert code == 0 and peak < 64 * MIB
    grow = "x = bytearray(128 << 20); x[::4096] = bytes(len(x) // 4096)"
    _wall, _cpu, big, code = run_measured([sys.executable, "-c", grow])
    assert code == 0 and 128 * MIB <= big < 200 * MIB
    del ballast


def test_a_failing_command_gives_its_exit_code() -> None:
    assert run_measured([sys.executable, "-c", "raise SystemExit(3)"])[3] == 3
    assert run_measured(["/nonexistent/command"])[3] == 127
