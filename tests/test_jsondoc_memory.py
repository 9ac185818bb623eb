"""jsondoc.nesting (the depth bound read before every marker and plan is parsed) holds no
memory that grows with the document's strings (issue 38, rewrite's memory): the output
check of a 10,000-site rewrite read the marker's 480,000-character string with ~65 MB."""

from __future__ import annotations

import re
import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from usdtpatch import jsondoc


def _former(data: bytes) -> int:
    """The definition as it was: the strings cut out, then the brackets counted."""
    depth = deepest = 0
    for m in re.finditer(rb"[\[\]{}]", re.sub(rb'"(?:[^"\\]|\\.)*"', b"", data, flags=re.DOTALL)):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def test_nesting_of_a_long_string_and_many_strings_holds_no_copy() -> None:
    doc = (b'{"notes": "' + b"0a" * 250_000 + b'", "sites": [' +
           b", ".join(b'{"probe": "p%d", "reason": "x[y]"}' % i for i in range(20_000)) + b"]}")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        depth = jsondoc.nesting(doc)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert depth == 3
    assert peak < 100_000, f"{peak} bytes held reading {len(doc)} bytes"


@given(st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"a", b"\n", b",", b'\\"',
                                 b"\\\\", b'"[{"', b"\\["]), max_size=40).map(b"".join))
def test_nesting_counts_the_brackets_outside_strings_as_before(data: bytes) -> None:
    assert jsondoc.nesting(data) == _former(data)
