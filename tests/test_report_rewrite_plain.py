"""`rewrite`'s table without rich (report/plain.py's rewrite_text): the text must be rich's,
character for character, on the fixtures and on generated documents (long details that
wrap, skipped sites with codes, notes, the form-chosen line)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import fixture_files, run_cli
from usdtpatch.report.plain import rewrite_lines, rewrite_text
from usdtpatch.report.render import make_console, render_rewrite
from usdtpatch.report.text import print_rewrite, rich_width

FILES = fixture_files()


def _rich(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    render_rewrite(make_console(buf, width=rich_width(buf)), doc)  # as print_rewrite does
    # without the spaces rich pads a row's last cell with: no line ends in one (issue 47)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def test_fixture_rewrite_tables_are_richs() -> None:
    res = run_cli("rewrite", "--dry-run", "--json", "--no-verify", "--form", "nop5",
                  *(str(p) for p in FILES))
    doc = json.loads(res.out)
    assert len(doc["files"]) >= 10
    for f in doc["files"]:
        one = {**doc, "files": [f]}
        text = rewrite_text(one)
        assert text is not None
        assert text == _rich(one), f["path"]


def _site(i: int, reason: str, code: str | None) -> dict[str, Any]:
    return {"provider": "prov", "name": f"probe_{i}" * (1 + i % 3), "address": 0x1000 + i,
            "action": "skipped" if code else "detour", "code": code, "reason": reason,
            "new_pc": None if code else 0x9000 + i, "guarded": bool(i % 2),
            "extra_jumps_per_pass": 0 if code else 2}


@pytest.mark.parametrize("width", [40, 90, 200])
def test_generated_rewrite_tables_are_richs(width: int) -> None:
    words = ("the window at 0x1234 overlaps a branch target reached from "
             "0xabcdef and averyveryverylongwordwithoutanyspaceatall" * 2)
    sites = [_site(i, words[: (i * 37) % len(words)] or "x", "window-call" if i % 4 == 0
                   else None) for i in range(30)]
    f = {"path": "a/b" * width, "output": None, "form": "nop5", "guard": "auto",
         "verified": True, "changed": True, "counts": {"detour": 22, "skipped": 8},
         "sites": sites,
         "findings": [{"code": "form-chosen", "severity": "info", "where": "",
                       "message": "nop5: the running kernel optimizes it", "hint": ""},
                      {"code": "x-y", "severity": "warning", "where": "prov:p",
                       "message": "something " * 30, "hint": "do that"}]}
    noted = {**f, "path": "noted", "note": "nothing to rewrite " * 12}
    doc = {"files": [f, noted], "errors": []}
    text = rewrite_text(doc)
    assert text is not None
    assert text == _rich(doc)


def test_non_ascii_is_left_to_rich() -> None:
    f = {"path": "\u00e9", "output": "o", "form": "nop5", "guard": "auto", "verified": False,
         "changed": False, "counts": {}, "sites": [], "findings": []}
    assert rewrite_text({"files": [f], "errors": []}) is None


def test_rewrite_to_a_pipe_is_plain(tmp_path: Path) -> None:
    """The CLI writes the plain text to a file (what rich would write there)."""
    res = run_cli("rewrite", "--dry-run", "--no-verify", "--form", "nop5", str(FILES[0]))
    doc = json.loads(run_cli("rewrite", "--dry-run", "--json", "--no-verify", "--form",
                             "nop5", str(FILES[0])).out)
    assert res.out == _rich(doc)


class _Counting(io.StringIO):
    """A pipe that counts its writes and how long the longest one was."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.longest = 0

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        self.writes += 1
        self.longest = max(self.longest, len(s))
        return super().write(s)


def test_the_rewrite_table_is_written_as_it_is_made() -> None:
    """print_rewrite puts each line out as it is made (issue 22: 1M sites made one string of
    every row first): many writes, none longer than a line, the same text."""
    sites = [_site(i, f"window of {i} bytes", None) for i in range(2000)]
    f = {"path": "big", "output": "big.out", "form": "nop5", "guard": "auto",
         "verified": False, "changed": True, "counts": {"detour": 2000}, "sites": sites,
         "findings": []}
    doc = {"files": [f], "errors": []}
    out = _Counting()
    print_rewrite(out, doc)
    assert out.getvalue() == rewrite_text(doc)
    assert out.writes > 2000 and out.longest < 200


def test_a_late_line_rich_must_lay_out_writes_nothing_plain() -> None:
    """Text the plain layout cannot reproduce in the last file's finding: rich lays out the
    whole report, no plain line is written before (the lines are checked first)."""
    ok = {"path": "a", "output": "o", "form": "nop5", "guard": "auto", "verified": False,
          "changed": True, "counts": {}, "sites": [_site(1, "r", None)], "findings": []}
    late = {**ok, "path": "b", "findings": [{"code": "x-y", "severity": "warning",
                                             "where": "", "message": "\u00e9", "hint": ""}]}
    doc = {"files": [ok, late], "errors": []}
    assert rewrite_lines(doc) is None
    out = _Counting()
    print_rewrite(out, doc)
    assert out.getvalue() == _rich(doc)
