"""Self-contained HTML reports: `check --html` and `rewrite --report FILE.html`.

One file each: inline CSS and a small inline script (usdtpatch/report/html_assets.py), no
external resource, nothing fetched. Read with scripts off the page is complete: a summary per
file first (a bar of outcomes whose numbers are the JSON document's own, the file-level
hazards with their hints), then every site, each a <details> whose body is the `show` view of
its window; the script only adds sorting, filters and a search.

Pages are rendered from the JSON documents (`usdtpatch/analysis`, `usdtpatch/rewrite`) plus,
for check, the `show` documents of the sites (usdtpatch.report.show.site_views), so they
cannot disagree with `--json`. Everything shown is escaped with html.escape.

Deferred imports: findings (REWRITE_FAILURES), only for the rewrite page.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from usdtpatch.findings import (
    FORK_GUARD_FAILED,
    FORK_GUARD_UNAVAILABLE,
    FORK_GUARDED,
    PROCESS_CAN_FORK,
)
from usdtpatch.kernelfacts import OPTIMIZING
from usdtpatch.report.html_assets import CSS, SCRIPT
from usdtpatch.report.plain import check_summary_line, verification_text

# One `show` document per site of each file, in the order of the check document.
Views = Sequence[Sequence[dict[str, Any]]]

OUTCOME_ORDER = ("optimizable", "in-place", "forward", "backward", "blocked", "n/a")
ACTION_ORDER = ("in-place", "detour", "moved", "skipped", "failed")
_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
_UNGUARDED = frozenset(c.code for c in (PROCESS_CAN_FORK, FORK_GUARD_UNAVAILABLE,
                                       FORK_GUARD_FAILED))
_FORK_CODES = _UNGUARDED | {FORK_GUARDED.code}


def _e(v: object) -> str:
    return html.escape(str(v), quote=True)


def _hex(v: int | None) -> str:
    return "-" if v is None else f"{v:#x}"


def _cls(outcome: str) -> str:
    return "o-na" if outcome == "n/a" else f"o-{outcome}"


def _pct(n: int, total: int) -> str:
    if not total:
        return "0%"
    p = 100.0 * n / total
    return f"{p:.0f}%" if p >= 10 or p == 0 else f"{p:.1f}%"


class Segment(NamedTuple):
    """One part of a summary bar (and its legend entry)."""

    group: str  # legend group: "as built", "after rewrite", "blocked", ...
    key: str  # outcome (or action) the segment stands for
    label: str  # what the legend says
    n: int
    css: str  # class(es) giving its colour
    filter: str  # which filter of the site list a click sets ("" none)
    value: str  # ... to which value


# ---------------------------------------------------------------- summary bars and hazards


def check_segments(summary: dict[str, Any]) -> list[Segment]:
    """The bar of one file of a check document, straight from its `summary` object."""
    ar = summary["after_rewrite"]
    segs = [Segment(group="as built", key="optimizable", label="optimizable as built",
                    n=summary["optimizable"], css="o-optimizable", filter="outcome",
                    value="optimizable"),
            Segment(group="after rewrite", key="in-place", label="in place", n=ar["in_place"],
                    css="o-in-place", filter="outcome", value="in-place"),
            Segment(group="after rewrite", key="forward", label="forward", n=ar["forward"],
                    css="o-forward", filter="outcome", value="forward"),
            Segment(group="after rewrite", key="backward", label="backward", n=ar["backward"],
                    css="o-backward", filter="outcome", value="backward")]
    reasons = sorted(summary["blocked_by_reason"].items(), key=lambda kv: (-kv[1], kv[0]))
    for i, (code, n) in enumerate(reasons):
        segs.append(Segment(group="blocked", key="blocked", label=code, n=n,
                            css=f"o-blocked r{i % 5}", filter="finding", value=code))
    rest = summary["blocked"] - sum(n for _, n in reasons)
    if rest > 0 or (summary["blocked"] and not reasons):
        segs.append(Segment(group="blocked", key="blocked", label="blocked", n=rest,
                            css="o-blocked", filter="outcome", value="blocked"))
    segs.append(Segment(group="not applicable", key="n/a", label="n/a",
                        n=summary["not_applicable"], css="o-na", filter="outcome", value="n/a"))
    return segs


_ELF_TYPES = {1: "relocatable object", 2: "executable", 3: "shared object or PIE",
              4: "core file"}


def _headline(summary: dict[str, Any]) -> str:
    """Three figures a reader takes in at a glance (the same numbers as the bar)."""
    n = summary["sites"]
    ar = summary["after_rewrite"]
    after = ar["in_place"] + ar["forward"] + ar["backward"]
    figs = [("fast as built", summary["optimizable"], "optimizable"),
            ("fast after a rewrite", after, "after-rewrite"),
            ("blocked", summary["blocked"], "blocked")]
    if summary["not_applicable"]:
        figs.append(("not applicable", summary["not_applicable"], "n/a"))
    return '<div class="kpis">' + "".join(
        f'<div class="kpi k-{_e(key).replace("/", "")}" data-key="{_e(key)}" data-count="{c}">'
        f'<b>{c}</b> <span>{_e(label)}</span> <span class="muted">{_pct(c, n)}</span></div>'
        for label, c, key in figs) + "</div>"


def _bar(segs: Sequence[Segment], total: int, big: bool = True) -> str:
    parts = [f'<div class="bar{" big" if big else " mini"}" role="img" aria-label="'
             + _e(", ".join(f"{s.label}: {s.n}" for s in segs if s.n)) + '">']
    for s in segs:
        if not s.n:
            continue
        label = f"{s.n}" if big and s.n * 14 >= total else ""
        filt = (f' data-filter="{_e(s.filter)}" data-filter-value="{_e(s.value)}"'
                f' data-count="{s.n}"' if s.filter else "")
        parts.append(f'<span class="{_e(s.css)}" style="flex:{s.n}" title="{_e(s.group)}: '
                     f'{_e(s.label)} {s.n} of {total} ({_pct(s.n, total)})"'
                     f'{filt}>{label}</span>')
    if not total:
        parts.append('<span class="empty">no probe sites</span>')
    parts.append("</div>")
    return "".join(parts)


def _legend(segs: Sequence[Segment], total: int, show_zero: frozenset[str]) -> str:
    """The legend: every segment's count (zero counts shown for the `show_zero` keys)."""
    out = ['<ul class="legend">']
    group = None
    for s in segs:
        if not s.n and s.key not in show_zero:
            continue
        if s.group != group:
            group = s.group
            out.append(f'<li class="group">{_e(group)}</li>')
        out.append(f'<li data-key="{_e(s.key)}" data-label="{_e(s.label)}" '
                   f'data-count="{s.n}"><span class="sw {_e(s.css)}"></span>'
                   f'{_e(s.label)} <b>{s.n}</b> <span class="muted">'
                   f'{_pct(s.n, total)}</span></li>')
    out.append("</ul>")
    return "".join(out)


