"""The `list` and `check` tables as plain text, without rich, for output that is not a terminal.

rich lays a table out by measuring every cell and rendering it through several layers of
objects; on the 531 rows of libjvm.so that took longer than the analysis. Written to a pipe or
a file, the tables carry no colour, so this module lays them out itself, in rich's table style
(no box, one space of padding between columns, none at the edges) but with rules made for
text that is read by grep and awk as much as by people:

- the page is `COLUMNS` wide when that is set, else unlimited (a pipe has no width); on a
  terminal it is the terminal's width (report/text.py: a terminal gets these same rules, so
  no value is cut and no column dropped there either): a row stays on one line whenever the
  page allows it;
- when a table is wider than the page, only the columns of space-separated words (check's
  findings, list's arguments) shrink, never below their longest word or heading, and their
  cells wrap between words: a name (probe, function, finding code, argument) is never cut or
  broken across lines, and a table that cannot fit runs past the page instead;
- when that last column of words, wider than BELOW_UNDER, would be left fewer, it goes below
  its row instead: the row's other cells on one line, its words on the indented lines under
  it, wrapped between words at the page's width (a row starts at the line's first column, its
  continuation lines with spaces, in both layouts);
- the lines around the tables (file headings, findings, summaries, errors) are one line each.

What these rules do not cover (non-ASCII or control characters, whose width on a page is not
their length) is left to rich: `list_text` and `check_text` return None then. On a page wide
enough for every row the text is rich's, character for character (tests/test_report_plain.py).

This module imports nothing from rich and nothing of report/: report/render.py takes its
cells from here, and report/text.py chooses between the two.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from usdtpatch.findings import FORK_GUARDED, FORM_CHOSEN
from usdtpatch.kernelfacts import OPTIMIZING

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (`list` does not)
if TYPE_CHECKING:
    from typing import IO, Any, overload


def page_width() -> int | None:
    """The width of the page a pipe or file is laid out for: $COLUMNS when it is a positive
    number, else None (unlimited)."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return columns if columns > 0 else None


# the `width` of list_text, check_text and rewrite_lines when none is given: page_width()
FROM_ENV = -1


def _width(width: int | None) -> int | None:
    return page_width() if width == FROM_ENV else width


def _hex(v: int | None) -> str:
    return "-" if v is None else f"{v:#x}"


# ---------------------------------------------------------------------------------------------
# The cells (shared with report/render.py)

LIST_HEADERS = ("probe", "address", "offset", "semaphore", "site", "function", "arguments")
# one verdict column per optimizing kernel generation, named as --kernel names it
KERNELS = tuple(g.name for g in OPTIMIZING)
CHECK_HEADERS = ("probe", "address", "site", *KERNELS, "outcome", "function", "findings")


def list_heading(f: dict[str, Any]) -> str:
    """The line above a file's `list` table: its probe count (with a filter: the probes shown
    of the total) and its ELF kind."""
    shown, total = len(f["probes"]), f["probe_count"]
    count = f"{total} probe(s)" if shown == total else f"{shown} of {total} probe(s) shown"
    elf = f["elf"]
    return f"{f['path']}: {count}, ELF{elf['class']} {elf['byteorder']}-endian {elf['machine']}"


def list_cells(p: dict[str, Any]) -> tuple[str, ...]:
    """The cells of one probe of a `list` document."""
    sem = p["semaphore"]
    sem_text = "-" if sem is None else f"{_hex(sem['address'])} ({sem['section'] or 'no section'})"
    site = p["site"]["form"]
    if site == "other":
        site = f"other: {p['site']['disassembly']}"
    return (f"{p['provider']}:{p['name']}", _hex(p["address"]), _hex(p["file_offset"]),
            sem_text, site, p["function"] or "-", " ".join(a["raw"] for a in p["arguments"]))


