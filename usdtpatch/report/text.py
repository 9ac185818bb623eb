"""The table reports (`list`, `check`, `rewrite`) printed: plain text to a file or pipe
(report/plain.py, no rich), rich to a terminal (report/render.py, imported only then).

The one module that chooses between the two, so that neither imports the other's way back:
render.py takes its cells from plain.py, and plain.py imports nothing of report/.

Deferred imports: report/render.py (rich), only for a terminal.
"""

from __future__ import annotations

from typing import IO, Any

from usdtpatch.report.plain import (
    check_text,
    list_text,
    page_width,
    plain_output,
    rewrite_lines,
)

# which site form each kernel generation optimizes (docs/rewrite.md, "Site forms")
FORMS_LINE = ("site forms: Linux 6.18 to 7.2 optimize 5-byte NOPs (rewrite --form nop5); the "
              "queued nop10 series only the 10-byte NOP (--form combo10); rewrite --form auto "
              "takes the running kernel's")


# rich's page for what it lays out in a pipe (non-ASCII text): $COLUMNS, else wide enough
# for any row (rich pads no line to the page's width)
_UNLIMITED = 1 << 16


def rich_width(out: IO[str]) -> int | None:
    """The width rich lays a table out at: the terminal's (None) or the plain page's."""
    return (page_width() or _UNLIMITED) if plain_output(out) else None


def print_list(out: IO[str], doc: dict[str, Any]) -> None:
    """Print `list`'s table report: plain text to a file or pipe, rich to a terminal."""
    text = list_text(doc) if plain_output(out) else None
    if text is not None:
        out.write(text)
        return
    from usdtpatch.report.render import make_console, render_list

    render_list(make_console(out, width=rich_width(out)), doc)


def print_check(out: IO[str], doc: dict[str, Any], summary_only: bool = False,
                forms_line: bool = False) -> None:
    """Print `check`'s table report: plain text to a file or pipe, rich to a terminal; with
    `forms_line`, FORMS_LINE after it when a file has sites."""
    text = check_text(doc, summary_only) if plain_output(out) else None
    if text is not None:
        out.write(text)
    else:
        from usdtpatch.report.render import make_console, render_check

        render_check(make_console(out, width=rich_width(out)), doc, summary_only=summary_only)
    if forms_line and any(f.get("sites") for f in doc.get("files", [])):
        out.write(FORMS_LINE + "\n")


def print_rewrite(out: IO[str], doc: dict[str, Any]) -> None:
    """Print `rewrite`'s table report: plain text to a file or pipe, rich to a terminal."""
    lines = rewrite_lines(doc) if plain_output(out) else None
    if lines is not None:
        for line in lines:  # written as made: no joined report of every site
            out.write(line + "\n")
        return
    from usdtpatch.report.render import make_console, render_rewrite

    render_rewrite(make_console(out, width=rich_width(out)), doc)