def _fork_tags(file: dict[str, Any], codes: set[str]) -> str:
    imports = file.get("fork_imports") or []
    tags = [f'<span class="tag mono">{_e(name)}</span>' for name in imports]
    if FORK_GUARDED.code in codes:
        tags.insert(0, '<span class="tag guard-on">fork guard: present</span>')
    elif codes & _UNGUARDED:
        tags.insert(0, '<span class="tag guard-off">fork guard: none</span>')
    return f'<div class="tags">{"".join(tags)}</div>' if tags else ""


def _hazards(file: dict[str, Any], findings: Sequence[dict[str, str]]) -> str:
    """The file-level findings as cards, worst first, one per code (with how many there are
    and each one's place and message), each with its hint."""
    if not findings:
        return '<p class="none">No file-level hazard.</p>'
    codes = {f["code"] for f in findings}
    by: dict[str, list[dict[str, str]]] = {}
    for f in findings:
        by.setdefault(f["code"], []).append(f)
    out = ['<ul class="hazards">']
    fork_done = False
    for code, xs in sorted(by.items(), key=lambda kv: _SEVERITY_RANK.get(kv[1][0]["severity"],
                                                                         3)):
        f = xs[0]
        extra = ""
        if code in _FORK_CODES and not fork_done:
            extra = _fork_tags(file, codes)
            fork_done = True
        hint = f'<div class="hint">{_e(f["hint"])}</div>' if f["hint"] else ""
        if len(xs) == 1:
            where = f" <span class=\"muted\">{_e(f['where'])}</span>" if f["where"] else ""
            body = f"{where}<div>{_e(f['message'])}</div>"
        else:
            items = "".join(
                f"<li>{'<code>' + _e(x['where']) + '</code>: ' if x['where'] else ''}"
                f"{_e(x['message'])}</li>" for x in xs)
            body = (f" <b>{len(xs)}</b> <span class=\"muted\">findings</span>"
                    f'<details class="many"><summary>each of them</summary><ul>{items}</ul>'
                    "</details>")
        out.append(f'<li class="hazard {_e(f["severity"])}" data-code="{_e(code)}" '
                   f'data-count="{len(xs)}"><span class="sev {_e(f["severity"])}">'
                   f'{_e(f["severity"])}</span><code>{_e(code)}</code>{body}{extra}{hint}</li>')
    out.append("</ul>")
    return "".join(out)


