"""JSON documents from files: the restore marker in `.note.usdtpatch`, plan files.

json.loads recurses once per level of nesting: a marker or plan nested 100,000 deep raised
RecursionError out of every command (issue 20, item 9), and one 2,000 deep that json accepts
would still exhaust the recursion of the code walking it. No document usdtpatch reads nests
deeper than a few levels, so nesting is bounded before the text is parsed (MAX_DEPTH), and
every refusal is a ValueError with one sentence (json's own errors are ValueErrors too: a
number of more than 4,300 digits among them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 64  # a plan nests 6 levels, the marker 3
# A string (skipped) or a bracket, leftmost first: the brackets outside strings, one match
# at a time. The string's characters are one run between escapes ([^"\\]*): sre keeps a
# backtracking mark for every repetition of a group, so the former (?:[^"\\]|\\.)* held
# ~136 bytes per character of the longest string (the marker's notes: 65 MB at 10,000
# sites, the peak of rewrite), and re.sub of the strings first a piece per string.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def nesting(data: bytes | memoryview) -> int:
    """How deep the arrays and objects of the JSON text `data` nest (strings skipped)."""
    depth = deepest = 0
    for m in _TOKEN.finditer(data):
        c = data[m.start()]
        if c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c != 0x22:  # '"': a string
            depth -= 1
    return deepest


def loads(data: bytes | memoryview | str,
          object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """The document in `data`; ValueError (one sentence) when it is not JSON or nests
    deeper than MAX_DEPTH. `object_hook` is json's: what each object is read as. A view of
    bytes (a marker inside a file's bytes) is read where it lies: only json's text is made
    of it, as json.loads makes it of bytes (issue 38: the output check's copies of a
    10,000-site marker were 7.5 MB)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    deep = nesting(raw)
    if deep > MAX_DEPTH:
        raise ValueError(f"arrays and objects nested {deep} deep (at most {MAX_DEPTH})")
    if isinstance(raw, memoryview):  # decoded as json.loads decodes bytes
        text: bytes | str = str(raw, json.detect_encoding(raw[:4].tobytes()), "surrogatepass")
    else:
        text = raw
    try:
        return json.loads(text, object_hook=object_hook)
    except RecursionError as exc:  # unreachable below MAX_DEPTH; kept as a last guard
        raise ValueError("arrays and objects nested too deep") from exc
