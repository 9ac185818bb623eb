"""The nop10-7.3 guest: Debian's experimental 7.3 (the nop10 series), booted under qemu by
tests/guests.py, one session for every check: the uprobe syscall's errno, each site form's hits
and bytes, kcheck's document, bpftrace's counts, the nop10 protocol's states. The kernel comes
from `make guest-kernels`; without it every test fails with the reason."""

from __future__ import annotations

import pytest

from tests.guests import GuestChecks, Nop10ProtocolChecks

pytestmark = [pytest.mark.slow, pytest.mark.guest]


class TestGuest(GuestChecks, Nop10ProtocolChecks):
    KEY = "nop10-7.3"
