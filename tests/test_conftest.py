"""The shared test helpers of tests/conftest.py: the live-kernel check says why it refuses,
and a started program is always stopped by its pid."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

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


def test_live_tests_run_in_one_group_and_modules_stay_whole(request: pytest.FixtureRequest
                                                            ) -> None:
    """make test's parallel run (--dist loadgroup) keeps every `live` test in one group (one
    worker, one test at a time) and each module's other tests together."""

    class Item:
        def __init__(self, nodeid: str, live: bool) -> None:
            self.nodeid, self.live = nodeid, live

        def get_closest_marker(self, name: str) -> object:
            return object() if name == "live" and self.live else None

    def group(nodeid: str, live: bool) -> str:
        return conftest.xdist_group_of(Item(nodeid, live))  # type: ignore[arg-type]

    assert group("tests/test_kcheck.py::test_a", True) == conftest.UPROBES_GROUP
    assert group("tests/test_sdt_kernel.py::test_b[x]", True) == conftest.UPROBES_GROUP
    assert group("tests/test_kcheck.py::test_c", False) == "tests/test_kcheck.py"
    assert group("tests/test_x.py::Cls::test_d", False) == "tests/test_x.py"
    if request.config.pluginmanager.hasplugin("xdist"):  # and as the hook marked this run's
        for i in request.session.items:
            (mark,) = i.iter_markers("xdist_group")
            assert (mark.args or (mark.kwargs["name"],))[0] == conftest.xdist_group_of(i)
