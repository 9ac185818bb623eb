"""The one registry of finding codes (usdtpatch/findings.py) against the source and the docs.

Two guards keep codes in one place:
- at run time, `Finding` (and every other holder of a code: a verify failure, a rule verdict)
  looks its code up and raises `UnknownCode` when it is not registered, so a typo fails the
  first test that reaches it;
- statically (below, with `ast`), no module other than usdtpatch/findings.py writes a
  registered code as a string literal (emitters use the registry's constants), and no
  analysis module holds a code-shaped literal that is neither registered nor a known word of
  another vocabulary (site forms, window shapes, ...). The static scan also covers the paths
  no test runs.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tests.helpers import fixture_files, run_cli
from usdtpatch import findings as F
from usdtpatch.analysis.rules import Outcome, Verdict
from usdtpatch.findings import CODES, RENAMED, Finding, Kind, Severity, UnknownCode, lookup
from usdtpatch.verification.plans import Failure

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "usdtpatch"
DOC = ROOT / "docs" / "findings.md"
CODE_SHAPE = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9+]+)+$")

# Kebab-case words of other vocabularies that analysis modules use as string literals.
NOT_CODES = frozenset({
    "re-laid",  # analysis/windows.py window shape (analysis/relay.py)
    "call-indirect", "jmp-indirect",  # x86/decode.py branch kinds
    "call-target", "return-site", "landing-pad", "jump-table", "jump-from-other-part",
    "rseq-abort", "unknown-indirect",  # analysis/targets.py target kinds
    "branch-from-elsewhere", "short-branch-from-elsewhere", "xbegin-from-elsewhere",
    "address-taken", "data-word",
    "code-word", "relative-table-entry", "place-relative-word",
    # analysis/waysin.py: kinds of way in from the whole file
    "in-place",  # window shape / rewrite action
    "way-in", "fixed-place", "file-wide", "dynamic-tag", "section-type", "segment-type",
    "lsda-encoding", "line-opcode", "call-site",
    # elf/model.py: meanings, scopes and kinds of construct (unmodelled-<kind> are the codes)
    "rel8-stub",  # analysis/windows.py: how a branch into a window is retargeted
    "nop5-alt",  # site form
    "nop10-series", "optimized-at-pc+1",  # kernel generation / outcome names
    "rip-relative",  # argument kind
    "r-xp",  # a /proc/PID/maps permission string
    "x86-64", "utf-8", "latin-1",  # machine and encoding names
    "finding", "verify-failure", "rewrite-skip",  # findings.Kind values
})
# A registered code that is also a word of another vocabulary, where it is that word.
ALSO_A_WORD = {("x86/nops.py", "unsupported-arch")}  # SiteForm.UNSUPPORTED_ARCH
# The modules that make findings, verify failures and rewrite skips (rendering, the command
# line and the build integration use other kebab-case words: option and command names).
EMITTERS = ("analysis/", "sequences/", "verification/", "rewriter/", "elf/", "x86/",
            "forkguard/", "api.py")


def _docstring_ids(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _code_literals() -> list[tuple[str, int, str]]:
    """(path relative to usdtpatch/, line, value) of every code-shaped string literal."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstring_ids(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docs and CODE_SHAPE.match(node.value)):
                out.append((rel, node.lineno, node.value))
    return out