# ------------------------------------------------------------------------ site lists


class Column(NamedTuple):
    key: str
    label: str
    kind: str  # "num" (sorted by data-sort) or "text"
    width: str  # CSS grid track


def _site_list(columns: Sequence[Column], rows: Sequence[str], filters: dict[str, str],
               orders: dict[str, Sequence[str]]) -> str:
    cols = " ".join(c.width for c in columns)
    attrs = "".join(f' data-label-{_e(k)}="{_e(v)}"' for k, v in filters.items())
    attrs += "".join(f' data-order-{_e(k)}="{_e(" ".join(v))}"' for k, v in orders.items())
    head = "".join(f'<div data-col="{_e(c.key)}" data-kind="{_e(c.kind)}">{_e(c.label)}</div>'
                   for c in columns)
    return (f'<div class="sites" style="--cols:{_e(cols)}" data-filters="'
            f'{_e(" ".join(filters))}"{attrs}><div class="grid sites-head" role="row">{head}'
            f'</div><div class="sites-body">{"".join(rows)}</div></div>')


def _cell(col: str, content: str, sort: object = None, css: str = "") -> str:
    s = "" if sort is None else f' data-sort="{_e(sort)}"'
    return f'<div class="cell {css}" data-col="{col}"{s}>{content}</div>'


def _pill(outcome: str, text: str | None = None) -> str:
    cls = "n-a" if outcome == "n/a" else _cls(outcome)
    return f'<span class="pill {cls}">{_e(text or outcome)}</span>'


# where a name may break across lines: after a scope, a colon, a parenthesis, a comma, a
# plus, a slash or underscores, and where a capital follows a small letter (the cells wrap
# only there and at spaces: overflow-wrap anywhere broke libjvm.so's names mid-word at
# 1,400 px; tests/test_report_html_browser.py measures it)
_NAME_BREAKS = re.compile(r"(::|_+|[:(,+/])(?!<wbr>)|(?<=[a-z])(?=[A-Z])")


def _name(text: str) -> str:
    """A probe or function name, escaped, with <wbr> where it may break (between parts)."""
    return _NAME_BREAKS.sub(lambda m: f"{m.group(1) or ''}<wbr>", _e(text))


def _probe_cells(s: dict[str, Any]) -> list[str]:
    """The first cells of a site's row, the same on both pages: the probe (provider:name)
    and its address (sorted by the number)."""
    return [_cell("probe", f"<code>{_name(s['provider'] + ':' + s['name'])}</code>"),
            _cell("address", f"<code>{_hex(s['address'])}</code>", s["address"])]


def _facts(facts: Sequence[tuple[str, object]]) -> str:
    """A site's facts: one `label: value` line each."""
    return '<div class="facts">' + "".join(
        f'<div><span class="muted">{_e(a)}:</span> {_e(b)}</div>' for a, b in facts) + "</div>"


def _site_row(fi: int, si: int, data: dict[str, str], cells: Sequence[str], body: str) -> str:
    """Site `si` of file `fi`: a <details> whose summary is the row of `cells` and whose body
    is `body`; `data` becomes its data-* attributes (what the page's filters read)."""
    attrs = "".join(f' data-{k}="{_e(v)}"' for k, v in data.items())
    return (f'<details class="site" id="site-{fi}-{si}"{attrs}>'
            f'<summary class="grid">{"".join(cells)}</summary><div class="view">{body}</div>'
            "</details>")


def _findings_list(findings: Sequence[dict[str, str]]) -> str:
    if not findings:
        return ""
    items = "".join(
        f'<li><span class="sev {_e(f["severity"])}">{_e(f["severity"])}</span>'
        f'<code>{_e(f["code"])}</code> {_e(f["message"])}'
        + (f' <span class="muted">({_e(f["hint"])})</span>' if f["hint"] else "") + "</li>"
        for f in findings)
    return f"<h4>Findings</h4><ul>{items}</ul>"


