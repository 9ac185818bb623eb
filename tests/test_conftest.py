"""The shared test helpers of tests/conftest.py: the live-kernel check says why it refuses,
and a started program is always stopped by its pid."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import conftest
from tests.conftest import Started, StartProcess, live_kernel_reason, started
from usdtpatch.errors import UnsupportedError
from usdtpatch.live import perf


@pytest.fixture
def fresh_reason() -> Iterator[None]:
    live_kernel_reason.cache_clear()
    yield
    live_kernel_reason.cache_clear()


def test_live_check_needs_root(monkeypatch: pytest.MonkeyPatch, fresh_reason: None) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert live_kernel_reason() == "needs root (perf_event_open uprobes, /proc/PID/mem)"


def test_live_check_needs_the_uprobe_pmu(monkeypatch: pytest.MonkeyPatch,
                                         fresh_reason: None) -> None:
    def no_pmu() -> int:
        raise UnsupportedError("/sys/bus/event_source/devices/uprobe/type: no uprobe PMU")

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(perf, "uprobe_pmu_type", no_pmu)
    assert "no uprobe PMU" in (live_kernel_reason() or "")


def test_live_check_needs_the_uprobe_syscall(monkeypatch: pytest.MonkeyPatch,
                                             fresh_reason: None) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(perf, "uprobe_pmu_type", lambda: 9)
    monkeypatch.setattr(perf, "has_uprobe_syscall", lambda: False)
    assert "no uprobe syscall (336)" in (live_kernel_reason() or "")
    monkeypatch.setattr(perf, "has_uprobe_syscall", lambda: True)
    live_kernel_reason.cache_clear()
    assert live_kernel_reason() is None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


SLEEPER = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"]


def test_started_stops_by_pid_even_on_failure() -> None:
    pid = 0
    with pytest.raises(RuntimeError), started(SLEEPER, stdout=subprocess.PIPE) as proc:
        pid = proc.pid
        assert proc.line(10) == "ready"
        assert _alive(pid)
        raise RuntimeError("the test failed")
    assert pid and not _alive(pid)


def test_line_times_out_and_stop_is_idempotent() -> None:
    proc = Started([sys.executable, "-c", "import time; time.sleep(60)"],
                   stdout=subprocess.PIPE)
    try:
        assert proc.line(0.2) is None
    finally:
        proc.stop()
    proc.stop()
    assert not _alive(proc.pid)


_LEFT: list[int] = []


def test_start_process_fixture_starts(start_process: StartProcess) -> None:
    proc = start_process(SLEEPER, stdout=subprocess.PIPE)
    assert proc.line(10) == "ready"
    _LEFT.append(proc.pid)


def test_start_process_fixture_stopped_it() -> None:
    """Runs after the test above (pytest keeps file order): its program is gone."""
    assert _LEFT and not _alive(_LEFT[0])


def test_markers_are_registered(pytestconfig: pytest.Config) -> None:
    names = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert {"slow", "live", "needs_cc"} <= names
    assert "--strict-markers" in pytestconfig.getini("addopts")
    assert conftest.__doc__ is not None and "needs_cc" in conftest.__doc__


def _can_take(path: str | os.PathLike[str]) -> bool:
    """Whether another process can take the lock `path` right now."""
    probe = [sys.executable, "-c",
             "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n"
             "    sys.exit(1)\n", os.fspath(path)]
    return subprocess.run(probe, check=False).returncode == 0


def test_uprobe_lock_keeps_live_tests_apart(tmp_path: Path) -> None:
    """While one process holds the lock, another (a second xdist worker, or another test run)
    cannot take it; once released it can (a lock of this test's own: the live tests' one may
    be held by another worker meanwhile)."""
    path = str(tmp_path / "lock")
    with conftest.uprobe_lock(path):
        assert not _can_take(path)
    assert _can_take(path)


@pytest.mark.live
def test_a_live_test_holds_the_lock() -> None:
    assert not _can_take(conftest.UPROBE_LOCK)
