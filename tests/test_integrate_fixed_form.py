"""No build step reads the build host's kernel (issue 34, item 4): every build-step default is
a fixed form, and every example or documented snippet that calls `usdtpatch rewrite` itself
(rewrite's default, `--form auto`, takes the running kernel's form) names a form or a kernel
generation. Meson's example and the README's Meson snippet did not."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.helpers import ROOT, fixture, run_cli

# a `rewrite` command line: usdtpatch ... 'rewrite' ... (Meson lists) or usdtpatch rewrite ...
_REWRITE = re.compile(r"""usdtpatch['"]?\)?,?\s*['"]?rewrite['"]?(?P<rest>[^\n\]]*)""")
# --tree: a staged tree is rewritten for --kernel 6.18 unless told (docs/distributions.md)
_FIXED = re.compile(r"""--form['"]?,?\s*['"]?(nop5|combo5|combo10)\b|--kernel|--tree""")


def _texts() -> list[Path]:
    files = [p for p in (ROOT / "examples").rglob("*") if p.is_file()
             and p.suffix not in (".c", ".py", ".in")]
    return [*files, ROOT / "README.md", ROOT / "docs" / "build-integration.md",
            ROOT / "docs" / "distributions.md"]


def rewrite_calls(text: str) -> list[str]:
    """Every `usdtpatch rewrite` command line of a build file or a page's code blocks."""
    return [m.group(0) for m in _REWRITE.finditer(text)]


def test_the_finder_finds_and_rejects() -> None:
    bad = "command: [usdtpatch, 'rewrite', '@INPUT@', '-o', '@OUTPUT@'],"
    good = "command: [usdtpatch, 'rewrite', '--form', 'nop5', '@INPUT@', '-o', '@OUTPUT@'],"
    assert rewrite_calls(bad) and not _FIXED.search(rewrite_calls(bad)[0])
    assert _FIXED.search(rewrite_calls(good)[0])
    auto = "$ usdtpatch rewrite --form auto app -o out"
    assert rewrite_calls(auto) and not _FIXED.search(rewrite_calls(auto)[0])
    assert _FIXED.search(rewrite_calls("usdtpatch rewrite app -o out --kernel 6.18")[0])


@pytest.mark.parametrize("path", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_build_rewrite_names_its_form(path: Path) -> None:
    text = path.read_text()
    if path.suffix == ".md":  # a page: its build files' code blocks (meson, cmake, make, sh)
        text = "\n".join(re.findall(r"```(?:meson|cmake|make|sh)\n(.*?)```", text, re.S))
    for call in rewrite_calls(text):
        assert _FIXED.search(call), f"{path.name}: {call!r} takes the build host's kernel"


def test_build_step_defaults_are_fixed_forms() -> None:
    from usdtpatch.integrate.step import FORMS, StepOptions

    assert "auto" not in FORMS and StepOptions().form == "nop5"
    integrate = ROOT / "usdtpatch" / "integrate"
    assert "set(ARG_FORM nop5)" in (integrate / "cmake" / "usdtpatchConfig.cmake").read_text()
    assert "USDTPATCH_FORM ?= nop5" in (integrate / "make" / "usdtpatch.mk").read_text()
    assert re.search(r'^\s*form = "nop5"', (integrate / "setuptools.py").read_text(), re.M)


def test_post_link_never_asks_the_kernel(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from usdtpatch.rewriter import kernel

    def asked() -> int:
        raise AssertionError("a build step asked the build host's kernel")

    monkeypatch.setattr(kernel, "uprobe_syscall_errno", asked)
    app = tmp_path / "app"
    shutil.copyfile(fixture("demo"), app)
    res = run_cli("post-link", app, "--fail-on", "never")
    assert res.rc == 0, res.err
    assert "form nop5" in res.err + res.out
    auto = run_cli("rewrite", "--dry-run", fixture("demo"))  # the probe can fail: auto asks
    assert auto.rc == 3 and "build host" in auto.err
