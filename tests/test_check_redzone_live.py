"""The red-zone finding against the real kernel: the fixture `check` flags (red-zone-live) is
corrupted when its nop5 site is probed and optimized; the two it clears are not.

Needs root, the uprobe PMU and the uprobe syscall (Linux 6.18+); skipped with the reason
elsewhere. Each fixture is copied first (a uprobe belongs to an inode), run once unprobed for
its reference output, then run pinned to CPU 0 with a counting uprobe on CPU 0 at its site;
the probe is closed in a finally block.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import fixture
from usdtpatch.cli.common import load
from usdtpatch.errors import UsdtpatchError
from usdtpatch.sites.check import check

CALLS = 1000  # redzone.c and redzone-nonleaf.c call the probed function 1000 times


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (system-wide perf_event_open uprobes)"
    try:
        from usdtpatch.live.perf import has_uprobe_syscall, uprobe_pmu_type
    except ImportError as exc:  # the live module is another issue's
        return f"usdtpatch.live.perf is not available: {exc}"
    try:
        uprobe_pmu_type()
    except UsdtpatchError as exc:
        return str(exc)
    if not has_uprobe_syscall():
        return "the kernel has no uprobe syscall (336): sites are never optimized"
    if 0 not in os.sched_getaffinity(0):
        return "CPU 0 is not available to pin the test program"
    return None


_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def _run(path: Path) -> str:
    res = subprocess.run([str(path)], capture_output=True, text=True, timeout=60, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    return res.stdout


@pytest.mark.parametrize(("name", "flagged"), [
    ("redzone-leaf-nop5", True),
    ("redzone-leaf-nored", False),
    ("redzone-nonleaf-nop5", False),
])
def test_flagged_site_is_corrupted_when_optimized(name: str, flagged: bool,
                                                  tmp_path: Path) -> None:
    from usdtpatch.live.perf import open_uprobe

    exe = tmp_path / name
    shutil.copy2(fixture(name), exe)
    ps = load(str(exe))
    report = check(ps)
    codes = {f.code for f in report.all_findings}
    assert ("red-zone-live" in codes) == flagged  # the static half
    (site,) = report.sites
    assert site.outcome == "optimizable" and site.probe.offset is not None

    reference = _run(exe)
    probe = open_uprobe(str(exe), site.probe.offset, pid=-1, cpu=0)
    try:
        probed = _run(exe)
        hits = probe.count()
    finally:
        probe.close()
    assert hits == CALLS
    if flagged:
        assert probed != reference, "the optimized nop5 must clobber the red zone"
    else:
        assert probed == reference
    assert _run(exe) == reference  # detached: the file's code is whole again
