"""`rewrite --report FILE`: what a rewrite changed, skipped and why, as a file.

The kind is chosen by FILE's extension: `.html` (the page of usdtpatch/report/html.py),
`.json` (the rewrite document, docs/json-schema.md, with each file's `size_before`,
`size_after` and `seconds`) or `.sarif` (SARIF 2.1.0: the files' findings and one result per
site left unchanged, with its registered code). Written atomically with the mode the umask
gives (a report is meant to be shared).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from usdtpatch.errors import OutputError
from usdtpatch.io import umask_mode, write_atomic

REPORT_KINDS = (".html", ".json", ".sarif")


def report_kind(path: str) -> str:
    """The report kind of `path` by its extension (.htm counts as .html); raises OutputError
    naming the accepted ones."""
    ext = Path(path).suffix.lower()
    if ext == ".htm":
        ext = ".html"
    if ext not in REPORT_KINDS:
        raise OutputError(f"{path}: --report needs a file name ending in "
                         f"{', '.join(REPORT_KINDS)} (the extension chooses the kind)")
    return ext


def report_document(doc: dict[str, Any], extras: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rewrite document with each file's report fields (`size_before`, `size_after`,
    `seconds`) merged in, file by file; `doc` itself is not changed."""
    files = [{**entry, **extra} for entry, extra in zip(doc["files"], extras, strict=True)]
    return {**doc, "files": files}


def _skip_finding(site: dict[str, Any]) -> dict[str, str]:
    from usdtpatch.findings import is_registered, lookup

    code = site["code"] or "skipped"
    reg = lookup(code) if is_registered(code) else None
    return {"code": code, "severity": reg.severity.value if reg is not None else "info",
            "where": f"{site['provider']}:{site['name']}",
            "message": f"{site['provider']}:{site['name']} at {site['address']:#x} left "
                       f"unchanged: {site['reason']}",
            "hint": reg.hint if reg is not None else ""}


def rewrite_sarif(doc: dict[str, Any]) -> dict[str, Any]:
    """SARIF 2.1.0 of a rewrite document: file findings and each skipped site's reason."""
    from usdtpatch.report.sarif import sarif_document

    files = []
    for f in doc["files"]:
        sites = [{"provider": s["provider"], "name": s["name"], "address": s["address"],
                  "file_offset": None, "function": None,
                  "findings": [_skip_finding(s)]}
                 for s in f["sites"] if s["action"] == "skipped"]
        files.append({"path": f["path"], "findings": f["findings"], "sites": sites})
    return sarif_document({"files": files})


def write_report(path: str, doc: dict[str, Any],
                 views: Sequence[Sequence[dict[str, Any]]] | None = None) -> None:
    """Write the report of the rewrite document `doc` (report_document) to `path`."""
    kind = report_kind(path)
    if kind == ".html":
        from usdtpatch.report.html import rewrite_html_page

        text = rewrite_html_page(doc, views)
    elif kind == ".sarif":
        text = json.dumps(rewrite_sarif(doc), indent=2) + "\n"
    else:
        text = json.dumps(doc, indent=2) + "\n"
    write_atomic(path, text.encode(), mode=umask_mode())