def outcome_text(site: dict[str, Any]) -> str:
    w = site["window"]
    if site["outcome"] == "blocked":
        return f"blocked: {site['blocked']['code']}"
    if w is None:
        return str(site["outcome"])
    if w["shape"] == "in-place":
        return "in place (0 jumps)"
    if w["shape"] == "re-laid":
        return f"re-laid {w['end'] - w['start']}B (0 jumps)"
    return f"{w['shape']} {w['relocated_bytes']}B (+{w['extra_jumps']} jumps)"


def check_cells(s: dict[str, Any]) -> tuple[str, ...]:
    """The cells of one site of a `check` document."""
    k = s["kernels"]
    return (f"{s['provider']}:{s['name']}", _hex(s["address"]), s["site"]["form"],
            *(k[g]["outcome"] for g in KERNELS), outcome_text(s),
            s["function"] or "-", " ".join(sorted({x["code"] for x in s["findings"]})) or "-")


REWRITE_HEADERS = ("probe", "address", "action", "new pc", "guard", "cost", "verified",
                   "detail")


def rewrite_cells(s: dict[str, Any]) -> tuple[str, ...]:
    """One site of a rewrite document's table."""
    cost = f"+{s['extra_jumps_per_pass']} jmp" if s["extra_jumps_per_pass"] else "0"
    detail = s["reason"] if s["code"] is None else f"[{s['code']}] {s['reason']}"
    return (f"{s['provider']}:{s['name']}", _hex(s["address"]), s["action"],
            _hex(s["new_pc"]), "lea -128" if s["guarded"] else "-", cost,
            s.get("verification") or "-", detail)


def rewrite_summary_line(f: dict[str, Any]) -> tuple[str, list[str]]:
    """The summary line of one file of a rewrite document, and the messages of its
    `form_chosen` and `fork-guarded` findings (why this form, what the fork guard does)."""
    counts = ", ".join(f"{n} {k}" for k, n in sorted(f["counts"].items()))
    forked = any(x["code"] == FORK_GUARDED.code for x in f["findings"])
    line = (f"  {len(f['sites'])} site(s): {counts}; form {f['form']}, red-zone guard "
            f"{f['guard']}{', fork guard added' if forked else ''}; verification: "
            f"{verification_text(f)}")
    return line, [f"  {x['message']}" for x in f["findings"]
                  if x["code"] in (FORM_CHOSEN.code, FORK_GUARDED.code)]


def finding_line(fd: dict[str, str]) -> str:
    line = f"{fd['severity']} [{fd['code']}]"
    if fd["where"]:
        line += f" {fd['where']}:"
    line += f" {fd['message']}"
    if fd["hint"]:
        line += f" ({fd['hint']})"
    return line


# ---------------------------------------------------------------------------------------------
# Layout


class _Unsupported(Exception):
    """Input the plain layout does not reproduce exactly: rich renders it."""


def _plain(text: str) -> str:
    if not _printable(text):
        raise _Unsupported
    return text


