"""The shape of the code (issue 23): no function or method in usdtpatch/ is longer than 120
lines, and a module imports inside a function only what it says at its top it defers (an
engine, or another command's machinery, that a command would otherwise load for nothing).

Both rules read the source with `ast`; each checker is also run on a made-up module it must
reject."""

from __future__ import annotations

import ast
import re

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "usdtpatch"
MAX_LINES = 120

# Functions still longer, by (module path, qualified name), each with who is shortening it.
LONG_EXEMPT: set[tuple[str, str]] = set()

# Modules whose in-function imports are not yet declared at their top, each with its owner
# this session (they are being rewritten there); drop an entry once its module says.
DEFERRED_EXEMPT: dict[str, str] = {}


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and method, nested ones too."""
    out: list[tuple[str, ast.AST]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                out.append((name, node))
            out += _functions(node, f"{name}.")
        else:
            out += _functions(node, prefix)
    return out


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of each function over `limit`."""
    out = []
    for name, node in _functions(ast.parse(source)):
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        assert node.end_lineno is not None
        lines = node.end_lineno - node.lineno + 1
        if lines > limit:
            out.append((name, lines))
    return out


def _imported(node: ast.Import | ast.ImportFrom) -> list[list[str]]:
    """For each module an import names: the dotted names that may stand for it."""
    if isinstance(node, ast.Import):
        return [[a.name] for a in node.names]
    base = node.module or ""
    return [[f"{base}.{a.name}", base] for a in node.names]


def _tokens(dotted: str) -> list[str]:
    """How a module's top may name `dotted`: usdtpatch.a.b as a/b.py, a/ or a.b (usdtpatch.a
    also as a); a third-party or standard module by its package name."""
    parts = dotted.split(".")
    if parts[0] != "usdtpatch":
        return [parts[0]]
    inner = parts[1:]
    if not inner:
        return []
    out = ["/".join(inner) + ".py", ".".join(inner)] + (inner if len(inner) == 1 else [])
    out += ["/".join(inner[:i]) + "/" for i in range(1, len(inner) + 1)]
    return out


def undeclared_imports(source: str) -> list[str]:
    """The modules imported inside a function that the module's docstring does not name in
    a "Deferred import(s)" passage."""
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    declared = doc[doc.find("Deferred import"):] if "Deferred import" in doc else ""
    missing = []
    for _name, fn in _functions(tree):
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for names in _imported(node):
                if not any(re.search(rf"(?<![\w/.]){re.escape(t)}(?![\w])", declared)
                           for n in names for t in _tokens(n)):
                    missing.append(names[-1] if len(names) > 1 else names[0])
    return sorted(set(missing))


def _modules() -> list[tuple[str, str]]:
    return [(str(p.relative_to(PACKAGE)), p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))]


def test_no_function_is_longer_than_120_lines() -> None:
    found = [(path, name, n) for path, text in _modules()
             for name, n in long_functions(text) if (path, name) not in LONG_EXEMPT]
    assert not found, f"functions over {MAX_LINES} lines: {found}"


def test_the_exempt_long_functions_exist() -> None:
    """An exemption names a function that is there (so a stale one is noticed)."""
    names = {(path, name) for path, text in _modules() for name, _n in _functions_of(text)}
    assert names >= LONG_EXEMPT


def _functions_of(text: str) -> list[tuple[str, ast.AST]]:
    return _functions(ast.parse(text))


def test_the_length_rule_rejects_a_long_function() -> None:
    def body(n: int) -> str:  # a function of exactly n lines
        return "def f():\n" + "    x = 1\n" * (n - 2) + "    return x\n"

    assert long_functions(body(MAX_LINES)) == []
    assert long_functions(body(MAX_LINES + 1)) == [("f", MAX_LINES + 1)]
    method = "class C:\n    def g(self):\n" + "        pass\n" * MAX_LINES
    assert long_functions(method) == [("C.g", MAX_LINES + 1)]
    nested = "def outer():\n    def inner():\n" + "        pass\n" * MAX_LINES + "    return 1\n"
    assert [n for n, _ in long_functions(nested)] == ["outer", "outer.inner"]


def test_every_deferred_import_is_declared_at_the_top() -> None:
    found = {path: got for path, text in _modules() if path not in DEFERRED_EXEMPT
             for got in [undeclared_imports(text)] if got}
    assert not found, f"in-function imports not named under 'Deferred imports': {found}"


def test_the_deferred_exemptions_exist() -> None:
    assert all((PACKAGE / path).is_file() for path in DEFERRED_EXEMPT)


def test_the_deferred_import_rule_rejects_an_undeclared_one() -> None:
    body = "def f():\n    import capstone\n    from usdtpatch.rewriter.plan import plan_rewrite\n"
    assert undeclared_imports('"""A module."""\n' + body) == ["capstone",
                                                              "usdtpatch.rewriter.plan"]
    # named elsewhere in the docstring than its "Deferred imports" passage: still undeclared
    assert undeclared_imports('"""Uses capstone.\n\nDeferred imports: none."""\n' + body) == [
        "capstone", "usdtpatch.rewriter.plan"]
    said = '"""A module.\n\nDeferred imports: capstone, rewriter/plan.py (iced)."""\n'
    assert undeclared_imports(said + body) == []
    # a folder names every module in it; a module's name is not a prefix of another's, and
    # a module of a folder is not named by its last name alone
    assert undeclared_imports('"""Deferred imports: rewriter/."""\n' + body) == ["capstone"]
    assert undeclared_imports('"""Deferred imports: capstone, the plan."""\n' + body) == [
        "usdtpatch.rewriter.plan"]
    assert undeclared_imports('"""Deferred imports: capstonex, plans.py."""\n' + body) == [
        "capstone", "usdtpatch.rewriter.plan"]


def test_the_plans_records_are_built_by_keyword() -> None:
    """RewritePlan had 14-15 positional fields, built positionally in three places: every
    record of the plan now takes keywords only (a positional one is a TypeError)."""
    import dataclasses

    from usdtpatch.rewriter import plan

    records = [plan.SiteDecision, plan.DetourUnwind, plan.ForkGuardCode, plan.RewritePlan,
               plan.DetourSymbols, plan.UnwindTables]
    for record in records:
        fields = dataclasses.fields(record)
        assert fields and all(f.kw_only for f in fields), record.__name__
    with pytest.raises(TypeError):
        plan.DetourSymbols(())  # type: ignore[call-arg]
