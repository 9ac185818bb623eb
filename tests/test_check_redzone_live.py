"""The red-zone finding against the real kernel: the fixture `check` flags (red-zone-live) is
corrupted when its nop5 site is probed and optimized; the two it clears are not.

Needs root, the uprobe PMU and the uprobe syscall (Linux 6.18+); skipped with the reason
elsewhere. Each fixture is copied first (a uprobe belongs to an inode), run once unprobed for
its reference output, then run pinned to CPU 0 with a counting uprobe on CPU 0 at its site;
the probe is closed in a finally block.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cpu0_reason, pinned_to_cpu0
from tests.helpers import fixture
from usdtpatch.analysis.check import check
from usdtpatch.api import load

CALLS = 1000  # redzone.c and redzone-nonleaf.c call the probed function 1000 times


pytestmark = [pytest.mark.live,
              pytest.mark.skipif(cpu0_reason() is not None, reason=cpu0_reason() or "")]


def _run(path: Path) -> str:
    res = subprocess.run([str(path)], capture_output=True, text=True, timeout=60, check=True,
                         preexec_fn=pinned_to_cpu0)
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
