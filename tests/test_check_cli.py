"""`usdtpatch check` and `usdtpatch show` as a user sees them: text (golden), JSON, SARIF, HTML,
exit codes and --fail-on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.golden import check_golden
from tests.helpers import ROOT, fixture, run_cli
from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE
from usdtpatch.report.checkjson import CHECK_SCHEMA, CHECK_SCHEMA_VERSION
from usdtpatch.report.html import html_page
from usdtpatch.report.sarif import SARIF_VERSION


def _rel(text: str) -> str:
    return text.replace(str(ROOT) + "/", "")


@pytest.mark.parametrize("name", ["forms-mixed", "branch-after", "redzone-leaf-nop5",
                                  "cxx-throw", "sema-explicit", "aarch64"])
def test_text_output_golden(name: str) -> None:
    res = run_cli("check", "--fail-on", "never", fixture(name))
    assert res.rc == EXIT_OK, res.err
    check_golden(f"check-{name}.txt", _rel(res.out))


def test_json_golden() -> None:
    res = run_cli("check", "--json", "--fail-on", "never", fixture("forms-mixed"))
    assert res.rc == EXIT_OK
    doc = json.loads(res.out)
    doc["tool"]["version"] = "X"
    check_golden("check-forms-mixed.json", _rel(json.dumps(doc, indent=2)) + "\n")


@pytest.mark.parametrize(("args", "rc"), [
    (["nop5"], EXIT_OK),
    (["redzone-leaf-nop5"], EXIT_FAIL),  # red-zone-live is an error
    (["--fail-on", "never", "redzone-leaf-nop5"], EXIT_OK),
    (["hintnop"], EXIT_OK),  # site-hint-nop is a warning
    (["--fail-on", "warning", "hintnop"], EXIT_FAIL),
    (["--fail-on", "info", "combo5"], EXIT_FAIL),  # site-combo5-pc1 is info
    (["--fail-on", "warning", "combo5"], EXIT_OK),
    (["nop5", "dsprefix"], EXIT_FAIL),  # the worst file decides
], ids=lambda a: "-".join(a) if isinstance(a, list) else str(a))
def test_exit_codes(args: list[str], rc: int) -> None:
    argv = [a if a.startswith("-") or a in ("never", "warning", "info") else str(fixture(a))
            for a in args]
    assert run_cli("check", *argv).rc == rc


def test_unusable_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "notelf"
    bad.write_bytes(b"hello")
    res = run_cli("check", bad)
    assert res.rc == EXIT_UNUSABLE
    assert res.err.count("\n") == 1 and "not an ELF file" in res.err
    res = run_cli("check", tmp_path / "missing")
    assert res.rc == EXIT_UNUSABLE and "no such file" in res.err
    res = run_cli("check", "--json", bad, fixture("nop5"))  # the good file is still reported
    assert res.rc == EXIT_UNUSABLE
    doc = json.loads(res.out)
    assert [f["path"] for f in doc["files"]] == [str(fixture("nop5"))]
    assert doc["errors"][0]["path"] == str(bad)
    assert run_cli("check", "--fail-on", "bogus", fixture("nop5")).rc == EXIT_UNUSABLE


def _doc(*names: str) -> dict[str, Any]:
    res = run_cli("check", "--json", "--fail-on", "never", *[fixture(n) for n in names])
    doc: dict[str, Any] = json.loads(res.out)
    return doc


def test_json_schema_shape() -> None:
    doc = _doc("forms-mixed", "redzone-leaf", "i386")
    assert doc["schema"] == CHECK_SCHEMA and doc["schema_version"] == CHECK_SCHEMA_VERSION
    for f in doc["files"]:
        s = f["summary"]
        ar = s["after_rewrite"]
        assert s["sites"] == len(f["sites"]) == (s["optimizable"] + ar["in_place"] +
                                                 ar["forward"] + ar["backward"] + s["blocked"] +
                                                 s["not_applicable"])
        assert sum(s["blocked_by_reason"].values()) == s["blocked"]
        for site in f["sites"]:
            assert set(site["kernels"]) == {"nop5", "nop10"}
            assert (site["window"] is None) == (site["outcome"] not in
                                                 ("in-place", "forward", "backward"))
            assert (site["blocked"] is None) == (site["outcome"] != "blocked")
            w = site["window"]
            if w:
                assert w["start"] <= site["address"] < w["end"]
                assert w["probe_offset"] == site["address"] - w["start"]
                assert "".join(i["bytes"] for i in w["instructions"]) or w["shape"] == "in-place"


def test_summary_only() -> None:
    res = run_cli("check", "--summary", fixture("forms-mixed"))
    assert res.out.count("\n") == 2  # the header line and the summary line
    assert "site(s):" in res.out


def test_sarif(tmp_path: Path) -> None:
    out = tmp_path / "check.sarif"
    res = run_cli("check", "--sarif", "--report", out, "--fail-on", "never", fixture("forms-mixed"),
                  fixture("redzone-leaf-nop5"))
    assert res.rc == EXIT_OK and res.out == ""
    log = json.loads(out.read_text())
    assert log["version"] == SARIF_VERSION and "sarif-2.1.0" in log["$schema"]
    (run,) = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids))
    codes = {x["code"] for x in json.loads(run_cli("check", "--json", "--fail-on", "never",
                                                    fixture("forms-mixed"),
                                                    fixture("redzone-leaf-nop5")).out)
             ["files"][0]["sites"][0]["findings"]} | {"red-zone-live"}
    assert codes <= set(ids)
    for r in run["results"]:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["level"] in ("error", "warning", "note")
        assert r["message"]["text"]
        loc = r["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"].endswith(("forms-mixed", "redzone-leaf-nop5"))
        if "region" in loc:
            assert loc["region"]["byteOffset"] >= 0
    assert any(r["ruleId"] == "red-zone-live" and r["level"] == "error" for r in run["results"])
    stdout = run_cli("check", "--sarif", "--fail-on", "never", fixture("nop5"))
    assert json.loads(stdout.out)["runs"][0]["results"] == []  # a clean fixture


def test_html_is_self_contained(tmp_path: Path) -> None:
    out = tmp_path / "check.html"
    res = run_cli("check", "--report", out, "--fail-on", "never", fixture("forms-mixed"))
    assert res.rc == EXIT_OK
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # One inline script (sorting/filtering only), no script or resource from elsewhere, no
    # link but to the page's own anchors (tests/test_report_html*.py check it in chromium).
    assert page.count("<script") == 1 and "<script>" in page and "src=" not in page
    assert re.findall(r'href="([^"#][^"]*)"', page) == []
    assert "forms-mixed" in page and "site-hint-nop" in page


def test_html_escapes_everything() -> None:
    doc = _doc("nop5")
    doc["files"][0]["sites"][0]["name"] = "<script>alert(1)</script>"
    doc["files"][0]["path"] = "a&b"
    page = html_page(doc)
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page and "a&amp;b" in page


def test_show_golden() -> None:
    res = run_cli("show", fixture("branch-after"), "--probe", "branch:after")
    assert res.rc == EXIT_OK, res.err
    check_golden("show-branch-after.txt", _rel(res.out))


@pytest.mark.parametrize(("name", "probe", "shape"), [
    ("branch-after", "branch:after", "backward"),
    ("padded", "forms:mid", "in-place"),
    ("pie", "basic:compute", "forward"),
])
def test_show_json_marks_probe_targets_and_bounds(name: str, probe: str, shape: str) -> None:
    res = run_cli("show", "--json", fixture(name), "--probe", probe)
    assert res.rc == EXIT_OK, res.err
    (site, *_rest) = json.loads(res.out)["sites"]
    assert site["window"]["shape"] == shape
    rows = site["rows"]
    assert [r for r in rows if r["mark"].startswith(">")]
    assert any("window start" in r["note"] for r in rows)
    assert any("window end" in r["note"] for r in rows)
    inside = [r for r in rows if r["address"] is not None
              and site["window"]["start"] <= r["address"] < site["window"]["end"]]
    if shape == "in-place":
        assert inside[0]["after"].startswith("nopl")
    else:
        assert inside[0]["after"] == "jmp <detour>"
        assert any(r["detour"].startswith("jmp ") for r in rows)


def test_show_unknown_probe() -> None:
    res = run_cli("show", fixture("pie"), "--probe", "nope:nothing")
    assert res.rc == EXIT_UNUSABLE and "no probe matches nope:nothing" in res.err
    res = run_cli("show", fixture("pie"), "--probe", "no-colon")  # a NAME in any provider
    assert res.rc == EXIT_UNUSABLE and "no probe matches no-colon" in res.err


def test_check_and_render_for_the_demo() -> None:
    import io

    from usdtpatch.cli.cmd_check import check_and_render

    out, err = io.StringIO(), io.StringIO()
    assert check_and_render(str(fixture("redzone-leaf-nop5")), out, err) == EXIT_FAIL
    assert "red-zone-live" in out.getvalue() and "1 site(s)" in out.getvalue()
    out = io.StringIO()
    assert check_and_render(str(fixture("redzone-leaf-nop5")), out, err, "never") == EXIT_OK
    assert check_and_render("/nonexistent", io.StringIO(), err) == EXIT_UNUSABLE
    assert "no such file" in err.getvalue()