def _show_view(view: dict[str, Any]) -> str:
    """The `show` document of one site: before/after table, targets, why the window is there."""
    parts: list[str] = []
    if view["attempts"]:
        parts.append("<h4>Window attempts</h4><ol>" + "".join(
            f"<li>{_e(t)}</li>" for t in view["attempts"]) + "</ol>")
    w = view.get("window")
    if view["rows"]:
        parts.append('<h4>Before and after</h4><table class="code"><thead><tr><th></th>'
                     "<th>address</th><th>before</th><th>after (at the site)</th>"
                     "<th>after (detour)</th><th>note</th></tr></thead><tbody>")
        for r in view["rows"]:
            css = []
            a = r["address"]
            if w is not None and a is not None and w["start"] <= a < w["end"]:
                css.append("inwin")
            if ">" in r["mark"]:
                css.append("probe")
            parts.append(
                f'<tr class="{" ".join(css)}"><td class="mark">{_e(r["mark"])}</td>'
                f"<td>{_e(_hex(a))}</td><td>{_e(r['before'])}</td><td>{_e(r['after'])}</td>"
                f"<td>{_e(r['detour'])}</td><td class=\"note\">{_e(r['note'])}</td></tr>")
        parts.append("</tbody></table>")
    if w is not None:
        inner = ", ".join(_hex(t) for t in w["internal_targets"]) or "none"
        parts.append(
            f'<p class="window">Window <code>[{_hex(w["start"])}, {_hex(w["end"])})</code> '
            f'{_e(w["shape"])}: starts at {_e(w["start_reason"])}; ends: '
            f'{_e(w["end_reason"])}; {w["relocated_bytes"]} bytes relocated, '
            f'{w["extra_jumps"]} extra jumps per pass; inner targets: {_e(inner)}.</p>')
    return "".join(parts)


def _site_facts(s: dict[str, Any]) -> str:
    k = s["kernels"]
    facts = [*((f"{g.label} kernel", f"{k[g.name]['outcome']}: {k[g.name]['reason']}")
               for g in OPTIMIZING),
             ("site bytes", s["site"]["bytes"]),
             ("file offset", _hex(s["file_offset"]))]
    if s["function_bounds"] is not None:
        b = s["function_bounds"]
        facts.append(("function part", f"[{_hex(b['start'])}, {_hex(b['end'])}) from "
                                       f"{b['source']}"))
    if s["red_zone"] is not None:
        facts.append(("red zone", ("may be used: " if s["red_zone"]["may_use"] else "")
                      + s["red_zone"]["reason"]))
    if s["blocked"] is not None:
        facts.append(("blocked", f"{s['blocked']['code']}: {s['blocked']['reason']}"))
    return _facts(facts)


CHECK_COLUMNS = (
    Column("probe", "probe", "text", "minmax(10em,1.5fr)"),
    Column("address", "address", "num", "6em"),
    Column("form", "site", "text", "5.5em"),
    *(Column(f"k-{g.name}", g.name, "text", "minmax(4em,7.5em)") for g in OPTIMIZING),
    Column("outcome", "outcome", "num", "6.5em"),
    Column("window", "window", "num", "minmax(8em,11.5em)"),
    Column("function", "function", "text", "minmax(9em,2.2fr)"),
    Column("findings", "findings", "text", "minmax(6em,.6fr)"),
)


