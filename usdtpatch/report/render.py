"""Terminal rendering with rich. The only module that imports rich.

Renderers take the same JSON-shaped documents that `--json` prints, so text and JSON outputs
cannot drift apart.

Deferred imports: rich.progress and time, only for the progress bar.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from usdtpatch.report.plain import (
    CHECK_HEADERS,
    REWRITE_HEADERS,
    check_cells,
    check_summary_line,
    list_cells,
    list_heading,
    page_width,
    plain_output,
    rewrite_cells,
    rewrite_summary_line,
)
from usdtpatch.report.plain import table as plain_table

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


PIPE_WIDTH = 160  # width when the output is not a terminal and $COLUMNS is unset (rich: 80)


def colour_allowed() -> bool:
    """Whether escapes of colour and style may be written at all: not with NO_COLOR set to
    anything but the empty string (no-color.org), nor on TERM=dumb."""
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def make_console(file: IO[str] | None = None, width: int | None = None,
                 color: bool | None = None) -> Console:
    """A console for `file`; to a pipe or file it is $COLUMNS wide (else PIPE_WIDTH) and has
    no colour; nor with NO_COLOR or TERM=dumb (colour_allowed), anywhere (its progress bar
    too: no colour, bold or dim, only the bar's characters)."""
    plain = color is False or not colour_allowed()
    console = Console(file=file, width=width, highlight=False, soft_wrap=False,
                      color_system=None if plain else "auto", no_color=plain)
    if width is None and not console.is_terminal:
        console.width = page_width() or PIPE_WIDTH
    return console


def _hex(v: int | None) -> str:
    return "-" if v is None else f"{v:#x}"


def render_list(console: Console, doc: dict[str, Any]) -> None:
    for f in doc["files"]:
        console.print(Text(list_heading(f), style="bold"))
        if f["probes"]:
            table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
            for col in ("probe", "address", "offset", "semaphore", "site"):
                table.add_column(col, no_wrap=True)
            table.add_column("function", overflow="fold", ratio=1)
            table.add_column("arguments", overflow="fold", ratio=1)
            for p in f["probes"]:
                # Text, not markup: "[clone .cold]" in a C++ name is not a style tag.
                table.add_row(*(Text(c) for c in list_cells(p)))
            console.print(table)
        render_findings(console, f["findings"])


def render_findings(console: Console, findings: list[dict[str, str]]) -> None:
    for fd in findings:
        line = Text()
        line.append(f"{fd['severity']}", style=_SEVERITY_STYLE.get(fd["severity"], ""))
        line.append(f" [{fd['code']}]")
        if fd["where"]:
            line.append(f" {fd['where']}:")
        line.append(f" {fd['message']}")
        if fd["hint"]:
            line.append(f" ({fd['hint']})", style="dim")
        console.print(line, soft_wrap=True)  # one line each, however long


def render_check(console: Console, doc: dict[str, Any], summary_only: bool = False) -> None:
    """`check`'s table per file, its findings and the summary line (an unusable input's
    line is on stderr, once). A file written site by site (cmd_check's writer) carries its
    sites' cells (`rows`) and finding lines (`finding_lines`) in place of their entries:
    the same text, the lines' severity styled (not their hints)."""
    for f in doc["files"]:
        elf = f["elf"]
        console.print(Text(f"{f['path']}: ELF{elf['class']} {elf['machine']}, CFI from "
                           f"{f['cfi']['source']} ({f['cfi']['fdes']} FDEs)", style="bold"))
        made = f.get("rows")
        if (f["sites"] or made) and not summary_only:
            table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
            for col in CHECK_HEADERS[:-2]:
                table.add_column(col, no_wrap=True)
            table.add_column("function", overflow="fold", ratio=1)
            table.add_column("findings", overflow="fold", ratio=1)
            for cells in (check_cells(s) for s in f["sites"]) if made is None else made:
                table.add_row(*(Text(c) for c in cells))
            console.print(table)
        if not summary_only:
            render_findings(console, f["findings"])
            if made is None:
                for s in f["sites"]:
                    render_findings(console, s["findings"])
            for line in f.get("finding_lines", ()) if made is not None else ():
                severity, space, rest = line.partition(" ")
                console.print(Text(severity, style=_SEVERITY_STYLE.get(severity, "")) +
                              Text(space + rest), soft_wrap=True)
        console.print(Text(check_summary_line(f)))


def render_show(console: Console, doc: dict[str, Any]) -> None:
    """`show`: the site and its patch window, before and after, side by side."""
    console.print(Text(f"{doc['path']}  {doc['probe']} at {_hex(doc['address'])} "
                       f"in {doc['function'] or '?'}", style="bold"))
    for k, v in doc["kernels"].items():
        console.print(Text(f"  {k}: {v['outcome']} - {v['reason']}"))
    console.print(Text(f"  outcome: {doc['outcome']}"))
    for t in doc["attempts"]:
        console.print(Text(f"    {t}", style="dim"))
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("", "address", "before", "after (at the site)", "after (detour)"):
        table.add_column(col, no_wrap=True, min_width=len(col) or 2)
    table.add_column("note", overflow="fold", ratio=1)
    for row in doc["rows"]:
        table.add_row(*(Text(c) for c in (row["mark"], _hex(row["address"]), row["before"],
                                          row["after"], row["detour"], row["note"])))
    console.print(table)
    if doc.get("window"):
        w = doc["window"]
        console.print(Text(f"  window [{_hex(w['start'])}, {_hex(w['end'])}) {w['shape']}: "
                           f"starts at {w['start_reason']}; ends: {w['end_reason']}; "
                           f"{w['relocated_bytes']} bytes relocated, "
                           f"{w['extra_jumps']} extra jumps per pass"))
    render_findings(console, doc["findings"])


def render_rewrite(console: Console, doc: dict[str, Any]) -> None:
    """The rewrite report: a table of sites per file and a summary line."""
    for f in doc["files"]:
        if f.get("note") and f["output"] is None:  # a file with nothing to rewrite: one line
            console.print(Text(f"{f['path']}: {f['note']}"))
            continue
        dest = f["output"] or "(dry run: nothing written)"
        console.print(Text(f"{f['path']} -> {dest}", style="bold"))
        if f.get("note"):
            console.print(Text(f"  {f['note']}"))
            continue
        table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        for col in REWRITE_HEADERS[:-1]:
            table.add_column(col, no_wrap=True)
        table.add_column(REWRITE_HEADERS[-1], overflow="fold", ratio=1)
        for s in f["sites"]:
            table.add_row(*(Text(c) for c in rewrite_cells(s)))
        console.print(table)
        line, chosen = rewrite_summary_line(f)
        console.print(Text(line))
        for c in chosen:  # why this form (rewrite --form auto), what the fork guard does
            console.print(Text(c), soft_wrap=True)
        render_findings(console, [x for x in f["findings"] if x["severity"] != "info"])


# the phases after the verification, each short: the bar counts them (api.rewrite's `phase`)
LATE_PHASES = ("build", "check", "write")


class FileProgress:
    """The progress of one file's rewrite: `sites(done, total)` while the sites are decided,
    `phase(name)` as each later phase starts (usdtpatch.api.rewrite's `progress` and `phase`
    callbacks)."""

    def __init__(self, sites: Callable[[int, int], None], phase: Callable[[str], None]) -> None:
        self.sites = sites
        self.phase = phase


@contextmanager
def site_progress(console: Console, after: float = 1.0) -> Iterator[Callable[[str], FileProgress]]:
    """A progress bar per file on a terminal, shown once the work has taken `after` seconds:
    the sites decided (a count), the detours verified (a count, as the workers answer), then
    build, check and write as steps of a bar that fills, so no phase shows an empty bar.

    Yields `progress_for(label)`, the FileProgress of one file; off a terminal its callbacks
    do nothing.
    """
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not console.is_terminal or console.is_dumb_terminal:  # TERM=dumb: no cursor moves
        yield lambda _label: FileProgress(lambda _done, _total: None, lambda _name: None)
        return
    bar = Progress("[progress.description]{task.description}", BarColumn(),
                   TextColumn("{task.fields[count]}"), TimeElapsedColumn(), console=console,
                   transient=True)
    started = time.monotonic()
    live = False

    def show() -> None:
        nonlocal live
        if not live and time.monotonic() - started >= after:
            bar.start()
            live = True

    def progress_for(label: str) -> FileProgress:
        task = bar.add_task(f"{label}: plan", total=None, count="")
        unit = ["sites"]  # what `sites` counts: the sites planned, then the detours verified

        def sites(done: int, total: int) -> None:
            show()
            bar.update(task, completed=done, total=total, count=f"{done}/{total} {unit[0]}")

        def phase(name: str) -> None:
            show()
            if name in LATE_PHASES:  # short steps: the bar counts them
                step = LATE_PHASES.index(name)
                bar.update(task, description=f"{label}: {name}", total=len(LATE_PHASES),
                           completed=step, count=f"step {step + 1}/{len(LATE_PHASES)}")
                return
            # verify: pulsing until the workers' first answers come back, then counting them
            unit[0] = "detours verified" if name == "verify" else "sites"
            bar.reset(task, total=None, description=f"{label}: {name}", count="")

        return FileProgress(sites, phase)

    try:
        yield progress_for
    finally:
        if live:
            bar.stop()


def render_table(out: IO[str], title: str, columns: list[tuple[str, Literal["left", "right"]]],
                 rows: list[list[str]], width: int = 140) -> None:
    """A titled table of ready-made cells, columns as (name, justify): bench's tables. To a
    pipe or file as plain text, as `list` and `check` print theirs (report/plain.py): the
    title, then the rows, each on one line, no box."""
    if plain_output(out) and all(c.isascii() for row in rows for c in row):
        sizes = [max(len(name), *(len(r[i]) for r in rows)) for i, (name, _) in
                 enumerate(columns)]
        padded = [[c.rjust(n) if how == "right" else c
                   for c, n, (_, how) in zip(row, sizes, columns, strict=True)] for row in rows]
        heads = [name.rjust(n) if how == "right" else name
                 for n, (name, how) in zip(sizes, columns, strict=True)]
        lines = plain_table(heads, padded, [False] * len(columns))
        out.write("".join(f"{line.rstrip()}\n" for line in [title, *lines]))
        return
    t = Table(title=title, title_justify="left")
    for name, justify in columns:
        t.add_column(name, justify=justify)
    for cells in rows:
        t.add_row(*cells)
    make_console(out, width=width, color=False).print(t)
