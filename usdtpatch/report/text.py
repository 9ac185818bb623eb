"""The table reports (`list`, `check`, `rewrite`) printed: plain text (report/plain.py, no
rich) to a file, a pipe and a terminal alike, under one rule (no value cut, no column
dropped, rows wrapped only between the words of a word column): a pipe's page is $COLUMNS
wide (else unlimited), a terminal's is $COLUMNS or the terminal's width. rich
(report/render.py) lays out only what plain.py does not reproduce (non-ASCII or control
characters), on a page no row is cut at.

The one module that chooses between the two, so that neither imports the other's way back:
render.py takes its cells from plain.py, and plain.py imports nothing of report/.

Deferred imports: report/render.py (rich), only for text plain.py leaves to it.
"""

from __future__ import annotations

import os

from usdtpatch.kernelfacts import OPTIMIZING
from usdtpatch.report.plain import (
    check_text,
    list_text,
    page_width,
    plain_output,
    rewrite_lines,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:
    from typing import IO, Any

# which site form each kernel generation optimizes (docs/rewrite.md, "Site forms")
FORMS_LINE = "site forms: " + "; ".join(
    f"the {g.name} generation (e.g. Linux {', '.join(g.examples)}) optimizes only "
    f"{g.nop_length}-byte NOPs (rewrite --form {g.auto_form})" for g in OPTIMIZING) + \
    "; rewrite --form auto takes the running kernel's"


# rich's page for what it lays out in a pipe (non-ASCII text): $COLUMNS, else wide enough
# for any row (rich pads no line to the page's width)
_UNLIMITED = 1 << 16


def rich_width(out: IO[str]) -> int | None:
    """The width rich lays a table out at: the plain page's in a pipe; on a terminal a page
    no row is wider than (rich folds a column inside words, and drops columns, to fit a
    narrower one; the terminal wraps what is wider)."""
    return (page_width() or _UNLIMITED) if plain_output(out) else _UNLIMITED


def terminal_width(out: IO[str]) -> int | None:
    """The page of a report on `out`: $COLUMNS, else a terminal's width, else unlimited."""
    columns = page_width()
    if columns is not None or plain_output(out):
        return columns
    try:
        return os.get_terminal_size(out.fileno()).columns or None
    except (AttributeError, ValueError, OSError):  # no descriptor (a test's buffer)
        return None


def print_list(out: IO[str], doc: dict[str, Any]) -> None:
    """Print `list`'s table report: plain text (rich for what plain.py leaves to it)."""
    text = list_text(doc, terminal_width(out))
    if text is not None:
        out.write(text)
        return
    from usdtpatch.report.render import make_console, render_list

    render_list(make_console(out, width=rich_width(out)), doc)


def print_check(out: IO[str], doc: dict[str, Any], summary_only: bool = False,
                forms_line: bool = False) -> None:
    """`check`'s table report: plain text (rich for what plain.py leaves to it, from the
    same document: a file's sites' rows where cmd_check's writer made them); with
    `forms_line`, FORMS_LINE after it when a file has sites."""
    text = check_text(doc, summary_only, terminal_width(out))
    if text is not None:
        out.write(text)
    else:
        from usdtpatch.report.render import make_console, render_check

        render_check(make_console(out, width=rich_width(out)), doc, summary_only=summary_only)
    if forms_line and any(f.get("sites") or f.get("rows") for f in doc.get("files", [])):
        out.write(FORMS_LINE + "\n")


def print_rewrite(out: IO[str], doc: dict[str, Any]) -> None:
    """Print `rewrite`'s table report: plain text (rich for what plain.py leaves to it)."""
    lines = rewrite_lines(doc, terminal_width(out))
    if lines is not None:
        for line in lines:  # written as made: no joined report of every site
            out.write(line + "\n")
        return
    from usdtpatch.report.render import make_console, render_rewrite

    render_rewrite(make_console(out, width=rich_width(out)), doc)