def _check_site(fi: int, si: int, s: dict[str, Any], view: dict[str, Any] | None) -> str:
    w = s["window"]
    if s["blocked"] is not None:
        wtext, wsort = s["blocked"]["code"], -1
    elif w is not None and w["shape"] in ("in-place", "re-laid"):
        shape = "in place" if w["shape"] == "in-place" else w["shape"]  # "re-laid" stays
        wtext, wsort = f"{shape}, {w['end'] - w['start']} B", 0
    elif w is not None:
        # rewrite's word for what it will do (its page's action: detour), then the window
        wtext = (f"detour, {w['shape']} {w['relocated_bytes']} B"
                 + (f", +{w['extra_jumps']} jmp" if w["extra_jumps"] else ""))
        wsort = w["relocated_bytes"]
    else:
        wtext, wsort = "-", 0
    codes = sorted({x["code"] for x in s["findings"]} |
                   ({s["blocked"]["code"]} if s["blocked"] else set()))
    k = s["kernels"]
    cells = [
        *_probe_cells(s),
        _cell("form", _e(s["site"]["form"])),
        *(_cell(f"k-{g.name}", f'<span title="{_e(k[g.name]["reason"])}">'
                               f'{_e(k[g.name]["outcome"])}</span>') for g in OPTIMIZING),
        _cell("outcome", _pill(s["outcome"]), OUTCOME_ORDER.index(s["outcome"])
              if s["outcome"] in OUTCOME_ORDER else 9),
        _cell("window", _e(wtext), wsort),
        _cell("function", f"<code>{_name(s['function'] or '-')}</code>"),
        _cell("findings", " ".join(f'<span class="tag">{_e(c)}</span>' for c in codes)
              or '<span class="muted">-</span>'),
    ]
    body = _site_facts(s)
    if view is not None:
        body += _show_view(view)
    else:
        body += _show_view({"attempts": s["window_attempts"], "window": w, "rows": []})
    body += _findings_list(s["findings"])
    return _site_row(fi, si, {"outcome": s["outcome"], "provider": s["provider"],
                              "finding": " ".join(codes)}, cells, body)


# ------------------------------------------------------------------------------ pages


def _page(title: str, body: Sequence[str]) -> str:
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # No network: nothing of this page may be fetched (the policy also blocks any URL a
        # future change might add by mistake).
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body><main>",
        *body,
        f"</main><script>{SCRIPT}</script></body></html>",
        "",
    ])


class FileRow(NamedTuple):
    """One file's row of the overview of a report of several files."""

    anchor: str  # id of the file's section
    path: str
    sites: int
    segments: list[Segment]
    hazards: str  # markup: finding counts by severity


def _overview(rows: Sequence[FileRow], heads: Sequence[str]) -> str:
    """The per-file summary table of a report of several files."""
    out = ['<section class="overview"><h2>Files</h2><div class="scroll"><table><thead><tr>'
           "<th>file</th>"
           "<th>sites</th><th class=\"barcell\">outcomes</th>"
           + "".join(f"<th>{_e(h)}</th>" for h in heads) + "<th>hazards</th></tr></thead>"
           "<tbody>"]
    for anchor, path, total, segs, hazards in rows:
        by = _group_counts(segs)
        shown = _e(path).replace("/", "/<wbr>")  # long paths break after a slash
        out.append(f'<tr data-file="{_e(path)}"><td><a href="#{_e(anchor)}"><code>{shown}'
                   f'</code></a></td><td data-count="{total}">{total}</td>'
                   f'<td class="barcell">{_bar(segs, total, big=False)}</td>'
                   + "".join(f'<td data-key="{_e(h)}">{by.get(h, 0)}</td>' for h in heads)
                   + f"<td>{hazards}</td></tr>")
    totals = {h: 0 for h in heads}
    for row in rows:
        for h, n in _group_counts(row.segments).items():
            if h in totals:
                totals[h] += n
    out.append(f'</tbody><tfoot><tr class="total"><td>all {len(rows)} files</td>'
               f'<td>{sum(r.sites for r in rows)}</td><td class="barcell"></td>'
               + "".join(f"<td>{totals[h]}</td>" for h in heads) + "<td></td></tr></tfoot>"
               "</table></div></section>")
    return "".join(out)


def _group_counts(segs: Sequence[Segment]) -> dict[str, int]:
    by: dict[str, int] = {}
    for s in segs:
        by[s.key] = by.get(s.key, 0) + s.n
    return by


def _hazard_counts(findings: Sequence[dict[str, str]]) -> str:
    n = {sev: sum(1 for f in findings if f["severity"] == sev) for sev in _SEVERITY_RANK}
    parts = [f'<span class="sev {sev}">{c} {sev}</span>' for sev, c in n.items() if c]
    return "".join(parts) or '<span class="muted">none</span>'


def _errors(errors: Sequence[dict[str, str]]) -> str:
    if not errors:
        return ""
    items = "".join(f"<li><code>{_e(x['path'])}</code>: {_e(x['error'])}</li>" for x in errors)
    return f'<section class="errors"><h2>Files that could not be read</h2><ul>{items}</ul>' \
           "</section>"


