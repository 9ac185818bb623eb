"""A self-contained HTML page of a check document: inline CSS, no script, no external resource.

Everything shown is escaped with html.escape; the page reads only the check document.
"""

from __future__ import annotations

import html
from typing import Any

from usdtpatch.report.render import check_summary_line

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:2em}
table{border-collapse:collapse;font-size:.9em}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
th{background:#f0f0f0}code{font-family:ui-monospace,monospace}
.error{color:#b00020;font-weight:bold}.warning{color:#8a6d00}.info{color:#666}
.optimizable,.in-place{background:#e6f4ea}.forward,.backward{background:#fff8e1}
.blocked{background:#fdecea}.summary{font-weight:bold}
"""


def _e(v: object) -> str:
    return html.escape(str(v), quote=True)


def _hex(v: int | None) -> str:
    return "-" if v is None else f"{v:#x}"


def html_page(doc: dict[str, Any]) -> str:
    """The whole page as one string."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>usdtpatch check</title><style>{_CSS}</style></head><body>",
             f"<h1>usdtpatch check ({_e(doc['tool']['version'])}, schema "
             f"{_e(doc['schema'])} v{_e(doc['schema_version'])})</h1>"]
    for f in doc["files"]:
        parts.append(f"<h2><code>{_e(f['path'])}</code></h2>")
        parts.append(f"<p class=\"summary\">{_e(check_summary_line(f))}</p>")
        if f["sites"]:
            parts.append("<table><tr><th>probe</th><th>address</th><th>site</th><th>6.18</th>"
                         "<th>nop10 (unreleased)</th><th>outcome</th><th>window</th>"
                         "<th>function</th><th>findings</th></tr>")
            for s in f["sites"]:
                w = s["window"]
                wtext = "-" if w is None else (
                    f"[{_hex(w['start'])}, {_hex(w['end'])}) {w['relocated_bytes']} bytes, "
                    f"+{w['extra_jumps']} jumps")
                if s["blocked"]:
                    wtext = f"{s['blocked']['code']}: {s['blocked']['reason']}"
                k = s["kernels"]
                parts.append(
                    f"<tr class=\"{_e(s['outcome'])}\"><td>{_e(s['provider'])}:{_e(s['name'])}"
                    f"</td><td><code>{_hex(s['address'])}</code></td>"
                    f"<td>{_e(s['site']['form'])}</td>"
                    f"<td title=\"{_e(k['6.18']['reason'])}\">{_e(k['6.18']['outcome'])}</td>"
                    f"<td title=\"{_e(k['nop10-series']['reason'])}\">"
                    f"{_e(k['nop10-series']['outcome'])}</td><td>{_e(s['outcome'])}</td>"
                    f"<td>{_e(wtext)}</td><td><code>{_e(s['function'] or '-')}</code></td>"
                    f"<td>{_e(' '.join(sorted({x['code'] for x in s['findings']})) or '-')}"
                    "</td></tr>")
            parts.append("</table>")
        findings = list(f["findings"]) + [x for s in f["sites"] for x in s["findings"]]
        if findings:
            parts.append("<h3>Findings</h3><ul>")
            for x in findings:
                parts.append(f"<li><span class=\"{_e(x['severity'])}\">{_e(x['severity'])}"
                             f"</span> <code>{_e(x['code'])}</code> {_e(x['where'])}: "
                             f"{_e(x['message'])} <i>{_e(x['hint'])}</i></li>")
            parts.append("</ul>")
    for err in doc["errors"]:
        parts.append(f"<p class=\"error\">{_e(err['path'])}: {_e(err['error'])}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
