"""What "proved" rests on (issue 30): every assumption of usdtpatch/prove/assumptions.py is
listed by docs/rewrite.md's "What is assumed", each test it names exists, and the rewrite
report says what was proved and names them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, ROOT
from usdtpatch import api
from usdtpatch.prove.assumptions import ASSUMPTIONS, PROVED, Assumption, assumption_names
from usdtpatch.report.plain import verification_text
from usdtpatch.report.rewrite import outcome_json


def _assumed_section() -> str:
    text = (ROOT / "docs" / "rewrite.md").read_text()
    m = re.search(r"^### What is assumed\n(.*?)(?=^#)", text, re.S | re.M)
    assert m is not None, "docs/rewrite.md has no '### What is assumed' section"
    return m.group(1)


def test_names_are_unique_and_kebab() -> None:
    names = assumption_names()
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", n) for n in names), names


@pytest.mark.parametrize("a", ASSUMPTIONS, ids=lambda a: a.name)
def test_the_page_lists_it(a: Assumption) -> None:
    section = _assumed_section()
    assert f"`{a.name}`" in section, f"docs/rewrite.md does not list {a.name}"
    for t in a.tests:
        assert t.split("::")[-1] in section, f"{a.name}: the page does not name {t}"


@pytest.mark.parametrize("a", ASSUMPTIONS, ids=lambda a: a.name)
def test_each_test_exists(a: Assumption) -> None:
    assert a.tests, f"{a.name} names no test"
    for t in a.tests:
        path, name = t.split("::")
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"{a.name}: {t} does not exist"


def test_the_page_lists_no_other() -> None:
    listed = set(re.findall(r"^- `([a-z0-9-]+)`", _assumed_section(), re.M))
    assert listed == set(assumption_names())


def test_the_rewrite_report_says_what_was_proved(tmp_path: Path) -> None:
    out = tmp_path / "demo.rw"
    o = api.rewrite(FIXTURES / "demo", out)
    entry = outcome_json(o, str(out))
    basis = entry["verification_basis"]
    assert basis["proved"] == PROVED
    assert basis["assumptions"] == assumption_names()
    assert "model" in basis["rests_on"]
    text = verification_text(entry)
    assert "proved" in text and "usdtpatch explain assumptions" in text, text
    assert "docs/" not in text  # the installed package does not ship the docs


def test_explain_assumptions_prints_each_assumption() -> None:
    """Rewrite's summary pointed at docs/rewrite.md, which the wheel does not ship: it points
    at `usdtpatch explain assumptions`, which prints every assumption the report names."""
    from tests.helpers import run_cli

    res = run_cli("explain", "assumptions")
    assert res.rc == 0, res.err
    for name in assumption_names():
        assert f"\n{name}\n" in res.out


def test_an_unverified_rewrite_claims_no_basis(tmp_path: Path) -> None:
    out = tmp_path / "demo.rw"
    entry = outcome_json(api.rewrite(FIXTURES / "demo", out, verify=False), str(out))
    assert entry["verification_basis"] is None
    assert "assumptions" not in verification_text(entry)