def _view_of(site: dict[str, Any], view: dict[str, Any] | None) -> dict[str, Any] | None:
    """`view` when it is the `show` document of `site` (same probe and address)."""
    if view is None or view.get("address") != site["address"] or \
            view.get("probe") != f"{site['provider']}:{site['name']}":
        return None
    return view


def _site_findings(sites: Sequence[dict[str, Any]]) -> str:
    """The sites' findings grouped by code, worst first: how many sites, the hint."""
    by: dict[str, list[dict[str, str]]] = {}
    for s in sites:
        for x in s["findings"]:
            by.setdefault(x["code"], []).append(x)
    if not by:
        return ""
    out = ['<h3>Findings on sites</h3><ul class="hazards">']
    for code, xs in sorted(by.items(), key=lambda kv: (_SEVERITY_RANK.get(kv[1][0]["severity"],
                                                                          3), -len(kv[1]))):
        x = xs[0]
        hint = f'<div class="hint">{_e(x["hint"])}</div>' if x["hint"] else ""
        more = f" (and {len(xs) - 1} more)" if len(xs) > 1 else ""
        out.append(f'<li class="hazard {_e(x["severity"])}" data-site-code="{_e(code)}" '
                   f'data-count="{len(xs)}" data-filter="finding" data-filter-value="{_e(code)}"'
                   f' title="show these sites"><span class="sev {_e(x["severity"])}">'
                   f'{_e(x["severity"])}</span><code>{_e(code)}</code> <b>{len(xs)}</b> '
                   f'<span class="muted">finding(s)</span><div>{_e(x["where"])}'
                   f'{": " if x["where"] else ""}{_e(x["message"])}{_e(more)}</div>{hint}</li>')
    out.append("</ul>")
    return "".join(out)


def html_page(doc: dict[str, Any], views: Views | None = None) -> str:
    """The check page of a `usdtpatch/analysis` document; `views[i][j]` is the `show` document of
    site j of file i (without them a site shows its window data only)."""
    files = doc["files"]
    total_sites = sum(f["summary"]["sites"] for f in files)
    body = [f'<header class="top"><h1>usdtpatch check</h1><div class="meta">{len(files)} '
            f"file(s), {total_sites} probe site(s); usdtpatch {_e(doc['tool']['version'])}, "
            f"schema {_e(doc['schema'])} v{_e(doc['schema_version'])}, fail-on "
            f"{_e(doc['fail_on'])}</div></header>", _errors(doc["errors"])]
    overview = []
    sections = []
    for fi, f in enumerate(files):
        summ = f["summary"]
        segs = check_segments(summ)
        anchor = f"file-{fi}"
        overview.append(FileRow(anchor, f["path"], summ["sites"], segs,
                                _hazard_counts(f["findings"])))
        elf = f["elf"]
        sec = [f'<section class="file" id="{anchor}" data-path="{_e(f["path"])}">',
               f"<h2><code>{_e(f['path'])}</code></h2>",
               f'<div class="meta">ELF{_e(elf["class"])} {_e(elf["byteorder"])}-endian '
               f'{_e(elf["machine"])} {_e(_ELF_TYPES.get(elf["type"], elf["type"]))}; '
               "call frame information from "
               f'{_e(f["cfi"]["source"])} ({_e(f["cfi"]["fdes"])} FDEs); '
               f'{summ["sites"]} probe site(s)</div>',
               '<h3>Where the probes stand</h3>', _headline(summ),
               f'<div class="summary" data-sites="{summ["sites"]}">{_bar(segs, summ["sites"])}'
               f'{_legend(segs, summ["sites"], frozenset(OUTCOME_ORDER) - {"n/a"})}</div>',
               f'<p class="muted summary-line">{_e(check_summary_line(f))}</p>',
               "<h3>File-level hazards</h3>", _hazards(f, f["findings"]),
               _site_findings(f["sites"])]
        if f["sites"]:
            fv = views[fi] if views is not None and fi < len(views) else ()
            rows = [_check_site(fi, si, s, _view_of(s, fv[si] if si < len(fv) else None))
                    for si, s in enumerate(f["sites"])]
            sec.append(f'<h3>Sites <span class="muted">({len(rows)}; open one for its window '
                       "before and after)</span></h3>")
            sec.append(_site_list(CHECK_COLUMNS, rows,
                                  {"outcome": "outcome", "provider": "provider",
                                   "finding": "finding"}, {"outcome": OUTCOME_ORDER}))
        sec.append("</section>")
        sections.append("".join(sec))
    if len(files) > 1:
        body.append(_overview(overview, ("optimizable", "in-place", "forward", "backward",
                                         "blocked", "n/a")))
    body.extend(sections)
    body.append(f"<footer>Made by usdtpatch {_e(doc['tool']['version'])}. Outcomes and codes: "
                "docs/outcomes.md and docs/findings.md in the usdtpatch sources.</footer>")
    return _page("usdtpatch check: " + ", ".join(f["path"] for f in files[:3])
                 + (" ..." if len(files) > 3 else ""), body)


