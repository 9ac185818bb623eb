"""The none-6.1 guest: Debian 12's own 6.1 (no uprobe syscall: nothing is optimized), booted
under qemu by tests/guests.py, one session for every check: the uprobe syscall's errno, each
site form's hits and bytes, kcheck's document, bpftrace's counts. The kernel comes from `make
guest-kernels`; without it every test fails with the reason."""

from __future__ import annotations

import pytest

from tests.guests import GuestChecks

pytestmark = [pytest.mark.slow, pytest.mark.guest]


class TestGuest(GuestChecks):
    KEY = "none-6.1"
