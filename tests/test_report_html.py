"""The HTML reports without a browser: their figures against the JSON documents (parsed with
html.parser), the per-site `show` views, escaping, no external reference, the file mode, and
`rewrite --report` (.html, .json, .sarif; refusals). The browser checks are in
tests/test_report_html_browser.py."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import fixture, fixture_files, run_cli
from usdtpatch.cli.common import EXIT_OK, EXIT_UNUSABLE
from usdtpatch.io import umask_mode
from usdtpatch.report.html import check_segments, html_page, rewrite_html_page


class _Page(HTMLParser):
    """Per file section: legend entries (key, label, count), kpis, site rows, their views."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[dict[str, Any]] = []
        self.urls: list[str] = []
        self.scripts = 0
        self._in_view_code = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for k in ("src", "href", "action", "srcset", "poster", "data"):
            if k in a and not a[k].startswith("#"):
                self.urls.append(a[k])
        if tag == "script":
            self.scripts += 1
        cls = a.get("class", "").split()
        if tag == "section" and "file" in cls:
            self.sections.append({"path": a["data-path"], "legend": [], "kpis": {},
                                  "rows": [], "code_rows": 0, "site_codes": {},
                                  "file_codes": {}})
        if not self.sections:
            return
        sec = self.sections[-1]
        if tag == "li" and "data-key" in a and "data-count" in a:
            sec["legend"].append((a["data-key"], a["data-label"], int(a["data-count"])))
        if tag == "li" and "hazard" in cls and "data-code" in a:
            sec["file_codes"][a["data-code"]] = int(a["data-count"])
        if "data-site-code" in a:
            sec["site_codes"][a["data-site-code"]] = int(a["data-count"])
        if "kpi" in cls:
            sec["kpis"][a["data-key"]] = int(a["data-count"])
        if tag == "details" and "site" in cls:
            sec["rows"].append(a)
        if tag == "table" and "code" in cls:
            sec["code_rows"] += 1


def _parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    p.close()
    return p


def _figures(sec: dict[str, Any]) -> dict[str, int]:
    got: dict[str, int] = {}
    for key, label, n in sec["legend"]:
        k = f"blocked:{label}" if key == "blocked" and label != "blocked" else key
        got[k] = got.get(k, 0) + n
    return got


def _want(f: dict[str, Any]) -> dict[str, int]:
    s = f["summary"]
    want = {"optimizable": s["optimizable"], "in-place": s["after_rewrite"]["in_place"],
            "forward": s["after_rewrite"]["forward"],
            "backward": s["after_rewrite"]["backward"], "n/a": s["not_applicable"]}
    want.update({f"blocked:{c}": n for c, n in s["blocked_by_reason"].items()})
    return {k: n for k, n in want.items() if n}


def _check_pair(tmp: Path, *files: Path) -> tuple[str, dict[str, Any]]:
    out = tmp / "r.html"
    res = run_cli("check", "--html", "--report", out, "--fail-on", "never", *files)
    assert res.rc == EXIT_OK, res.err
    doc = json.loads(run_cli("check", "--json", "--fail-on", "never", *files).out)
    return out.read_text(), doc


def assert_page_matches(page: str, doc: dict[str, Any]) -> None:
    """The page's figures and rows are the document's (raises AssertionError)."""
    p = _parse(page)
    assert p.urls == [] and p.scripts == 1
    assert [s["path"] for s in p.sections] == [f["path"] for f in doc["files"]]
    for sec, f in zip(p.sections, doc["files"], strict=True):
        got = {k: n for k, n in _figures(sec).items() if n}
        assert got == _want(f), f["path"]
        assert [r["data-outcome"] for r in sec["rows"]] == [s["outcome"] for s in f["sites"]]
        ar = f["summary"]["after_rewrite"]
        assert sec["kpis"]["after-rewrite"] == ar["in_place"] + ar["forward"] + ar["backward"]
        codes: dict[str, int] = {}
        for s in f["sites"]:
            for x in s["findings"]:
                codes[x["code"]] = codes.get(x["code"], 0) + 1
        assert sec["site_codes"] == codes, f["path"]
        codes = {}
        for x in f["findings"]:
            codes[x["code"]] = codes.get(x["code"], 0) + 1
        assert sec["file_codes"] == codes, f["path"]