# ----------------------------------------------------------------------- rewrite page


def rewrite_segments(entry: dict[str, Any], failures: frozenset[str]) -> list[Segment]:
    """The bar of one file of a rewrite document: rewritten (in place, detour, moved), then
    skipped and failed sites by code. Counts add up to the entry's `counts`."""
    counts = entry.get("counts", {})
    segs = [Segment(group="rewritten", key=a, label=a, n=counts.get(a, 0), css=f"o-{a}",
                    filter="action", value=a)
            for a in ("in-place", "detour", "moved")]
    skipped: dict[str, int] = {}
    failed: dict[str, int] = {}
    for s in entry["sites"]:
        if s["action"] == "skipped":
            code = s["code"] or "skipped"
            d = failed if code in failures else skipped
            d[code] = d.get(code, 0) + 1
    for i, (code, n) in enumerate(sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0]))):
        segs.append(Segment(group="skipped", key="skipped", label=code, n=n,
                            css=f"o-skipped r{i % 4}", filter="code", value=code))
    for i, (code, n) in enumerate(sorted(failed.items(), key=lambda kv: (-kv[1], kv[0]))):
        segs.append(Segment(group="failed", key="failed", label=code, n=n, css=f"o-failed r{i % 5}",
                            filter="code", value=code))
    return segs


REWRITE_COLUMNS = (
    Column("probe", "probe", "text", "minmax(10em,1.5fr)"),
    Column("address", "address", "num", "6.5em"),
    Column("action", "action", "num", "6.5em"),
    Column("newpc", "new pc", "num", "6.5em"),
    Column("window", "window", "num", "minmax(8em,.8fr)"),
    Column("cost", "cost", "num", "5em"),
    Column("detail", "detail", "text", "minmax(14em,2.4fr)"),
)


def _rewrite_site(fi: int, si: int, s: dict[str, Any], failures: frozenset[str],
                  view: dict[str, Any] | None) -> str:
    action = s["action"]
    state = "failed" if action == "skipped" and s["code"] in failures else action
    w = s["window"]
    wtext = "-" if w is None else f"{w['shape']} {w['end'] - w['start']} B"
    cost = s["extra_jumps_per_pass"]
    detail = _e(s["reason"]) if s["code"] is None else \
        f'<span class="tag">{_e(s["code"])}</span> {_e(s["reason"])}'
    cells = [
        *_probe_cells(s),
        _cell("action", _pill(state, action if state == action else "failed"),
              ACTION_ORDER.index(state)),
        _cell("newpc", f"<code>{_hex(s['new_pc'])}</code>",
              -1 if s["new_pc"] is None else s["new_pc"]),
        _cell("window", _e(wtext), -1 if w is None else w["end"] - w["start"]),
        _cell("cost", f"+{cost} jmp" if cost else "0", cost),
        _cell("detail", detail + (' <span class="tag">lea -128 guard</span>'
                                  if s["guarded"] else "")),
    ]
    facts = [("action", action), ("reason", s["reason"])]
    if s["code"]:
        facts.append(("code", s["code"]))
    if w is not None:
        facts.append(("window", f"{w['shape']} [{_hex(w['start'])}, {_hex(w['end'])})"))
    if s["detour"] is not None:
        facts.append(("detour", f"{s['detour']['size']} bytes at "
                                f"{_hex(s['detour']['address'])}"))
    facts.append(("new pc", _hex(s["new_pc"])))
    facts.append(("red-zone guard", "lea -128(%rsp) around the site" if s["guarded"]
                  else "none"))
    facts.append(("verification", s.get("verification") or "-"))
    body = _facts(facts)
    if view is not None:
        body += _show_view(view)
    return _site_row(fi, si, {"action": state, "provider": s["provider"],
                              "code": s["code"] or ""}, cells, body)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / (1 << 20):.2f} MiB ({n} bytes)"  # one unit in every report and the README