def wrap_words(text: str, width: int) -> list[str]:
    """`text` broken into lines of at most `width` columns between its words (runs of spaces
    at a break dropped); a word longer than `width` stays whole on a line of its own."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


def _shrink(widths: list[int], minimum: list[int], max_width: int) -> list[int]:
    """`widths` with the widest shrinkable columns narrowed, one column at a time, until the
    total fits `max_width` or every column is at its minimum."""
    widths = widths[:]
    excess = sum(widths) - max_width
    while excess > 0:
        room = [w - m for w, m in zip(widths, minimum, strict=True)]
        candidates = [i for i, r in enumerate(room) if r > 0]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: (widths[i], -i))
        others = [widths[i] for i in candidates if i != widest and widths[i] < widths[widest]]
        step = min(excess, room[widest], widths[widest] - max(others, default=0) or 1)
        widths[widest] -= step
        excess -= step
    return widths


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], fold: Sequence[bool],
          max_width: int | None = None) -> list[str]:
    """The lines of a borderless table on a page of `max_width` columns (None: unlimited):
    `fold[i]` marks a column of words that may shrink and wrap between them (the module's
    doc gives the rules)."""
    return list(table_lines(headers, rows, fold, max_width))


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[str]], fold: Sequence[bool],
                max_width: int | None = None) -> Iterator[str]:
    """`table`'s lines one at a time, as they are made (a writer puts each out before the
    next is made: no list of lines, no joined string). The cells are checked and the widths
    chosen here, before the first line: text rich must lay out raises _Unsupported now."""
    ncols = len(headers)
    longest = [max(len(h), 1) for h in headers]
    if not _printable("".join(headers)):
        raise _Unsupported
    for columns in _column_slices(rows, ncols):
        for i, col in enumerate(columns):
            if not _printable("".join(col)):
                raise _Unsupported
            longest[i] = max(longest[i], *map(len, col))
    pads = [(0 if i == 0 else 1) + (0 if i == ncols - 1 else 1) for i in range(ncols)]
    widths = [n + pad for n, pad in zip(longest, pads, strict=True)]
    if (max_width is not None and sum(widths) > max_width and fold[-1]
            and not any(fold[:-1])
            and widths[-1] > BELOW_UNDER and max_width - sum(widths[:-1]) < BELOW_UNDER):
        return _below(headers, rows, widths, max_width)
    if max_width is not None and sum(widths) > max_width:
        # a column of words: no narrower than its heading or its longest word
        words = [1] * ncols
        for columns in _column_slices(rows, ncols):
            for i, col in enumerate(columns):
                if fold[i]:
                    words[i] = max(words[i], max((len(x) for c in col for x in c.split()),
                                                 default=1))
        minimum = [max(len(h), n) + pad if f else w
                   for w, f, h, n, pad in zip(widths, fold, headers, words, pads, strict=True)]
        widths = _shrink(widths, minimum, max_width)
    inner = [w - pad for w, pad in zip(widths, pads, strict=True)]
    # one format per line: the cell after its left padding, filled to the column's width
    line_format = "".join(("{:<%d}" if i == 0 else " {:<%d}") % max(1, w - (1 if i else 0))
                          for i, w in enumerate(widths))
    folding = [i for i in range(ncols) if fold[i]]

    def lines() -> Iterator[str]:
        for row in (headers, *rows):
            if all(len(row[i]) <= inner[i] for i in folding):
                yield line_format.format(*row)
                continue
            cells = [wrap_words(c, room) if f and len(c) > room else [c]
                     for c, room, f in zip(row, inner, fold, strict=True)]
            for n in range(max(len(c) for c in cells)):
                yield line_format.format(*(c[n] if n < len(c) else "" for c in cells))

    return lines()


class JoinedRows(Sequence[Sequence[str]]):
    """A table's rows kept as one string each, the cells joined by SEP (a row with SEP in a
    cell, which the plain layout does not print anyway, kept as its cells): a row of eight
    short cells is ~130 bytes so, ~550 as a tuple of strings (cmd_check's table, made as
    each site is decided, holds one per site)."""

    SEP = "\x1f"

    def __init__(self, rows: list[str | tuple[str, ...]]) -> None:
        self.rows = rows

    @classmethod
    def join(cls, cells: Sequence[str]) -> str | tuple[str, ...]:
        return tuple(cells) if any(cls.SEP in c for c in cells) else cls.SEP.join(cells)

    def _cells(self, row: str | tuple[str, ...]) -> Sequence[str]:
        return row.split(self.SEP) if isinstance(row, str) else row

    def __len__(self) -> int:
        return len(self.rows)

    if TYPE_CHECKING:
        @overload
        def __getitem__(self, k: int) -> Sequence[str]: ...

        @overload
        def __getitem__(self, k: slice) -> list[Sequence[str]]: ...

    def __getitem__(self, k: int | slice) -> Sequence[str] | list[Sequence[str]]:
        if isinstance(k, slice):
            return [self._cells(r) for r in self.rows[k]]
        return self._cells(self.rows[k])

    def __iter__(self) -> Iterator[Sequence[str]]:
        return map(self._cells, self.rows)


_SLICE = 4096  # rows a table's columns are read in at a time


def _column_slices(rows: Sequence[Sequence[str]], ncols: int
                   ) -> Iterator[tuple[tuple[str, ...], ...]]:
    """The columns of `rows`, a slice of rows at a time (the whole table's columns would be
    every cell at once: a table whose rows are made when read, cmd_check's, would hold them
    all); each row must have `ncols` cells (ValueError)."""
    for k in range(0, len(rows), _SLICE):
        columns = tuple(zip(*rows[k:k + _SLICE], strict=True))
        if len(columns) != ncols:
            raise ValueError(f"a row of {len(columns)} cells in a table of {ncols} columns")
        yield columns


# a last column of words that would be narrower than this on the page goes below its row
BELOW_UNDER = 30
BELOW_INDENT = "    "


def _below(headers: Sequence[str], rows: Sequence[Sequence[str]], widths: list[int],
           max_width: int) -> Iterator[str]:
    """A table whose last column of words would be squeezed to a few words a line (rewrite's
    detail on libjvm.so at 120 columns: five lines a row): each row's other cells on one
    line, at their widths, and its last cell on the lines below, indented, wrapped between
    words at the page's width (a "-" or empty cell, nothing to say, adds no line)."""
    line_format = "".join(("{:<%d}" if i == 0 else " {:<%d}") % max(1, w - (1 if i else 0))
                          for i, w in enumerate(widths[:-1]))

    def lines() -> Iterator[str]:
        yield line_format.format(*headers[:-1]) + " " + headers[-1]
        for row in rows:
            yield line_format.format(*row[:-1]).rstrip()
            if row[-1] not in ("", "-"):
                for part in wrap_words(row[-1], max_width - len(BELOW_INDENT)):
                    yield BELOW_INDENT + part

    return lines()