def _doc_sections() -> dict[str, str]:
    text = DOC.read_text()
    parts = re.split(r"^### `([^`]+)`\n", text, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


def test_registry_is_not_empty_and_consistent() -> None:
    assert len(CODES) > 70
    for code, entry in CODES.items():
        assert entry.code == code and CODE_SHAPE.match(code), code
        assert entry.title and entry.kinds, code
        assert entry.anchor == f"docs/findings.md#{code}"
    for old, new in RENAMED.items():
        assert old not in CODES and new in CODES


def test_every_registered_code_is_documented_with_severity_meaning_and_hint() -> None:
    sections = _doc_sections()
    missing = sorted(set(CODES) - set(sections))
    assert not missing, f"registered but not in docs/findings.md: {missing}"
    for code, entry in CODES.items():
        body = sections[code]
        sev = re.search(r"^- severity: (\w+)", body, re.M)
        assert sev is not None, f"{code}: no severity line"
        assert sev.group(1) == entry.severity.value, (code, sev.group(1), entry.severity)
        assert re.search(r"^- meaning: \S", body, re.M), f"{code}: no meaning"
        hint = re.search(r"^- hint: (\S.*(?:\n  .*)*)", body, re.M)
        assert hint is not None, f"{code}: no hint"
        # the page's hint is the registry's (issue 35): `explain` shows the page, the report
        # the registry, and SARIF's rule help the page; one text for all three
        written = " ".join(hint.group(1).split()).rstrip(".")
        assert written == (entry.hint or "none").rstrip("."), (code, written, entry.hint)


def test_every_documented_code_is_registered() -> None:
    stale = sorted(set(_doc_sections()) - set(CODES))
    assert not stale, f"documented but not registered (remove or register): {stale}"


def test_no_module_writes_a_registered_code_as_a_literal() -> None:
    bad = [(rel, line, v) for rel, line, v in _code_literals()
           if v in CODES and rel != "findings.py" and (rel, v) not in ALSO_A_WORD]
    assert not bad, ("use the registry's constants (usdtpatch.findings.X.code) instead of "
                     f"these literals: {bad}")


def test_no_emitting_module_holds_an_unregistered_code_shaped_literal() -> None:
    bad = [(rel, line, v) for rel, line, v in _code_literals()
           if rel.startswith(EMITTERS)
           and v not in CODES and v not in NOT_CODES]
    assert not bad, ("a finding code must be registered in usdtpatch/findings.py (and "
                     "documented); a word of another vocabulary goes into NOT_CODES in this "
                     f"test: {bad}")


def test_old_codes_are_gone_from_the_source() -> None:
    bad = [(rel, line, v) for rel, line, v in _code_literals() if v in RENAMED
           and rel != "findings.py"]
    assert not bad


def test_the_scan_sees_literals() -> None:
    # the scanner itself must find the constants it is meant to police
    found = {(rel, v) for rel, _line, v in _code_literals()}
    assert ("findings.py", "site-crosses-page") in found
    assert ("x86/nops.py", "unsupported-arch") in found


@pytest.mark.parametrize("make", [
    lambda: Finding("site-crossed-page", Severity.WARNING, "typo"),
    lambda: Failure("no-int3-frist", "typo"),
    lambda: Verdict(Outcome.INT3, "typo", "site-32-bit"),
    lambda: lookup("trampoline-out-of-reach"),
], ids=["finding", "verify-failure", "rule-verdict", "lookup"])
def test_unknown_codes_raise_where_they_are_made(make: object) -> None:
    with pytest.raises(UnknownCode):
        make()  # type: ignore[operator]


def test_code_helpers_use_the_registered_severity_and_hint() -> None:
    f = F.SITE_CROSSES_PAGE.finding("the nop5 at 0xffe crosses a page", "p:n")
    assert (f.code, f.severity, f.hint, f.where) == (
        "site-crosses-page", Severity.WARNING, F.SITE_CROSSES_PAGE.hint, "p:n")
    g = F.PROCESS_CAN_FORK.finding("m", severity=Severity.WARNING)
    assert (g.severity, g.hint) == (Severity.WARNING, F.PROCESS_CAN_FORK.hint)


def test_rewrite_failures_are_registered_skip_codes() -> None:
    assert F.REWRITE_FAILURES
    for code in F.REWRITE_FAILURES:
        assert Kind.REWRITE_SKIP in lookup(code).kinds
        assert lookup(code).severity is Severity.ERROR




def _codes_in(doc: object) -> set[str]:
    out: set[str] = set()
    if isinstance(doc, dict):
        if isinstance(doc.get("code"), str) and isinstance(doc.get("severity"), str):
            code, sev = doc["code"], doc["severity"]
            if code in CODES:  # one of the severities the code is registered with
                assert sev in [x.value for x in CODES[code].severities], (code, sev)
        for k, v in doc.items():
            if k == "code" and isinstance(v, str):
                out.add(v)
            else:
                out |= _codes_in(v)
    elif isinstance(doc, list):
        for v in doc:
            out |= _codes_in(v)
    return out


def test_every_code_the_commands_emit_on_the_fixtures_is_registered() -> None:
    # (and every finding there has its code's registered severity)
    emitted: set[str] = set()
    for path in fixture_files():
        for argv in (["check", "--json"], ["plan", "--json"],
                     ["rewrite", "--dry-run", "--no-verify", "--json"]):
            res = run_cli(*argv, path)
            assert res.rc != 3, (argv, path.name, res.err)
            if res.rc in (0, 1) and res.out.strip():
                emitted |= _codes_in(json.loads(res.out))
    assert len(emitted) > 15  # the fixtures reach many of the codes
    assert not emitted - set(CODES), sorted(emitted - set(CODES))
    assert not emitted & set(RENAMED)


def test_plan_files_old_codes_are_read_as_new_and_unknown_ones_refused() -> None:
    from tests.helpers import fixture
    from usdtpatch.analysis.probes import read_probes
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.errors import InputError
    from usdtpatch.report.plan import plan_json
    from usdtpatch.sequences.plan import build_plan, plan_from_json
    image = parse_elf(fixture("i386").read_bytes())
    doc = plan_json(build_plan(read_probes(image), "i386", "nop5", 0x5655_5000))
    site = doc["sites"][0]
    assert [f["code"] for f in site["findings"]] == ["site-elf32"]
    site["findings"][0]["code"] = "site-32-bit"  # what an earlier version wrote
    again = plan_from_json(json.loads(json.dumps(doc)), "old.json")
    assert [f.code for f in again.sites[0].findings] == ["site-elf32"]
    site["findings"][0]["code"] = "site-made-up"
    with pytest.raises(InputError, match=r"old\.json: \$\.sites\[0\]\.findings\[0\]\.code: "
                                         r"unknown finding code 'site-made-up'"):
        plan_from_json(doc, "old.json")


def test_explain_names_every_severity_a_code_is_reported_with() -> None:
    """`explain process-can-fork` said error while check reported a warning (issue 34,
    item 8): a finding's severity is one its code is registered with, and explain and the
    code list name them all."""
    from tests.helpers import run_cli

    text = run_cli("explain", "process-can-fork").out
    assert text.startswith("process-can-fork (error or warning): ")
    assert re.search(r"^process-can-fork +error or warning +the file", run_cli("explain").out,
                     re.M)
    check = run_cli("check", "--json", "--fail-on", "never", "/usr/bin/python3.11")
    if check.rc == 0:
        sevs = {f["severity"] for f in json.loads(check.out)["files"][0]["findings"]
                if f["code"] == "process-can-fork"}
        assert sevs <= {"error", "warning"}
    with pytest.raises(AssertionError, match="not registered with severity info"):
        F.PROCESS_CAN_FORK.finding("m", severity=Severity.INFO)
    with pytest.raises(AssertionError, match="not registered with severity warning"):
        F.FORK_GUARDED.finding("m", severity=Severity.WARNING)


def test_every_finding_the_commands_emit_has_its_codes_hint() -> None:
    """One source for what `explain` says and what the commands report (issue 34, item 8):
    on every fixture, each finding of check and of a rewrite carries its code's registered
    hint (issue 35: the registry's hint is the only one a finding can carry)."""
    for path in fixture_files():
        for argv in (["check", "--json", "--fail-on", "never"],
                     ["rewrite", "--dry-run", "--json", "--no-verify"]):
            res = run_cli(*argv, path)
            if not res.out:
                continue
            for f in json.loads(res.out)["files"]:
                for fd in f["findings"] + [x for s in f.get("sites", [])
                                           for x in s.get("findings", [])]:
                    hint = fd.get("hint", "")
                    assert hint == CODES[fd["code"]].hint, (path.name, fd)
