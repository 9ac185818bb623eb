"""The `list` and `check` tables as plain text, without rich, for output that is not a terminal.

rich lays a table out by measuring every cell and rendering it through several layers of
objects; on the 531 rows of libjvm.so that took longer than the analysis. Written to a pipe or
a file, the tables carry no colour, so this module lays them out itself, with the rules rich
applies to the tables report/render.py builds (no box, one space of padding between columns,
none at the edges, no-wrap columns at their natural width, the two `fold` columns shrunk when
the table is wider than the page and their cells word-wrapped, words longer than a line folded).
The result is the same text, character for character (tests/test_report_plain.py compares the
two on every fixture, the real binaries and generated tables). What these rules do not cover
(non-ASCII or control characters, a column shrunk below its heading, a heading line wider than
the page) is left to rich: `list_text` and `check_text` return None then.

This module imports nothing from rich; report/render.py takes its cells from here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import IO, Any

from usdtpatch.findings import FORM_CHOSEN

PIPE_WIDTH = 160  # the page width of a console that is not a terminal (report/render.py)
_WORD = re.compile(r"\s*\S+\s*")
_TRAILING_SPACE = re.compile(r"\s+$")


def error_entry_line(e: dict[str, str]) -> str:
    """One unusable input of a document's `errors`, naming its file once."""
    path, text = e["path"], e["error"]
    return text if text.startswith(f"{path}:") else f"{path}: {text}"


def _hex(v: int | None) -> str:
    return "-" if v is None else f"{v:#x}"


# ---------------------------------------------------------------------------------------------
# The cells (shared with report/render.py)

LIST_HEADERS = ("probe", "address", "offset", "semaphore", "site", "function", "arguments")
CHECK_HEADERS = ("probe", "address", "site", "6.18", "nop10 (unreleased)", "outcome",
                 "function", "findings")


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
    return f"{w['shape']} {w['relocated_bytes']}B (+{w['extra_jumps']} jumps)"


def check_cells(s: dict[str, Any]) -> tuple[str, ...]:
    """The cells of one site of a `check` document."""
    k = s["kernels"]
    return (f"{s['provider']}:{s['name']}", _hex(s["address"]), s["site"]["form"],
            k["6.18"]["outcome"], k["nop10-series"]["outcome"], outcome_text(s),
            s["function"] or "-", " ".join(sorted({x["code"] for x in s["findings"]})) or "-")


REWRITE_HEADERS = ("probe", "address", "action", "new pc", "guard", "cost", "detail")


def rewrite_cells(s: dict[str, Any]) -> tuple[str, ...]:
    """One site of a rewrite document's table."""
    cost = f"+{s['extra_jumps_per_pass']} jmp" if s["extra_jumps_per_pass"] else "0"
    detail = s["reason"] if s["code"] is None else f"[{s['code']}] {s['reason']}"
    return (f"{s['provider']}:{s['name']}", _hex(s["address"]), s["action"],
            _hex(s["new_pc"]), "lea -128" if s["guarded"] else "-", cost, detail)


def rewrite_summary_line(f: dict[str, Any]) -> tuple[str, list[str]]:
    """The summary line of one file of a rewrite document, and the messages of its
    `form_chosen` findings (why this form)."""
    counts = ", ".join(f"{n} {k}" for k, n in sorted(f["counts"].items()))
    verified = "each detour verified in the emulator" if f["verified"] else \
        "NOT verified (--no-verify)"
    line = (f"  {len(f['sites'])} site(s): {counts}; form {f['form']}, red-zone guard "
            f"{f['guard']}; {verified}")
    return line, [f"  {x['message']}" for x in f["findings"] if x["code"] == FORM_CHOSEN.code]


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