def test_every_fixture_in_one_page(tmp_path: Path) -> None:
    page, doc = _check_pair(tmp_path, *fixture_files())
    assert_page_matches(page, doc)
    # The per-file summary rows of a report of several files.
    rows = re.findall(r'<tr data-file="([^"]*)"><td><a href="#(file-\d+)"', page)
    assert [r[0] for r in rows] == [f["path"] for f in doc["files"]]
    assert all(f'id="{anchor}"' in page for _, anchor in rows)


def test_a_changed_figure_is_caught(tmp_path: Path) -> None:
    """The comparison above fails on a page whose numbers are not the document's."""
    page, doc = _check_pair(tmp_path, fixture("forms-mixed"))
    assert_page_matches(page, doc)
    bad = re.sub(r'(data-key="in-place" data-label="in place" data-count=")(\d+)',
                 lambda m: m.group(1) + str(int(m.group(2)) + 1), page, count=1)
    assert bad != page
    with pytest.raises(AssertionError):
        assert_page_matches(bad, doc)
    worse = page.replace("<table", '<img src="https://example.org/x.png"><table', 1)
    with pytest.raises(AssertionError):
        assert_page_matches(worse, doc)


def test_segments_add_up_to_the_sites() -> None:
    summary = {"sites": 10, "optimizable": 1, "after_rewrite": {"in_place": 2, "forward": 3,
                                                                "backward": 1},
               "blocked": 3, "blocked_by_reason": {"window-call": 2, "window-branch-target": 1},
               "not_applicable": 0}
    segs = check_segments(summary)
    assert sum(s.n for s in segs) == 10
    assert [(s.label, s.n) for s in segs if s.key == "blocked"] == [
        ("window-call", 2), ("window-branch-target", 1)]


def test_site_view_is_the_show_view(tmp_path: Path) -> None:
    """Each site carries `usdtpatch show`'s rows: the same before/after text and notes."""
    page, _ = _check_pair(tmp_path, fixture("branch-after"))
    show = json.loads(run_cli("show", "--json", fixture("branch-after"), "--probe",
                              "branch:after").out)["sites"][0]
    assert show["rows"]
    for row in show["rows"]:
        for key in ("before", "after", "detour", "note"):
            if row[key]:
                assert f">{_html_text(row[key])}<" in page, (key, row[key])
    assert _html_text(show["window"]["start_reason"]) in page


def _html_text(s: str) -> str:
    import html

    return html.escape(s, quote=True)


def test_escapes_everything(tmp_path: Path) -> None:
    _, doc = _check_pair(tmp_path, fixture("nop5"))
    doc["files"][0]["path"] = 'a"&<b>'
    doc["files"][0]["sites"][0]["name"] = "<img src=x onerror=alert(1)>"
    doc["files"][0]["sites"][0]["provider"] = "</script><script>alert(2)"
    page = html_page(doc)
    assert "<img src=x" not in page and "<script>alert" not in page
    text = page.replace("<wbr>", "")  # a name's break points (report/html.py, _name)
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and 'a&quot;&amp;&lt;b&gt;' in page
    assert _parse(page).scripts == 1


def test_unreadable_file_is_listed(tmp_path: Path) -> None:
    bad = tmp_path / "not-elf"
    bad.write_bytes(b"hello")
    out = tmp_path / "r.html"
    res = run_cli("check", "--report", out, fixture("nop5"), bad)
    assert res.rc == EXIT_UNUSABLE
    page = out.read_text()
    assert "Files that could not be read" in page and "not-elf" in page


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def test_report_mode_follows_umask(tmp_path: Path, umask_027: None) -> None:
    assert umask_mode() == 0o640
    for flag, name in (("--html", "r.html"), ("--sarif", "r.sarif")):
        out = tmp_path / name
        assert run_cli("check", flag, "--report", out, fixture("nop5")).rc == EXIT_OK
        assert stat.S_IMODE(out.stat().st_mode) == 0o640, flag
    rep = tmp_path / "rw.html"
    assert run_cli("rewrite", "--dry-run", "--report", rep, fixture("nop5")).rc == EXIT_OK
    assert stat.S_IMODE(rep.stat().st_mode) == 0o640


