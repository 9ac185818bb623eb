"""report/plain.py lays out the `list` and `check` tables without rich: the text must be rich's,
character for character, on every fixture, the real binaries and generated tables."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import REAL_BINARIES, fixture_files, run_cli
from usdtpatch.report.plain import check_text, list_text, plain_output, wrap
from usdtpatch.report.render import make_console, render_check, render_list

FILES = [*fixture_files(), *(p for p in REAL_BINARIES.values() if p.exists())]


def _rich_list(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    render_list(make_console(buf), doc)
    return buf.getvalue()


def _rich_check(doc: dict[str, Any], summary_only: bool = False) -> str:
    buf = io.StringIO()
    render_check(make_console(buf), doc, summary_only)
    return buf.getvalue()


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


@pytest.mark.parametrize("width", [1, 3, 10, 40])
@given(text=st.text(alphabet="ab c\t", max_size=120))
@settings(max_examples=60, deadline=None)
def test_wrap_is_richs(width: int, text: str) -> None:
    from rich.console import Console
    from rich.text import Text

    text = text.replace("\t", "  ")
    lines = Text(text).wrap(Console(width=200), width, overflow="fold")
    assert wrap(text, width) == [line.plain for line in lines]


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

    missing = tmp_path / ("x" * 180)  # an error line longer than the page: it wraps
    res = run_cli("check", "--json", "--fail-on", "never", fixture("demo"), missing,
                  fixture("odd-note"))
    doc = json.loads(res.out)
    assert doc["errors"]
    assert check_text(doc) == _rich_check(doc)
    res = run_cli("list", "--json", fixture("demo"), fixture("bad-args"), fixture("noprobes"))
    doc = json.loads(res.out)
    assert list_text(doc) == _rich_list(doc)