def wrap(text: str, width: int) -> list[str]:
    """Word-wrap one line of printable ASCII to `width` columns as rich does (overflow "fold"):
    a line breaks before a word that does not fit, a word longer than a line is cut into
    pieces, whitespace at a break stays at the end of the line unless it passes the width."""
    if width < 1:
        raise _Unsupported
    breaks: list[int] = []
    offset = 0
    for m in _WORD.finditer(text):
        start, word = m.start(), m.group(0)
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:  # fold the word across lines
            pieces = [word[i : i + width] for i in range(0, len(word), width)]
            for n, piece in enumerate(pieces):
                if start:
                    breaks.append(start)
                if n == len(pieces) - 1:
                    offset = len(piece)
                else:
                    start += len(piece)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    lines: list[str] = []
    last = 0
    for b in [*breaks, len(text)]:
        lines.append(text[last:b])
        last = b
    out: list[str] = []
    for line in lines:
        cut = line
        if len(line) > width:  # rstrip_end: drop whitespace past the width
            space = _TRAILING_SPACE.search(line)
            if space is not None:
                cut = line[: len(line) - min(len(space.group(0)), len(line) - width)]
        out.append(cut[:width])
    return out


def _ratio_reduce(total: int, ratios: list[int], maximums: list[int],
                  values: list[int]) -> list[int]:
    ratios = [r if m else 0 for r, m in zip(ratios, maximums, strict=True)]
    total_ratio = sum(ratios)
    if not total_ratio:
        return values[:]
    remaining = total
    result: list[int] = []
    for ratio, maximum, value in zip(ratios, maximums, values, strict=True):
        if ratio and total_ratio > 0:
            distributed = min(maximum, round(ratio * remaining / total_ratio))
            result.append(value - distributed)
            remaining -= distributed
            total_ratio -= ratio
        else:
            result.append(value)
    return result


def _collapse(widths: list[int], wrapable: list[bool], max_width: int) -> list[int]:
    total = sum(widths)
    excess = total - max_width
    if any(wrapable):
        while total and excess > 0:
            max_column = max(w for w, a in zip(widths, wrapable, strict=True) if a)
            second = max(w if a and w != max_column else 0
                         for w, a in zip(widths, wrapable, strict=True))
            difference = max_column - second
            ratios = [1 if (w == max_column and a) else 0
                      for w, a in zip(widths, wrapable, strict=True)]
            if not any(ratios) or not difference:
                break
            widths = _ratio_reduce(excess, ratios, [min(excess, difference)] * len(widths),
                                   widths)
            total = sum(widths)
            excess = total - max_width
    return widths


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], fold: Sequence[bool],
          max_width: int = PIPE_WIDTH) -> list[str]:
    """The lines of a borderless table: `fold[i]` marks a column that may shrink and wrap."""
    ncols = len(headers)
    columns = list(zip(headers, *rows, strict=True))
    if not all(_printable("".join(col)) for col in columns):
        raise _Unsupported
    pads = [(0 if i == 0 else 1) + (0 if i == ncols - 1 else 1) for i in range(ncols)]
    natural = [max(map(len, col)) + pad for col, pad in zip(columns, pads, strict=True)]
    widths = [min(w, max_width) or 1 for w in natural]
    if sum(widths) > max_width:
        widths = _collapse(widths, list(fold), max_width)
        if sum(widths) > max_width:
            raise _Unsupported  # rich's last resort shrinks every column
        widths = [min(n, w) for n, w in zip(natural, widths, strict=True)]
    inner = [w - pad for w, pad in zip(widths, pads, strict=True)]
    for h, room in zip(headers, inner, strict=True):
        if room < max(len(h), 1):
            raise _Unsupported  # a heading would wrap
    # one format per line: the cell after its left padding, filled to the column's width
    line_format = "".join(("{:<%d}" if i == 0 else " {:<%d}") % max(1, w - (1 if i else 0))
                          for i, w in enumerate(widths))
    folding = [i for i in range(ncols) if fold[i]]
    lines: list[str] = []
    for row in (headers, *rows):
        if all(len(row[i]) <= inner[i] for i in folding):
            lines.append(line_format.format(*row))
            continue
        cells = [wrap(c, room) if f else [c]
                 for c, room, f in zip(row, inner, fold, strict=True)]
        for n in range(max(len(c) for c in cells)):
            lines.append(line_format.format(*(c[n] if n < len(c) else "" for c in cells)))
    return lines


def _printable(text: str) -> bool:
    return text.isascii() and (text.isprintable() or not text)


