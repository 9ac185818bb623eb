"""This machine's own kernel through the guests' session (tests/guests.py), without a guest:
the same site program, forms and checks as tests/test_live_guest_*.py, judged against the row
of the running kernel's generation (6.18.44 here: the nop5 generation), so that the measured
table's every column (6.1, 6.18, 7.2.13, 7.3) is checked on each run of `make test`."""

from __future__ import annotations

import pytest

from tests.guests import HOST_KEY, GuestChecks

pytestmark = [pytest.mark.slow, pytest.mark.live, pytest.mark.needs_cc]


class TestHost(GuestChecks):
    KEY = HOST_KEY
