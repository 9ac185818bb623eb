"""What is said is what is done (issue 47, item 6): each claim a report makes about what
rewrite writes is compared with the rewritten file itself.

- `show`'s detour column is the detour rewrite writes, instruction by instruction (it left
  out the red-zone guard's `lea -0x80(%rsp),%rsp` / `lea 0x80(%rsp),%rsp`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import fixture
from usdtpatch import api
from usdtpatch.elf.image import parse_elf
from usdtpatch.findings import Finding
from usdtpatch.report.show import site_views
from usdtpatch.x86.decode import disassemble


def _mnemonics(texts: list[str]) -> list[str]:
    return [t.split()[0] for t in texts if t]


@pytest.mark.parametrize("name", ["redzone-leaf", "demo", "args-O2"])
def test_shows_detour_is_the_detour_rewrite_writes(name: str, tmp_path: Path) -> None:
    out = tmp_path / name
    outcome = api.rewrite(fixture(name), out, form="nop5", redzone_guard="auto")
    image = parse_elf(out.read_bytes())
    result = api.check(fixture(name))
    views = {v["address"]: v for v in site_views(str(fixture(name)), result.report)}
    compared = 0
    for d in outcome.sites:
        if d.detour is None or d.probe.address not in views:
            continue
        written = disassemble(image.read_vaddr(d.detour.address, len(d.detour.code)),
                              d.detour.address)
        shown = [r["detour"] for r in views[d.probe.address]["rows"] if r["detour"]]
        if not shown:  # a site moved inside another's window: shown with that site
            continue
        assert _mnemonics(shown) == [i.mnemonic for i in written], (d.probe.probe_id, shown)
        assert _mnemonics(shown)[0].startswith("lea") == d.guarded
        compared += 1
    assert compared


def _fork_lines(findings: tuple[Finding, ...]) -> list[str]:
    return [f.message for f in findings if f.code == "process-can-fork"]


def test_a_combo10_rewrite_of_a_forking_program_claims_no_fork_guard(tmp_path: Path) -> None:
    """combo10 is for the nop10 series, whose kernels keep the trampoline in a forked child,
    and no 6.18 kernel optimizes it: rewrite adds no fork guard, so neither check
    --form combo10 nor the rewrite may say "rewrite adds a fork guard" (process-can-fork);
    the output carries no guard; checking the output says nothing is left to rewrite."""
    app = fixture("uses-shared")  # loads libprobes.so, which may fork: rewrite guards nop5
    assert _fork_lines(api.check(app, form="combo10").findings) == []
    out = tmp_path / "app"
    done = api.rewrite(app, out, form="combo10")
    assert done.changed and _fork_lines(done.findings) == []
    assert api.restore(out, tmp_path / "back") is not None
    marker = api.load(out)
    assert api.marked(marker)
    from usdtpatch.elf.marker import marker_of

    doc = marker_of(parse_elf(out.read_bytes()))
    assert doc is not None and not doc.get("fork_guard")  # no guard written
    # and nop5 (a 6.18 target) does add one: the finding says so, the output has it
    nop5 = api.rewrite(app, tmp_path / "nop5", form="nop5")
    assert nop5.changed
    doc5 = marker_of(parse_elf((tmp_path / "nop5").read_bytes()))
    assert doc5 is not None and doc5.get("fork_guard")


@pytest.mark.parametrize(("name", "form"), [("uses-shared", "combo10"), ("demo", "nop5"),
                                            ("adjacent", "nop5"), ("args-O2", "combo5")])
def test_check_of_a_rewritten_file_says_what_rewrite_does_with_it(
        name: str, form: str, tmp_path: Path) -> None:
    """Checking rewrite's output said "4 after rewrite", though rewrite leaves a file it
    rewrote as it is: now 0 after rewrite, the sites blocked by `file-rewritten`, and the
    rewrite of that output changes nothing (what check predicts is what rewrite does)."""
    out = tmp_path / "out"
    assert api.rewrite(fixture(name), out, form=form).changed
    rep = api.check(out).report
    assert [s.outcome for s in rep.sites if s.outcome in ("in-place", "forward", "backward")] \
        == []
    held = [s for s in rep.sites if s.blocked == "file-rewritten"]
    assert ("file-rewritten" in [f.code for f in rep.findings]) == bool(held)
    again = api.rewrite(out, tmp_path / "again", form=form)
    assert not again.changed


@pytest.mark.needs_cc
def test_make_demos_sentence_on_the_header_built_program(tmp_path: Path) -> None:
    """`make demo` said "nothing to rewrite" of the program built with usdtpatch's sys/sdt.h,
    and its check then said "1 after rewrite": the sentence names the probes check leaves to
    the rewrite, and says how many."""
    import re
    import shutil
    import subprocess

    from tests.helpers import ROOT

    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    recipe = (ROOT / "Makefile").read_text()
    said = recipe[recipe.index("built with sdt_headers/sys/sdt.h"):]
    said = said[:said.index("gcc ")]
    exe = tmp_path / "sdt-usdt"
    subprocess.run(["gcc", "-O2", f"-I{ROOT / 'sdt_headers'}", "-o", str(exe),
                    str(ROOT / "tests/data/sdt/probes.c"), str(ROOT / "tests/data/sdt/sema.c")],
                   check=True, timeout=120)
    moved = [s.probe.probe_id for s in api.check(exe).report.sites
             if s.outcome in ("in-place", "forward", "backward")]
    assert f"{len(moved)} after rewrite" in said
    assert set(re.findall(r"\bfix:\w+|\bsema:\w+", said)) == set(moved)
