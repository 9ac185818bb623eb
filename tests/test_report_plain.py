"""report/plain.py lays out the `list` and `check` tables without rich: on a page wide enough for
every row the text is rich's, character for character, on every fixture, the real binaries and
generated tables; on a narrower page ($COLUMNS) rows wrap only between the words of a word
column, and no name is ever cut."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import REAL_BINARIES, fixture, fixture_files, run_cli
from usdtpatch import cli
from usdtpatch.analysis import check as check_mod
from usdtpatch.cli.cmd_check import build_document
from usdtpatch.report.plain import (
    check_text,
    list_text,
    plain_output,
    table,
    wrap_words,
)
from usdtpatch.report.render import make_console, render_check, render_list
from usdtpatch.report.text import FORMS_LINE

FILES = [*fixture_files(), *(p for p in REAL_BINARIES.values() if p.exists())]


WIDE = 1 << 16  # a page no row is wider than


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


def _stripped(text: str) -> str:
    """rich's text without the spaces it pads each row's last cell with (plain text ends no
    line in a space: issue 47, item 5)."""
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def _rich_list(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    render_list(make_console(buf, width=WIDE), doc)
    return _stripped(buf.getvalue())


def _rich_check(doc: dict[str, Any], summary_only: bool = False) -> str:
    buf = io.StringIO()
    render_check(make_console(buf, width=WIDE), doc, summary_only)
    return _stripped(buf.getvalue())


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_list_and_check_tables_are_richs(path: Path) -> None:
    res = run_cli("list", "--json", path)
    doc = json.loads(res.out)
    text = list_text(doc)
    assert text is not None
    assert text == _rich_list(doc)
    res = run_cli("check", "--json", "--fail-on", "never", path)
    doc = json.loads(res.out)
    for summary in (False, True):
        text = check_text(doc, summary)
        assert text is not None
        assert text == _rich_check(doc, summary)


_word = st.text(alphabet="abcdefghij_:()<>*&,.+0123456789", min_size=1, max_size=40)
_cell = st.lists(_word, min_size=1, max_size=8).map(" ".join)
_spaced = st.builds(lambda a, b, c: a + " " * b + c, _word, st.integers(0, 3), _word)


def _probe(function: str, args: str, name: str) -> dict[str, Any]:
    return {"provider": "p", "name": name, "address": 0x1000, "file_offset": 0x1000,
            "semaphore": None, "site": {"form": "nop1", "disassembly": "nop"},
            "function": function,
            "arguments": [{"raw": a} for a in args.split(" ")]}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.one_of(_cell, _spaced), _cell, _word), min_size=1, max_size=6),
       st.text(alphabet="abc /.", min_size=1, max_size=200))
def test_generated_list_tables_are_richs(rows: list[tuple[str, str, str]], path: str) -> None:
    doc = {"files": [{"path": path, "probe_count": len(rows),
                      "elf": {"class": 64, "byteorder": "little", "machine": "x86-64"},
                      "probes": [_probe(f, a, n) for f, a, n in rows], "findings": []}],
           "errors": []}
    text = list_text(doc)
    if text is not None:
        assert text == _rich_list(doc)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_word, _word, _cell), min_size=1, max_size=6),
       st.integers(10, 200))
def test_narrow_pages_wrap_between_words_only(rows: list[tuple[str, str, str]],
                                              width: int) -> None:
    """Whatever the page: every row on one line where it fits; else each line within the page
    (but a lone word wider than it), no line ending in a space, and every word of every cell
    there, whole (a "-" cell, nothing to say, may go), each row starting at the line's first
    column and its other lines indented or in its columns."""
    from collections import Counter

    headers = ("probe", "function", "findings")
    lines = table(headers, rows, (False, False, True), width)
    widths = [max(len(c) for c in col) for col in zip(headers, *rows, strict=True)]
    natural = widths[0] + 1 + 1 + widths[1] + 1 + 1 + widths[2]  # the gaps: 2 spaces each
    if natural <= width:  # every row on one line
        assert len(lines) == len(rows) + 1
    for line in lines:
        assert line == line.rstrip()
        assert len(line) <= width or len(line.split()) == 1 or \
            (line.startswith(" ") and len(line.split()) == 2 and line.split()[0].endswith(":")), \
            (width, line)
    labels = {f"{h}:" for h in headers}
    said = Counter(w for line in lines for w in line.split()
                   if w not in labels and w not in headers and w != "-")
    cells = Counter(w for row in rows for c in row for w in c.split() if w != "-")
    assert said == cells, (width, lines)
    starts = [line for line in lines if line and not line.startswith(" ")]
    assert [x.split()[0] for x in starts[-len(rows):]] == [r[0] for r in rows]


@pytest.mark.parametrize("width", [1, 3, 10, 40])
@given(text=st.text(alphabet="ab c", max_size=120))
@settings(max_examples=60, deadline=None)
def test_wrap_words_never_cuts_a_word(width: int, text: str) -> None:
    lines = wrap_words(text, width)
    assert " ".join(lines).split() == text.split()
    assert all(len(line) <= width or " " not in line for line in lines)


def test_piped_check_honours_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import fixture

    path = fixture("demo")  # demo:parse has two finding codes
    doc = json.loads(run_cli("check", "--json", "--fail-on", "never", path).out)
    sites = doc["files"][0]["sites"]
    wide = check_text(doc)
    assert wide is not None
    lines = wide.splitlines()
    rows = lines[1 : 2 + len(sites)]  # the heading and one line per site
    assert [r.split()[0] for r in rows[1:]] == [f"{s['provider']}:{s['name']}" for s in sites]
    longest = max(len(r.rstrip()) for r in rows)
    monkeypatch.setenv("COLUMNS", str(max(map(len, lines))))
    assert check_text(doc) == wide  # the page allows every line: unchanged
    monkeypatch.setenv("COLUMNS", str(longest))
    at_rows = check_text(doc)
    assert at_rows is not None
    assert at_rows.splitlines()[:len(rows) + 1] == lines[:len(rows) + 1]  # the rows
    monkeypatch.setenv("COLUMNS", str(longest - 10))
    narrow = check_text(doc)
    assert narrow is not None
    table_lines = narrow.splitlines()[1 : 3 + len(sites)]
    assert len(table_lines) == len(sites) + 2  # demo:parse's findings on two lines
    assert all(len(r.rstrip()) <= longest - 10 for r in table_lines)
    for s in sites:  # the function and every finding code whole
        assert s["function"] in narrow
        for f in s["findings"]:
            assert f" {f['code']}" in narrow
    monkeypatch.setenv("COLUMNS", "20")  # narrower than the names: rows run past, uncut
    tiny = check_text(doc)
    assert tiny is not None and "parse+0x3a" in tiny and "red-zone-rewrite" in tiny
    # through the command line, in a pipe (run_cli's stdout is not a terminal)
    monkeypatch.setenv("COLUMNS", str(longest - 10))
    assert run_cli("check", "--fail-on", "never", path).out.startswith(narrow)


def test_non_ascii_is_left_to_rich() -> None:
    doc = {"files": [{"path": "x", "probe_count": 1,
                      "elf": {"class": 64, "byteorder": "little", "machine": "x86-64"},
                      "probes": [_probe("caf\u00e9", "8@%rax", "n")], "findings": []}],
           "errors": []}
    assert list_text(doc) is None


def test_plain_only_where_rich_sees_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    assert plain_output(io.StringIO())
    assert not plain_output(Tty())
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not plain_output(io.StringIO())
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert plain_output(Tty())


def test_several_files_and_an_unreadable_one_are_richs(tmp_path: Path) -> None:
    from tests.helpers import fixture

    missing = tmp_path / ("x" * 180)  # an error line longer than rich's old page: one line
    res = run_cli("check", "--json", "--fail-on", "never", fixture("demo"), missing,
                  fixture("odd-note"))
    doc = json.loads(res.out)
    assert doc["errors"]
    assert check_text(doc) == _rich_check(doc)
    res = run_cli("list", "--json", fixture("demo"), fixture("bad-args"), fixture("noprobes"))
    doc = json.loads(res.out)
    assert list_text(doc) == _rich_list(doc)


def test_a_check_table_rich_lays_out_is_made_from_one_analysis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table the plain layout leaves to rich (a path that is not ASCII) is rich's layout of
    the rows written as the sites were decided: the file is analysed once (it was twice: the
    whole document made again for rich), and the text is rich's of the whole document."""
    copy = tmp_path / "prögram"
    copy.write_bytes(fixture("demo").read_bytes())
    ran: list[str] = []
    analysis = check_mod.check

    def counting(*args: Any, **kw: Any) -> Any:
        ran.append("check")
        return analysis(*args, **kw)

    monkeypatch.setattr(check_mod, "check", counting)
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["check", "--fail-on", "never", str(copy)], out, err)
    assert rc == 0 and ran == ["check"], err.getvalue()
    whole = build_document([str(copy)], None, "never")
    assert check_text(whole) is None  # rich lays it out
    assert out.getvalue() == _rich_check(whole) + FORMS_LINE + "\n"
    assert "error [" in out.getvalue() or "warning [" in out.getvalue()  # site findings too
