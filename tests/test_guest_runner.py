"""tests/guests.py's runner and tools/fetch_kernels.py's choices: a guest that overruns its
time limit is stopped by its pid (vng's process group, qemu in it), and the package names each
guest takes (the kernel's own flavour, never cloud or rt, never a debug or unsigned image)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.guests import GuestUnavailable, boot, group_alive, guest_lock, kernel
from tools.fetch_kernels import GUESTS, version_key


@pytest.mark.slow
@pytest.mark.guest
def test_a_guest_past_its_limit_is_stopped_by_pid(tmp_path: Path) -> None:
    try:
        kernel("nop10-7.3")
    except GuestUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    with guest_lock():
        run = boot("nop10-7.3", ["sleep", "600"], tmp_path, timeout=4)
    assert run.timed_out and run.exit_code is None and run.seconds < 30, run
    assert not group_alive(run.pid)  # nothing of the group is left: vng and qemu are gone


@pytest.mark.parametrize(("key", "name", "takes"), [
    ("none-6.1", "linux-image-6.1.0-57-amd64", True),
    ("none-6.1", "linux-image-6.1.0-57-amd64-unsigned", False),
    ("none-6.1", "linux-image-6.1.0-57-amd64-dbg", False),
    ("none-6.1", "linux-image-6.1.0-57-cloud-amd64", False),
    ("nop10-7.3", "linux-binary-7.3-amd64", True),
    ("nop10-7.3", "linux-binary-7.3.2-amd64", True),
    ("nop10-7.3", "linux-binary-7.3-cloud-amd64", False),
    ("nop10-7.3", "linux-binary-7.3-rt-amd64", False),
    ("nop10-7.3", "linux-binary-7.30-amd64", False),
    ("nop10-7.2.13", "linux-binary-7.2.13+deb14-amd64", True),
    ("nop10-7.2.13", "linux-binary-7.2.13+deb14-rt-amd64", False),
    ("nop10-7.2.13", "linux-binary-7.2.14+deb14-amd64", False),
])
def test_the_kernel_packages_a_guest_takes(key: str, name: str, takes: bool) -> None:
    assert bool(re.fullmatch(GUESTS[key].packages[0], name)) == takes


def test_the_newest_kernel_of_a_series_wins() -> None:
    parts = ["6.1.0-9", "6.1.0-57", "6.1.0-10"]
    assert max(parts, key=version_key) == "6.1.0-57"
    assert version_key("7.3.1") > version_key("7.3")