def _page_lines(text: str, max_width: int = PIPE_WIDTH) -> list[str]:
    """A line of text printed by rich on a page of `max_width` columns (word-wrapped)."""
    return wrap(_plain(text), max_width) if text else [""]


# ---------------------------------------------------------------------------------------------
# The two reports


def list_text(doc: dict[str, Any]) -> str | None:
    """`list`'s table report as text, or None when rich must lay it out."""
    try:
        out: list[str] = []
        for f in doc["files"]:
            elf = f["elf"]
            out += _page_lines(f"{f['path']}: {f['probe_count']} probe(s), ELF{elf['class']} "
                               f"{elf['byteorder']}-endian {elf['machine']}")
            if f["probes"]:
                out += table(LIST_HEADERS, [list_cells(p) for p in f["probes"]],
                             (False,) * 5 + (True, True))
            out += [_plain(finding_line(fd)) for fd in f["findings"]]
        return "".join(line + "\n" for line in out)
    except _Unsupported:
        return None


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
    return line


def check_text(doc: dict[str, Any], summary_only: bool = False) -> str | None:
    """`check`'s table report as text, or None when rich must lay it out."""
    try:
        out: list[str] = []
        for f in doc["files"]:
            elf = f["elf"]
            out += _page_lines(f"{f['path']}: ELF{elf['class']} {elf['machine']}, CFI from "
                               f"{f['cfi']['source']} ({f['cfi']['fdes']} FDEs)")
            if f["sites"] and not summary_only:
                out += table(CHECK_HEADERS, [check_cells(s) for s in f["sites"]],
                             (False,) * 6 + (True, True))
            if not summary_only:
                out += [_plain(finding_line(fd)) for fd in f["findings"]]
                out += [_plain(finding_line(fd)) for s in f["sites"] for fd in s["findings"]]
            out += _page_lines(check_summary_line(f))
        for e in doc["errors"]:
            out += _page_lines(error_entry_line(e))
        return "".join(line + "\n" for line in out)
    except _Unsupported:
        return None


def rewrite_text(doc: dict[str, Any]) -> str | None:
    """`rewrite`'s table report as text, or None when rich must lay it out (100,000 sites
    took rich 24 s; this is one pass over the rows)."""
    try:
        out: list[str] = []
        for f in doc["files"]:
            dest = f["output"] or "(dry run: nothing written)"
            out += _page_lines(f"{f['path']} -> {dest}")
            if f.get("note"):
                out += _page_lines(f"  {f['note']}")
                continue
            out += table(REWRITE_HEADERS, [rewrite_cells(s) for s in f["sites"]],
                         (False,) * 6 + (True,))
            line, chosen = rewrite_summary_line(f)
            out += _page_lines(line)
            for c in chosen:
                out += _page_lines(c)
            out += [_plain(finding_line(fd)) for fd in f["findings"]
                    if fd["severity"] != "info"]
        return "".join(line + "\n" for line in out)
    except _Unsupported:
        return None


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


def print_list(out: IO[str], doc: dict[str, Any]) -> None:
    """Print `list`'s table report: plain text to a file or pipe, rich to a terminal."""
    text = list_text(doc) if plain_output(out) else None
    if text is not None:
        out.write(text)
        return
    from usdtpatch.report.render import make_console, render_list

    render_list(make_console(out), doc)


def print_check(out: IO[str], doc: dict[str, Any], summary_only: bool = False) -> None:
    """Print `check`'s table report: plain text to a file or pipe, rich to a terminal."""
    text = check_text(doc, summary_only) if plain_output(out) else None
    if text is not None:
        out.write(text)
        return
    from usdtpatch.report.render import make_console, render_check

    render_check(make_console(out), doc, summary_only=summary_only)


def print_rewrite(out: IO[str], doc: dict[str, Any]) -> None:
    """Print `rewrite`'s table report: plain text to a file or pipe, rich to a terminal."""
    text = rewrite_text(doc) if plain_output(out) else None
    if text is not None:
        out.write(text)
        return
    from usdtpatch.report.render import make_console, render_rewrite

    render_rewrite(make_console(out), doc)