def test_umask_mode_matches_a_plain_open(tmp_path: Path) -> None:
    for mask in (0o022, 0o077, 0o002):
        old = os.umask(mask)
        try:
            p = tmp_path / f"f{mask:o}"
            p.write_text("x")
            assert umask_mode() == stat.S_IMODE(p.stat().st_mode), oct(mask)
        finally:
            os.umask(old)


def test_rewrite_report_kinds(tmp_path: Path) -> None:
    files = [fixture("forms-mixed"), fixture("branch-after"), fixture("fork")]
    out = tmp_path / "out"
    out.mkdir()
    j = tmp_path / "r.json"
    res = run_cli("rewrite", "-o", out, "--json", "--report", j, *files)
    assert res.rc == EXIT_OK, res.err
    printed = json.loads(res.out)
    doc = json.loads(j.read_text())
    assert "size_before" not in printed["files"][0]  # stdout's document is unchanged
    for entry, f in zip(printed["files"], doc["files"], strict=True):
        assert {k: v for k, v in f.items()
                if k not in ("size_before", "size_after", "seconds")} == entry
        assert f["size_before"] == Path(f["path"]).stat().st_size
        assert f["size_after"] == Path(f["output"]).stat().st_size > 0
        assert f["seconds"] >= 0
    page = rewrite_html_page(doc)
    p = _parse(page)
    assert [s["path"] for s in p.sections] == [str(f) for f in files]
    for sec, f in zip(p.sections, doc["files"], strict=True):
        got: dict[str, int] = {}
        for key, _label, n in sec["legend"]:
            got[key] = got.get(key, 0) + n
        assert {k: n for k, n in got.items() if n} == f["counts"]
    # .html through the CLI carries the show views of the inputs; .sarif lists the skips.
    h = tmp_path / "r.html"
    assert run_cli("rewrite", "--dry-run", "--report", h, *files).rc == EXIT_OK
    assert _parse(h.read_text()).sections[0]["code_rows"] > 0
    s = tmp_path / "r.sarif"
    assert run_cli("rewrite", "--dry-run", "--report", s, *files).rc == EXIT_OK
    sarif = json.loads(s.read_text())
    assert sarif["version"] == "2.1.0"
    ids = [r["ruleId"] for r in sarif["runs"][0]["results"]]
    skipped = [x for f in doc["files"] for x in f["sites"] if x["action"] == "skipped"]
    assert ids.count("site-already-5-byte") == len(skipped) > 0


def test_rewrite_report_with_jobs_and_in_place(tmp_path: Path) -> None:
    """-j (files in worker processes) and --in-place: sizes measured before the rewrite, the
    page still has each input's views as it was."""
    copies = []
    for name in ("branch-after", "padded"):
        c = tmp_path / name
        c.write_bytes(fixture(name).read_bytes())
        copies.append(c)
    before = {str(c): c.stat().st_size for c in copies}
    j = tmp_path / "r.json"
    res = run_cli("rewrite", "--in-place", "-j", "2", "--report", j, *copies)
    assert res.rc == EXIT_OK, res.err
    doc = json.loads(j.read_text())
    for f in doc["files"]:
        assert f["size_before"] == before[f["path"]]
        assert f["size_after"] == Path(f["path"]).stat().st_size > f["size_before"]
    h = tmp_path / "r.html"
    restored = tmp_path / "again"
    restored.write_bytes(fixture("branch-after").read_bytes())
    assert run_cli("rewrite", "--in-place", "--report", h, restored).rc == EXIT_OK
    page = _parse(h.read_text())
    assert page.sections[0]["code_rows"] == 1  # the show view of the input before