def rewrite_html_page(doc: dict[str, Any], views: Views | None = None) -> str:
    """The page of a rewrite report (the `usdtpatch/rewrite` document with the report's
    `size_before`, `size_after` and `seconds` per file); `views` as for html_page, of the
    inputs as they were."""
    from usdtpatch.findings import REWRITE_FAILURES

    failures = frozenset(REWRITE_FAILURES)
    files = doc["files"]
    nsites = sum(len(f["sites"]) for f in files)
    secs = doc.get("seconds")
    body = [f'<header class="top"><h1>usdtpatch rewrite</h1><div class="meta">{len(files)} '
            f"file(s), {nsites} probe site(s)"
            + (f", {secs:.2f} s in all" if isinstance(secs, (int, float)) else "")
            + f"; usdtpatch {_e(doc['tool']['version'])}, schema {_e(doc['schema'])} "
            f"v{_e(doc['schema_version'])}</div></header>", _errors(doc["errors"])]
    overview = []
    sections = []
    for fi, f in enumerate(files):
        segs = rewrite_segments(f, failures)
        total = len(f["sites"])
        anchor = f"file-{fi}"
        overview.append(FileRow(anchor, f["path"], total, segs, _hazard_counts(f["findings"])))
        dest = f["output"] or ("(dry run: nothing written)" if f.get("changed") is not None
                               else "-")
        verified = verification_text(f)
        before, after = f.get("size_before"), f.get("size_after")
        grew = (f" (+{after - before} bytes)" if isinstance(before, int)
                and isinstance(after, int) else "")
        took = f.get("seconds")
        sec = [f'<section class="file" id="{anchor}" data-path="{_e(f["path"])}">',
               f"<h2><code>{_e(f['path'])}</code></h2>",
               f'<div class="meta">to <code>{_e(dest)}</code>; '
               f'{"changed" if f.get("changed") else "unchanged"}</div>',
               '<div class="facts">'
               f'<div><span class="muted">size before:</span> {_e(_size(before))}</div>'
               f'<div><span class="muted">size after:</span> {_e(_size(after))}{_e(grew)}</div>'
               f'<div><span class="muted">time:</span> '
               + (f"{took:.2f} s" if isinstance(took, (int, float)) else "-") + "</div>"
               f'<div><span class="muted">form:</span> {_e(f.get("form", "-"))}</div>'
               f'<div><span class="muted">red-zone guard:</span> {_e(f.get("guard", "-"))}'
               f'</div><div><span class="muted">verification:</span> {_e(verified)}</div>'
               "</div>"]
        if f.get("note"):
            sec.append(f'<p class="hazard info">{_e(f["note"])}</p>')
        sec.append("<h3>What was done</h3>")
        sec.append(f'<div class="summary" data-sites="{total}">{_bar(segs, total)}'
                   f'{_legend(segs, total, frozenset({"in-place", "detour", "moved"}))}</div>')
        sec.append("<h3>File-level findings</h3>")
        sec.append(_hazards(f, f["findings"]))
        if f["sites"]:
            by_site = {(v["probe"], v["address"]): v
                       for v in (views[fi] if views is not None and fi < len(views) else ())}
            rows = [_rewrite_site(fi, si, s, failures,
                                  by_site.get((f"{s['provider']}:{s['name']}", s["address"])))
                    for si, s in enumerate(f["sites"])]
            sec.append(f'<h3>Sites <span class="muted">({len(rows)})</span></h3>')
            sec.append(_site_list(REWRITE_COLUMNS, rows,
                                  {"action": "action", "provider": "provider", "code": "code"},
                                  {"action": ACTION_ORDER}))
        sec.append("</section>")
        sections.append("".join(sec))
    if len(files) > 1:
        body.append(_overview(overview, ("in-place", "detour", "moved", "skipped", "failed")))
    body.extend(sections)
    body.append(f"<footer>Made by usdtpatch {_e(doc['tool']['version'])}. Skip and failure "
                "codes: docs/findings.md in the usdtpatch sources.</footer>")
    return _page("usdtpatch rewrite: " + ", ".join(f["path"] for f in files[:3])
                 + (" ..." if len(files) > 3 else ""), body)