def _printable(text: str) -> bool:
    return text.isascii() and (text.isprintable() or not text)


def _page_lines(text: str) -> list[str]:
    """A line of text around the tables: one line, however long."""
    return [_plain(text)]


# ---------------------------------------------------------------------------------------------
# The two reports


def list_text(doc: dict[str, Any], width: int | None = FROM_ENV) -> str | None:
    """`list`'s table report as text on a page of `width` columns (None: unlimited; by
    default page_width()), or None when rich must lay it out."""
    try:
        out: list[str] = []
        for f in doc["files"]:
            out += _page_lines(list_heading(f))
            if f["probes"]:
                out += table(LIST_HEADERS, [list_cells(p) for p in f["probes"]],
                             (False,) * 6 + (True,), _width(width))
            out += [_plain(finding_line(fd)) for fd in f["findings"]]
        return "".join(line + "\n" for line in out)
    except _Unsupported:
        return None


# how a rewritten site was verified (usdtpatch.rewriter.plan.VERIFICATIONS, repeated: report/
# reads documents, not the rewriter; a test checks they agree)
VERIFICATIONS = ("proved", "emulated", "not verified")


def verification_text(entry: dict[str, Any]) -> str:
    """The verification of one file of a rewrite document: how many sites were proved,
    emulated and not verified (from the entry's `verification` counts)."""
    if not entry.get("verified"):
        return "detours NOT verified (--no-verify)"
    counts = entry.get("verification") or {}
    text = ", ".join(f"{counts.get(k, 0)} {k}" for k in VERIFICATIONS)
    basis = entry.get("verification_basis")
    if basis and (counts.get("proved") or counts.get("emulated")):
        text += (f" (each detour against its window; resting on the file's model and "
                 f"{len(basis['assumptions'])} assumptions: docs/rewrite.md, What is assumed)")
    return text


def check_summary_line(f: dict[str, Any]) -> str:
    """The summary line of one file of a check document."""
    s = f["summary"]
    ar = s["after_rewrite"]
    rewrite = ar["in_place"] + ar["forward"] + ar["backward"]
    line = (f"{s['sites']} site(s): {s['optimizable']} optimizable as they are; {rewrite} after "
            f"rewrite ({ar['in_place']} in place, {ar['forward']} forward, {ar['backward']} "
            f"backward); {s['blocked']} blocked")
    if s["blocked_by_reason"]:
        line += " (" + ", ".join(f"{k}: {v}" for k, v in s["blocked_by_reason"].items()) + ")"
    if s["not_applicable"]:
        line += f"; {s['not_applicable']} not applicable"
    if s.get("windows"):
        line += f"; {s['provable']} of {s['windows']} window(s) provable"
    return line