def test_rewrite_report_refusals(tmp_path: Path) -> None:
    src = fixture("nop5")
    res = run_cli("rewrite", "--dry-run", "--report", tmp_path / "r.txt", src)
    assert res.rc == EXIT_UNUSABLE and res.err.count("\n") == 1 and "r.txt" in res.err
    assert not (tmp_path / "r.txt").exists()
    res = run_cli("rewrite", "--dry-run", "--report", src, src)  # the input itself
    assert res.rc == EXIT_UNUSABLE and res.err.count("\n") == 1
    out = tmp_path / "o.json"
    res = run_cli("rewrite", "-o", out, "--report", out, src)  # the output itself
    assert res.rc == EXIT_UNUSABLE and not out.exists()
    d = tmp_path / "dir.html"
    d.mkdir()
    res = run_cli("rewrite", "--dry-run", "--report", d, src)
    assert res.rc == EXIT_UNUSABLE and res.err.count("\n") == 1


def test_both_pages_start_a_site_row_with_the_same_cells(tmp_path: Path) -> None:
    """The probe and address cells of a site (one helper for both pages) are the same markup
    on the check page and on the rewrite page, for every site of the file."""
    files = [fixture("forms-mixed"), fixture("retarget")]
    check_page, _doc = _check_pair(tmp_path, *files)
    rewrite_page = tmp_path / "rw.html"
    assert run_cli("rewrite", "--dry-run", "--report", rewrite_page, *files).rc == EXIT_OK
    first = re.compile(r'<details class="site" id="(site-\d+-\d+)"[^>]*><summary class="grid">'
                       r'(<div class="cell " data-col="probe">.*?</div>'
                       r'<div class="cell " data-col="address" data-sort="\d+">.*?</div>)')
    in_check = first.findall(check_page)
    in_rewrite = first.findall(rewrite_page.read_text())
    assert len(in_check) == len(in_rewrite) == len(re.findall(r'<details class="site"',
                                                              check_page)) > 3
    assert sorted(in_check) == sorted(in_rewrite)


def test_check_page_says_what_rewrite_will_do(tmp_path: Path) -> None:
    """check's page said forward/backward where rewrite's says detour for the same sites, and
    a re-laid window read "re laid" (issue 34, item 8)."""
    page = run_cli("check", "--html", "--fail-on", "never", fixture("demo")).out
    assert "detour, forward " in page
    from usdtpatch.report.html import html_page

    doc = json.loads(run_cli("check", "--json", "--fail-on", "never", fixture("demo")).out)
    site = doc["files"][0]["sites"][0]
    site["window"] = {**site["window"], "shape": "re-laid", "start": 0x10, "end": 0x1b}
    row = html_page(doc, None)
    assert "re-laid, 11 B" in row and "re laid" not in row


def test_names_break_between_their_parts_only() -> None:
    from usdtpatch.report.html import html_page

    """The page broke names mid-word (overflow-wrap: anywhere) at 1,400 px: a cell now
    breaks a probe or function name only where <wbr> marks a part's end."""
    from usdtpatch.report.html_assets import CSS

    page = run_cli("check", "--html", "--fail-on", "never", fixture("cxx-throw")).out
    assert "anywhere" not in CSS and ".cell{min-width:0;overflow-wrap:break-word}" in CSS
    assert "cxx:<wbr>in_<wbr>try" in page
    assert "guarded(<wbr>int)" in page  # a function's parameters start a part
    doc = json.loads(run_cli("check", "--json", "--fail-on", "never", fixture("demo")).out)
    doc["files"][0]["sites"][0]["function"] = "ReleaseArray__entry::f(a,b)"
    assert "<code>Release<wbr>Array__<wbr>entry::<wbr>f(<wbr>a,<wbr>b)</code>" in \
        html_page(doc, None)
