"""The HTML reports opened in a real browser: Debian's headless chromium, driven through the
DevTools protocol over a pipe (--remote-debugging-pipe: JSON messages ending in NUL on file
descriptors 3 and 4; no websocket, no port, no extra Python package).

For each page (the check report of every fixture, of the three real binaries, of all fixtures
at once, and rewrite reports), with the page's script running: the summary figures in the DOM
equal the JSON document's, every filter shows exactly the sites the JSON says, sorting orders
the rows, and the browser's network log has no request but the page itself. Then with scripts
disabled: the same figures are there, every site and its view are in the DOM and open, and no
filter UI was made. A screenshot of each page is kept in build/test-artifacts/.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REAL_BINARIES, ROOT, fixture, fixture_files, run_cli

CHROMIUM = shutil.which("chromium")
ARTIFACTS = ROOT / "build" / "test-artifacts"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                                "(make test installs it)"),
]


class CdpError(RuntimeError):
    pass


class Browser:
    """One headless chromium, talked to through the DevTools protocol over two pipes."""

    def __init__(self) -> None:
        assert CHROMIUM is not None
        self.profile = tempfile.mkdtemp(prefix="usdtpatch-chromium-")
        cmd_r, cmd_w = os.pipe()  # our commands -> chromium's fd 3
        ev_r, ev_w = os.pipe()  # chromium's fd 4 -> our replies and events
        # Chromium's ends moved above 9, so that neither is 3 or 4 itself.
        cmd_r, ev_w = (self._above_9(cmd_r), self._above_9(ev_w))
        # bash (dash takes one-digit fds only) puts the two pipe ends on fds 3 and 4, closes
        # the originals and becomes chromium.
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{cmd_r} 4>&{ev_w} {cmd_r}<&- {ev_w}>&-',
             CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-sync",
             "--disable-background-networking", "--disable-component-update",
             "--window-size=1400,1000", "about:blank"],
            pass_fds=(cmd_r, ev_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(ev_w)
        self.w, self.r = cmd_w, ev_r
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=1400,
                  height=1000, deviceScaleFactor=1, mobile=False)

    @staticmethod
    def _above_9(fd: int) -> int:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(fd)
        return high

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("chromium did not answer in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise CdpError("chromium closed the pipe")
                self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def call(self, method: str, session: bool = False, timeout: float = 60,
             **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while True:
            e = self._message(deadline)
            if e.get("method") == method:
                return e
            self.events.append(e)

    def open(self, page: Path, scripts: bool = True) -> list[str]:
        """Load `page`; the URLs the page requested (the network log)."""
        self.events.clear()
        self.call("Emulation.setScriptExecutionDisabled", session=True, value=not scripts)
        self.call("Page.navigate", session=True, url=page.resolve().as_uri())
        self.wait_event("Page.loadEventFired")
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def js(self, expression: str) -> Any:
        """Evaluate in the page (DevTools evaluation works with the page's scripts off)."""
        res = self.call("Runtime.evaluate", session=True, expression=expression,
                        returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise CdpError(f"{expression[:60]}...: {res['exceptionDetails']}")
        return res["result"].get("value")

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", session=True, format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        with contextlib.suppress(CdpError, OSError):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # by its pid, the process this test started
            self.proc.wait()
        os.close(self.w)
        os.close(self.r)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser()
    try:
        yield b
    finally:
        b.close()


# What the page shows, read through the DOM: per file section, the legend's and headline's
# numbers, the site rows (with hidden state) and the site list's filter selects.
READ_PAGE = """
(() => Array.from(document.querySelectorAll("section.file")).map(sec => ({
  path: sec.dataset.path,
  sites: Number(sec.querySelector(".summary").dataset.sites),
  legend: Array.from(sec.querySelectorAll(".legend li[data-key]")).map(li =>
    [li.dataset.key, li.dataset.label, Number(li.dataset.count)]),
  kpis: Object.fromEntries(Array.from(sec.querySelectorAll(".kpi")).map(k =>
    [k.dataset.key, Number(k.dataset.count)])),
  rows: sec.querySelectorAll("details.site").length,
  hazards: Object.fromEntries(Array.from(sec.querySelectorAll(".hazard[data-code]")).map(h =>
    [h.dataset.code, Number(h.dataset.count)])),
  selects: Array.from(sec.querySelectorAll(".filters select")).map(s => s.name),
  summaryVisible: sec.querySelector(".summary").getBoundingClientRect().height > 0,
})))()
"""

# External references anywhere in the DOM (attributes holding a URL, CSS url(...)).
EXTERNAL_REFS = """
(() => {
  const bad = [];
  for (const el of document.querySelectorAll("*")) {
    for (const a of el.attributes) {
      const v = a.value.trim().toLowerCase();
      if (["src", "href", "action", "srcset", "poster", "data", "formaction"].includes(a.name)
          && !v.startsWith("#")) bad.push(el.tagName + " " + a.name + "=" + a.value);
    }
  }
  for (const s of document.querySelectorAll("style")) {
    if (/url\\(|@import/i.test(s.textContent)) bad.push("style with url()/@import");
  }
  return bad;
})()
"""


def _filter(b: Browser, section: int, name: str, value: str) -> int:
    """Set filter `name` of the section's site list to `value`; how many rows show."""
    return int(b.js(f"""(() => {{
      const list = document.querySelectorAll("section.file")[{section}].querySelector(".sites");
      const sel = list.parentNode.querySelector('.filters select[name="{name}"]');
      sel.value = {json.dumps(value)};
      sel.dispatchEvent(new Event("change"));
      return Array.from(list.querySelectorAll("details.site")).filter(d => !d.hidden).length;
    }})()"""))


def _sort(b: Browser, section: int, col: str) -> list[float]:
    """Click the heading of column `col`; the column's sort keys in row order."""
    return [float(x) for x in b.js(f"""(() => {{
      const list = document.querySelectorAll("section.file")[{section}].querySelector(".sites");
      list.querySelector('.sites-head [data-col="{col}"] button').click();
      return Array.from(list.querySelectorAll("details.site summary [data-col='{col}']"))
        .map(c => c.dataset.sort);
    }})()""")]


def expected_check_legend(f: dict[str, Any]) -> dict[str, int]:
    """The figures a check file's summary must show, from its JSON `summary` alone."""
    s = f["summary"]
    want = {"optimizable": s["optimizable"], "in-place": s["after_rewrite"]["in_place"],
            "forward": s["after_rewrite"]["forward"],
            "backward": s["after_rewrite"]["backward"], "n/a": s["not_applicable"]}
    for code, n in s["blocked_by_reason"].items():
        want[f"blocked:{code}"] = n
    return want


def legend_figures(sec: dict[str, Any]) -> dict[str, int]:
    """The figures the page's legend shows, keyed like expected_check_legend."""
    got: dict[str, int] = {}
    for key, label, n in sec["legend"]:
        k = f"blocked:{label}" if key == "blocked" and label != "blocked" else key
        got[k] = got.get(k, 0) + n
    return got


def _code_counts(findings: list[dict[str, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in findings:
        out[x["code"]] = out.get(x["code"], 0) + 1
    return out


def compare_check_summary(sec: dict[str, Any], f: dict[str, Any]) -> None:
    """Raise AssertionError unless the section's numbers are the JSON file entry's."""
    want = expected_check_legend(f)
    got = legend_figures(sec)
    for k, n in want.items():
        assert got.get(k, 0) == n, (f["path"], k, got.get(k), n)
    assert sum(got.values()) == f["summary"]["sites"] == sec["sites"], (f["path"], got)
    s = f["summary"]
    ar = s["after_rewrite"]
    assert sec["kpis"]["optimizable"] == s["optimizable"]
    assert sec["kpis"]["after-rewrite"] == ar["in_place"] + ar["forward"] + ar["backward"]
    assert sec["kpis"]["blocked"] == s["blocked"]
    assert sec["rows"] == len(f["sites"])
    assert sec["hazards"] == _code_counts(f["findings"])


def check_page(b: Browser, page: Path, doc: dict[str, Any], name: str,
               compare: Any = compare_check_summary,
               filters: tuple[str, ...] = ("outcome", "provider", "finding"),
               site_values: Any = None, all_shots: bool = True) -> None:
    """Every DOM check of one report page, scripts on then off, and its screenshots (the
    page; with `all_shots` also one site opened and the page without scripts)."""
    requests = b.open(page)
    assert requests == [page.resolve().as_uri()], requests  # the page itself, nothing else
    assert b.js("document.documentElement.classList.contains('js')")  # the script ran
    assert b.js(EXTERNAL_REFS) == []
    secs = b.js(READ_PAGE)
    assert [s["path"] for s in secs] == [f["path"] for f in doc["files"]]
    for i, (sec, f) in enumerate(zip(secs, doc["files"], strict=True)):
        compare(sec, f)
        assert sec["summaryVisible"]
        if not f["sites"]:
            continue
        assert sec["selects"] == list(filters)
        # Filters: each value shows exactly the sites the JSON gives it.
        for name_ in filters:
            values: dict[str, int] = {}
            for s in f["sites"]:
                for v in (site_values or _site_values)(s, name_):
                    values[v] = values.get(v, 0) + 1
            for v, n in values.items():
                assert _filter(b, i, name_, v) == n, (f["path"], name_, v)
            assert _filter(b, i, name_, "") == len(f["sites"])
        # Clicking a segment of the bar filters the list to it (outcome/action segments: as
        # many rows as the segment counts); the select shows it.
        clicked = b.js(f"""(() => {{
          const sec = document.querySelectorAll("section.file")[{i}];
          const rows = () => Array.from(sec.querySelectorAll("details.site"))
            .filter(d => !d.hidden).length;
          const out = [];
          for (const seg of sec.querySelectorAll(".bar.big [data-filter-value]")) {{
            if (!["outcome", "action"].includes(seg.dataset.filter)) continue;
            seg.click();
            const sel = sec.querySelector('.filters select[name="' + seg.dataset.filter + '"]');
            out.push([Number(seg.dataset.count), rows(), sel.value === seg.dataset.filterValue]);
          }}
          sec.querySelector(".sites").usdtFilter(out.length ? "{filters[0]}" : "", "");
          return out;
        }})()""")
        for want, shown, selected in clicked:
            assert shown == want and selected, (f["path"], clicked)
        # Clicking a card of findings on sites shows the sites with that finding.
        cards = b.js(f"""(() => {{
          const sec = document.querySelectorAll("section.file")[{i}];
          const out = {{}};
          for (const card of sec.querySelectorAll(".hazards [data-filter-value]")) {{
            card.click();
            out[card.dataset.filterValue] = Array.from(sec.querySelectorAll("details.site"))
              .filter(d => !d.hidden).length;
          }}
          const list = sec.querySelector(".sites");
          if (list.usdtFilter) list.usdtFilter("finding", "");
          return out; }})()""")
        if "finding" in filters:
            site_codes = {x["code"] for s in f["sites"] for x in s["findings"]}
            assert cards == {c: sum(c in _site_values(s, "finding") for s in f["sites"])
                             for c in site_codes}, f["path"]
        # Sorting by address: ascending, then descending on a second click.
        up = _sort(b, i, "address")
        assert up == sorted(up) and sorted(up) == sorted(float(s["address"])
                                                         for s in f["sites"])
        down = _sort(b, i, "address")
        assert down == sorted(up, reverse=True)
        # Sorting by a text column (the probe name), and the text search.
        names = b.js(f"""(() => {{
          const list = document.querySelectorAll("section.file")[{i}].querySelector(".sites");
          list.querySelector('.sites-head [data-col="probe"] button').click();
          return Array.from(list.querySelectorAll("details.site summary [data-col='probe']"))
            .map(c => c.textContent); }})()""")
        assert names == sorted(names, key=str.lower)
        assert sorted(names) == sorted(f"{s['provider']}:{s['name']}" for s in f["sites"])
        probe = names[-1]
        found = b.js(f"""(() => {{
          const sec = document.querySelectorAll("section.file")[{i}];
          const box = sec.querySelector('.filters input[type="search"]');
          box.value = {json.dumps(probe)};
          box.dispatchEvent(new Event("input"));
          const n = Array.from(sec.querySelectorAll("details.site")).filter(d => !d.hidden)
            .map(d => d.querySelector("[data-col='probe']").textContent);
          box.value = ""; box.dispatchEvent(new Event("input"));
          return n; }})()""")
        assert found and all(probe.lower() in n.lower() for n in found)
        assert len(found) == sum(probe.lower() in n.lower() for n in names)
    b.screenshot(ARTIFACTS / f"{name}.png")
    if all_shots and any(f["sites"] for f in doc["files"]):  # a site's window, before/after
        b.js("""(() => { const d = document.querySelector("details.site"); d.open = true;
                 d.scrollIntoView({block: "start"}); window.scrollBy(0, -60); })()""")
        b.screenshot(ARTIFACTS / f"{name}-site.png")

    # Scripts off: the same figures, every site there and openable, no filter UI.
    requests = b.open(page, scripts=False)
    assert requests == [page.resolve().as_uri()], requests
    assert not b.js("document.documentElement.classList.contains('js')")
    secs = b.js(READ_PAGE)
    for sec, f in zip(secs, doc["files"], strict=True):
        compare(sec, f)
        assert sec["summaryVisible"] and sec["selects"] == []
    opened = b.js("""(() => { const all = Array.from(document.querySelectorAll("details.site"));
        all.forEach(d => { d.open = true; });
        return all.filter(d => d.querySelector(".view").getBoundingClientRect().height > 0)
          .length; })()""")
    assert opened == sum(len(f["sites"]) for f in doc["files"])
    if all_shots:
        b.screenshot(ARTIFACTS / f"{name}-noscript.png")


def _site_values(s: dict[str, Any], name: str) -> list[str]:
    if name == "outcome":
        return [s["outcome"]]
    if name == "provider":
        return [s["provider"]]
    if name == "finding":
        codes = {x["code"] for x in s["findings"]}
        if s.get("blocked"):
            codes.add(s["blocked"]["code"])
        return sorted(codes)
    raise AssertionError(name)


def _rewrite_values(s: dict[str, Any], name: str) -> list[str]:
    from usdtpatch.findings import REWRITE_FAILURES

    if name == "action":
        return ["failed" if s["code"] in REWRITE_FAILURES else s["action"]]
    if name == "provider":
        return [s["provider"]]
    if name == "code":
        return [s["code"]] if s["code"] else []
    raise AssertionError(name)


def _check(tmp: Path, *files: Path | str) -> tuple[Path, dict[str, Any]]:
    page = tmp / "report.html"
    res = run_cli("check", "--html", "--report", page, "--fail-on", "never", *files)
    assert res.rc == 0, res.err
    js = run_cli("check", "--json", "--fail-on", "never", *files)
    return page, json.loads(js.out)


Checked = Callable[[Path], tuple[Path, dict[str, Any]]]


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    """_check of one file, made once in the module (libjvm.so's page is read by two tests;
    its check, twice over, is most of their time)."""
    made: dict[Path, tuple[Path, dict[str, Any]]] = {}

    def get(path: Path) -> tuple[Path, dict[str, Any]]:
        if path not in made:
            made[path] = _check(tmp_path_factory.mktemp("checked"), path)
        return made[path]
    return get


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: p.name)
def test_fixture_check_page(browser: Browser, tmp_path: Path, path: Path) -> None:
    page, doc = _check(tmp_path, path)
    check_page(browser, page, doc, f"check-{path.name}", all_shots=False)


def test_all_fixtures_in_one_page(browser: Browser, tmp_path: Path) -> None:
    files = fixture_files()
    page, doc = _check(tmp_path, *files)
    check_page(browser, page, doc, "check-all-fixtures")
    rows = browser.js("""Array.from(document.querySelectorAll(".overview tbody tr")).map(tr =>
        [tr.dataset.file, Number(tr.querySelector("[data-count]").dataset.count),
         Object.fromEntries(Array.from(tr.querySelectorAll("td[data-key]")).map(td =>
           [td.dataset.key, Number(td.textContent)]))])""")
    assert [r[0] for r in rows] == [f["path"] for f in doc["files"]]
    for (_, total, by), f in zip(rows, doc["files"], strict=True):
        s = f["summary"]
        assert total == s["sites"]
        assert by == {"optimizable": s["optimizable"], "in-place": s["after_rewrite"]["in_place"],
                      "forward": s["after_rewrite"]["forward"],
                      "backward": s["after_rewrite"]["backward"], "blocked": s["blocked"],
                      "n/a": s["not_applicable"]}


@pytest.mark.parametrize("name", sorted(REAL_BINARIES))
def test_real_binary_check_page(browser: Browser, checked: Checked, name: str) -> None:
    path = REAL_BINARIES[name]
    if not path.is_file():
        pytest.skip(f"{path} is not installed")
    page, doc = checked(path)
    check_page(browser, page, doc, f"check-{name}")


def compare_rewrite_summary(sec: dict[str, Any], f: dict[str, Any]) -> None:
    """Raise AssertionError unless the section's numbers are the rewrite entry's counts."""
    got: dict[str, int] = {}
    for key, _label, n in sec["legend"]:
        got[key] = got.get(key, 0) + n
    want = {k: n for k, n in f["counts"].items() if k != "skipped"}
    skipped = f["counts"].get("skipped", 0)
    assert got.get("skipped", 0) + got.get("failed", 0) == skipped, (got, f["counts"])
    for k, n in want.items():
        assert got.get(k, 0) == n, (f["path"], k, got, f["counts"])
    assert sec["rows"] == len(f["sites"]) == sec["sites"]
    assert sec["hazards"] == _code_counts(f["findings"])


def test_rewrite_report_page(browser: Browser, tmp_path: Path) -> None:
    names = ["forms-mixed", "branch-after", "fork", "padded", "branch-onnop", "call-after"]
    files = [fixture(n) for n in names]
    real = REAL_BINARIES["libstdc++"]
    if real.is_file():
        files.append(real)
    out = tmp_path / "out"
    out.mkdir()
    page = tmp_path / "rewrite.html"
    res = run_cli("rewrite", "-o", out, "--report", page, *files)
    assert res.rc == 0, res.err
    report_json = tmp_path / "rewrite.json"
    out2 = tmp_path / "out2"
    out2.mkdir()
    res2 = run_cli("rewrite", "-o", out2, "--report", report_json, *files)
    assert res2.rc == 0, res2.err
    doc = json.loads(report_json.read_text())
    for f in doc["files"]:
        assert f["size_before"] == Path(f["path"]).stat().st_size
        assert f["size_after"] == Path(f["output"]).stat().st_size
    check_page(browser, page, doc, "rewrite-report", compare=compare_rewrite_summary,
               filters=("action", "provider", "code"), site_values=_rewrite_values)


def test_the_checks_reject_a_wrong_page(browser: Browser, tmp_path: Path) -> None:
    """check_page fails on a page whose figure is not the JSON's, and on one that refers to
    the network (the reference is caught in the DOM even though the page's policy blocks the
    request)."""
    page, doc = _check(tmp_path, fixture("forms-mixed"))
    good = page.read_text()
    check_page(browser, page, doc, "reject-good", all_shots=False)
    wrong = tmp_path / "wrong.html"
    wrong.write_text(good.replace('data-label="in place" data-count="', 'data-label="in place" '
                                  'data-count="1', 1))
    assert wrong.read_text() != good
    with pytest.raises(AssertionError):
        check_page(browser, wrong, doc, "reject-wrong", all_shots=False)
    fetching = tmp_path / "fetching.html"
    fetching.write_text(good.replace("<main>", '<main><img src="http://127.0.0.1:9/x.png">', 1))
    with pytest.raises(AssertionError):
        check_page(browser, fetching, doc, "reject-fetching", all_shots=False)


def test_real_binaries_in_one_page(browser: Browser, tmp_path: Path) -> None:
    """The three real binaries in one report, checked like every page; its top, 1200 pixels
    wide, is the README's picture (docs/img/check-report.png is this screenshot reduced to
    256 colours)."""
    files = [p for p in REAL_BINARIES.values() if p.is_file()]
    if len(files) < 2:
        pytest.skip("fewer than two of the real binaries are installed")
    page, doc = _check(tmp_path, *files)
    check_page(browser, page, doc, "check-real-binaries", all_shots=False)
    browser.open(page)
    browser.call("Emulation.setDeviceMetricsOverride", session=True, width=1200, height=960,
                 deviceScaleFactor=1, mobile=False)
    try:
        browser.screenshot(ARTIFACTS / "readme-check-report.png")
    finally:
        browser.call("Emulation.setDeviceMetricsOverride", session=True, width=1400,
                     height=1000, deviceScaleFactor=1, mobile=False)


# every text node of the probe and function cells that the layout breaks across lines
BROKEN_WORDS = """
(() => {
  const out = [];
  for (const cell of document.querySelectorAll('.cell[data-col="probe"] code, '
                                               + '.cell[data-col="function"] code')) {
    if (!cell.getClientRects().length) continue;  // in a closed or filtered part
    for (const node of cell.childNodes) {
      if (node.nodeType !== Node.TEXT_NODE || !node.textContent.trim()) continue;
      const r = document.createRange();
      r.selectNodeContents(node);
      if (new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top))).size < 2)
        continue;
      // a node on several lines: each line must start after a space (a break between words)
      const text = node.textContent;
      let top = null;
      for (let i = 0; i < text.length; i++) {
        r.setStart(node, i);
        r.setEnd(node, i + 1);
        const rect = r.getClientRects()[0];
        if (!rect) continue;
        const t = Math.round(rect.top);
        if (top !== null && t > top && text[i - 1] !== " " && text[i] !== " ")
          out.push(cell.textContent);
        top = t;
      }
    }
  }
  return [document.querySelectorAll('.cell[data-col="probe"] code').length, out];
})()
"""


def test_names_break_only_between_their_parts(browser: Browser, checked: Checked) -> None:
    """At 1,400 px the page broke 4 of libjvm.so's names mid-word (overflow-wrap: anywhere):
    now a probe or function name wraps only at a space or the <wbr> after one of its parts
    (issue 34, item 8)."""
    path = REAL_BINARIES["libjvm"]
    if not path.is_file():
        pytest.skip(f"{path} is not installed")
    page, _ = checked(path)
    browser.open(page)
    cells, broken = browser.js(BROKEN_WORDS)
    assert cells > 500
    assert broken == [], broken