def check_text(doc: dict[str, Any], summary_only: bool = False,
               width: int | None = FROM_ENV) -> str | None:
    """`check`'s table report as text on a page of `width` columns (as list_text), or None
    when rich must lay it out. The document's
    unusable inputs are not in it: their one line is on stderr (cmd_check.build_document)."""
    try:
        out: list[str] = []
        for f in doc["files"]:
            elf = f["elf"]
            out += _page_lines(f"{f['path']}: ELF{elf['class']} {elf['machine']}, CFI from "
                               f"{f['cfi']['source']} ({f['cfi']['fdes']} FDEs)")
            # "rows" (JoinedRows) and "finding_lines": the sites' cells and finding lines,
            # made as each site was decided (cmd_check's writer), in place of their entries
            made = f.get("rows")
            if (f["sites"] or made) and not summary_only:
                out += table(CHECK_HEADERS, [check_cells(s) for s in f["sites"]]
                             if made is None else made, (False,) * 7 + (True,), _width(width))
            if not summary_only:
                out += [_plain(finding_line(fd)) for fd in f["findings"]]
                out += [_plain(finding_line(fd)) for s in f["sites"] for fd in s["findings"]] \
                    if made is None else [_plain(line) for line in f["finding_lines"]]
            out += _page_lines(check_summary_line(f))
        return "".join(line + "\n" for line in out)
    except _Unsupported:
        return None


def rewrite_text(doc: dict[str, Any]) -> str | None:
    """`rewrite`'s table report as text, or None when rich must lay it out (100,000 sites
    took rich 24 s; this is one pass over the rows)."""
    lines = rewrite_lines(doc)
    return None if lines is None else "".join(line + "\n" for line in lines)


def rewrite_lines(doc: dict[str, Any], width: int | None = FROM_ENV) -> Iterator[str] | None:
    """`rewrite_text`'s lines as they are made (on a page of `width` columns, as list_text),
    or None when rich must lay the report out (every table's cells and every other line are
    checked before the first line)."""
    try:
        parts = [_rewrite_file(f, _width(width)) for f in doc["files"]]
    except _Unsupported:
        return None

    def lines() -> Iterator[str]:
        for head, rows, after in parts:
            yield from head
            yield from rows
            yield from after

    return lines()


def _rewrite_file(f: dict[str, Any], width: int | None
                  ) -> tuple[list[str], Iterator[str], list[str]]:
    """One file of the rewrite report: its lines before the table, the table's lines (made
    when read), the lines after it."""
    if f.get("note") and f["output"] is None:  # a file with nothing to rewrite: one line
        return _page_lines(f"{f['path']}: {f['note']}"), iter(()), []
    dest = f["output"] or "(dry run: nothing written)"
    head = _page_lines(f"{f['path']} -> {dest}")
    if f.get("note"):
        return head + _page_lines(f"  {f['note']}"), iter(()), []
    rows = table_lines(REWRITE_HEADERS, [rewrite_cells(s) for s in f["sites"]],
                       (False,) * 7 + (True,), width)
    line, chosen = rewrite_summary_line(f)
    after = _page_lines(line)
    for c in chosen:
        after += _page_lines(c)
    after += [_plain(finding_line(fd)) for fd in f["findings"] if fd["severity"] != "info"]
    return head, rows, after



def plain_output(out: IO[str]) -> bool:
    """Whether rich would treat `out` as a plain file (no terminal, no forced colour)."""
    env = os.environ
    if env.get("TTY_COMPATIBLE") == "0":
        return True
    if env.get("TTY_COMPATIBLE") == "1" or env.get("FORCE_COLOR") is not None:
        return False
    isatty = getattr(out, "isatty", None)
    try:
        return isatty is not None and not isatty()
    except (OSError, ValueError):
        return False
