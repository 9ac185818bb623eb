"""The command line's conventions, the same in every command (issue 24, items 4, 5 and 9):

- a format switch (--json, --sarif, --html) never takes a value, so it cannot take a FILE for
  its output; a report goes to a file only through `--report FILE` (check, rewrite, post-link);
- `--probe` is PROVIDER:NAME or NAME, shell patterns allowed, in list, check, show, plan,
  verify and kcheck, and a pattern that selects nothing is one error (exit 2) in each;
- every positional argument and every option has help text.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch.cli import COMMANDS, build_parser
from usdtpatch.cli.common import EXIT_FAIL, EXIT_OK, EXIT_UNUSABLE
from usdtpatch.report.listing import probe_matches, probe_pattern


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser([])
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_command_is_checked() -> None:
    assert set(_subparsers()) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_option_takes_an_optional_value(command: str) -> None:
    """An option with an optional value (nargs='?') takes the next word when it is not an
    option: `check --sarif prog` took prog as the SARIF output and then missed its FILE."""
    p = _subparsers()[command]
    bad = [a.option_strings for a in p._actions if a.option_strings and a.nargs == "?"]
    assert bad == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_argument_has_help(command: str) -> None:
    p = _subparsers()[command]
    missing = [a.option_strings or a.dest for a in p._actions
               if not a.help and not isinstance(a, argparse._HelpAction)]
    assert missing == []


def test_check_format_switches_print_to_stdout() -> None:
    prog = fixture("forms-mixed")
    res = run_cli("check", "--sarif", prog)  # prog is the input, not the SARIF output
    assert res.rc in (EXIT_OK, EXIT_FAIL), res.err
    log = json.loads(res.out)
    assert log["version"] == "2.1.0"
    assert log["runs"][0]["results"]
    assert prog.read_bytes()[:4] == b"\x7fELF"  # not overwritten
    res = run_cli("check", "--html", "--fail-on", "never", prog)
    assert res.rc == EXIT_OK and res.out.startswith("<!DOCTYPE html>")
    res = run_cli("check", "--json", "--fail-on", "never", prog)
    assert json.loads(res.out)["schema"] == "usdtpatch/analysis"


def test_check_report_file(tmp_path: Path) -> None:
    prog = fixture("forms-mixed")
    by_switch = tmp_path / "out.txt"
    res = run_cli("check", "--sarif", "--report", by_switch, "--fail-on", "never", prog)
    assert res.rc == EXIT_OK and res.out == ""
    assert json.loads(by_switch.read_text())["version"] == "2.1.0"
    for name, start in (("r.sarif", '{\n  "$schema"'),
                        ("r.json", '{\n  "schema": "usdtpatch/analysis"'),
                        ("r.html", "<!DOCTYPE html>")):
        out = tmp_path / name
        res = run_cli("check", "--report", out, "--fail-on", "never", prog)  # by extension
        assert res.rc == EXIT_OK and res.out == "", res.err
        assert out.read_text().startswith(start), name
    # a report file whose name says no format, without a switch: one line, nothing done
    res = run_cli("check", "--report", tmp_path / "r.txt", prog)
    assert res.rc == EXIT_UNUSABLE and res.out == ""
    assert res.err.count("\n") == 1 and "--sarif" in res.err
    assert not (tmp_path / "r.txt").exists()


def test_probe_pattern_meaning() -> None:
    assert probe_matches("parse", "demo", "parse")
    assert probe_matches("demo:parse", "demo", "parse")
    assert probe_matches("p*", "demo", "parse")
    assert probe_matches("*:par?e", "demo", "parse")
    assert probe_matches("de*:*", "demo", "parse")
    assert not probe_matches("demo", "demo", "parse")  # a NAME alone is a name, not a provider
    assert not probe_matches("other:parse", "demo", "parse")
    assert not probe_matches("Parse", "demo", "parse")  # probe names are case-sensitive
    assert not probe_matches("pars", "demo", "parse")  # a pattern matches the whole name
    assert probe_pattern("parse") == "*:parse" and probe_pattern("demo:p*") == "demo:p*"


def _listed(*args: str) -> list[str]:
    doc = json.loads(run_cli("list", "--json", fixture("demo"), *args).out)
    return [f"{p['provider']}:{p['name']}" for p in doc["files"][0]["probes"]]


def test_list_probe_is_a_pattern() -> None:
    assert _listed("--probe", "re*") == ["demo:reply", "demo:request"]
    assert _listed("--probe", "demo:parse") == ["demo:parse"]
    assert _listed("--probe", "parse") == ["demo:parse"]
    assert _listed("--provider", "d?mo", "--probe", "idle") == ["demo:idle"]


def test_filtered_list_counts_what_it_shows() -> None:
    head = run_cli("list", fixture("demo"), "--probe", "re*").out.splitlines()[0]
    assert ": 2 of 4 probe(s) shown," in head
    head = run_cli("list", fixture("demo")).out.splitlines()[0]
    assert ": 4 probe(s)," in head


def test_show_probe_takes_the_same_patterns() -> None:
    by_name = run_cli("show", fixture("demo"), "--probe", "reply", "--json")
    assert by_name.rc == EXIT_OK, by_name.err
    sites = json.loads(by_name.out)["sites"]
    assert [s["probe"] for s in sites] == ["demo:reply"]
    both = json.loads(run_cli("show", fixture("demo"), "--probe", "demo:re*", "--json").out)
    assert [s["probe"] for s in both["sites"]] == ["demo:reply", "demo:request"]
    res = run_cli("show", fixture("demo"), "--probe", "nope")
    assert res.rc == EXIT_UNUSABLE and res.err.count("\n") == 1


def test_plan_probe_selects_sites() -> None:
    res = run_cli("plan", fixture("demo"), "--probe", "idle", "--probe", "demo:parse", "--json")
    assert res.rc == EXIT_OK, res.err
    assert sorted(s["probe"] for s in json.loads(res.out)["sites"]) == ["demo:idle",
                                                                         "demo:parse"]


def test_kcheck_probe_has_the_same_meaning(monkeypatch: pytest.MonkeyPatch) -> None:
    """kcheck hands api.kcheck shell patterns over provider:name: a NAME alone becomes
    *:NAME (the running kernel is not needed to see what it is asked)."""
    from usdtpatch import api
    from usdtpatch.errors import UnsupportedError

    p = _subparsers()["kcheck"]
    (probe,) = [a for a in p._actions if "--probe" in a.option_strings]
    assert "PROVIDER:NAME or NAME" in (probe.help or "")
    asked: list[list[str]] = []

    def fake(path: object, **kw: object) -> object:
        asked.append(list(kw["probes"]))  # type: ignore[call-overload]
        raise UnsupportedError("stop here")

    monkeypatch.setattr(api, "kcheck", fake)
    res = run_cli("kcheck", fixture("demo"), "--pid", "1", "--probe", "re*", "--probe",
                  "demo:parse")
    assert res.rc == EXIT_UNUSABLE and asked == [["*:re*", "demo:parse"]]
    from fnmatch import fnmatchcase

    names = ["demo:parse", "demo:reply", "demo:idle", "demo:request"]
    assert [n for n in names if any(fnmatchcase(n, q) for q in asked[0])] == \
        ["demo:parse", "demo:reply", "demo:request"]


def test_the_red_zone_guard_has_one_name(tmp_path: Path) -> None:
    """--redzone-guard (rewrite, post-link, make), REDZONE_GUARD (CMake), redzone_guard (the
    API, [tool.usdtpatch], Meson): no `guard` alone anywhere."""
    import inspect

    from usdtpatch import api, integrate
    from usdtpatch.integrate.setuptools import read_options

    for fn in (api.rewrite, api.rewrite_plan):
        params = inspect.signature(fn).parameters
        assert "redzone_guard" in params and "guard" not in params, fn.__name__
    for command in ("rewrite", "post-link"):
        opts = [a.option_strings for a in _subparsers()[command]._actions]
        assert ["--redzone-guard"] in opts and ["--guard"] not in opts
    assert "REDZONE_GUARD" in (integrate.HERE / "cmake" / "usdtpatchConfig.cmake").read_text()
    assert "--redzone-guard $(USDTPATCH_REDZONE_GUARD)" in \
        (integrate.HERE / "make" / "usdtpatch.mk").read_text()
    p = tmp_path / "pyproject.toml"
    p.write_text('[tool.usdtpatch]\nredzone_guard = "never"\n')
    assert read_options(p).redzone_guard == "never"
    p.write_text('[tool.usdtpatch]\nguard = "never"\n')
    with pytest.raises(ValueError, match="redzone_guard"):
        read_options(p)


# --- explain, SARIF help (item 11) -----------------------------------------------------------


def test_explain_prints_every_codes_documentation() -> None:
    from usdtpatch.findings import CODES, documentation

    for code, entry in CODES.items():
        doc = documentation(code)
        assert f"- severity: {entry.severity.value}" in doc, code
        assert "- meaning:" in doc and "- hint:" in doc, code
        assert "triggered by" not in doc, code  # the project's test inputs stay in docs/
        res = run_cli("explain", code)
        assert res.rc == EXIT_OK and res.out.startswith(f"{code} ({entry.severity_text}): ")
        assert doc in res.out


def test_explain_rejects_and_lists() -> None:
    res = run_cli("explain", "red-zone-lve")
    assert res.rc == EXIT_UNUSABLE and res.out == ""
    assert res.err.count("\n") == 1 and "did you mean red-zone-live" in res.err
    res = run_cli("explain", "site-32-bit")  # an earlier name
    assert res.rc == EXIT_OK and "earlier name of site-elf32" in res.out
    from usdtpatch.findings import CODES

    listing = run_cli("explain").out.splitlines()
    assert len(listing) == len(CODES) and listing[0].split()[0] == min(CODES)


def test_sarif_rules_carry_their_help_inline() -> None:
    from usdtpatch.findings import documentation

    log = json.loads(run_cli("check", "--sarif", "--fail-on", "never", fixture("demo")).out)
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} >= {"red-zone-rewrite", "arg-uses-rsp"}
    for r in rules:
        assert documentation(r["id"]) in r["help"]["text"]
        assert documentation(r["id"]) in r["help"]["markdown"]
    assert "docs/findings.md" not in json.dumps(log)  # no link into a source tree


# --- item 9 ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relocatable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import subprocess

    from tests.test_integrate_support import need

    need("gcc")  # and systemtap's sys/sdt.h

    d = tmp_path_factory.mktemp("obj")
    (d / "p.c").write_text("#include <sys/sdt.h>\nint f(int x) { DTRACE_PROBE1(p, n, x); "
                           "return x; }\n")
    subprocess.run(["gcc", "-O2", "-c", "p.c", "-o", "p.o"], cwd=d, check=True)
    return d / "p.o"


@pytest.mark.needs_cc
def test_an_object_file_is_not_linked(relocatable: Path, tmp_path: Path) -> None:
    res = run_cli("check", relocatable)
    assert res.rc == EXIT_FAIL
    assert "error [not-linked] not linked (ELF type 1: a relocatable object)" in res.out
    assert "(rewrite the linked file)" in res.out
    assert "pc-outside-segments" not in res.out and "damaged" not in res.out
    res = run_cli("rewrite", relocatable, "-o", tmp_path / "out")
    assert res.rc == EXIT_UNUSABLE and res.out == ""
    assert res.err.strip().endswith("not linked (ELF type 1: a relocatable object): its note "
                                    "addresses are not final: rewrite the linked file")
    assert not (tmp_path / "out").exists()


def test_check_prints_an_input_error_once(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    res = run_cli("check", fixture("nop5"), missing)
    assert res.rc == EXIT_UNUSABLE
    assert res.err.count(str(missing)) == 1 and str(missing) not in res.out


def test_rewrite_summary_says_the_fork_guard_was_added(tmp_path: Path) -> None:
    res = run_cli("rewrite", fixture("fork"), "-o", tmp_path / "fork", "--form", "nop5")
    assert res.rc == EXIT_OK, res.err
    assert "fork guard added;" in res.out  # on the summary line
    assert "fork guard added for 1 site(s)" in res.out  # and what it does
    res = run_cli("rewrite", fixture("fork"), "-o", tmp_path / "nofork", "--form", "nop5",
                  "--fork-guard", "never")
    assert "fork guard added" not in res.out


# --- progress of every phase (item 8) --------------------------------------------------------


def test_rewrite_reports_every_phase(tmp_path: Path) -> None:
    from usdtpatch import api

    events: list[str] = []
    api.rewrite(fixture("demo"), tmp_path / "out", progress=lambda d, t: events.append("site"),
                phase=events.append, jobs=1)
    assert events.count("site") == 4  # the demo's four sites
    later = [e for e in events if e != "site"]
    assert later[-4:] == ["verify", "build", "check", "write"]
    assert events.index("verify") > max(i for i, e in enumerate(events) if e == "site")


def test_the_terminal_bar_shows_the_phases() -> None:
    import io

    from rich.console import Console

    from usdtpatch.report.render import site_progress

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    with site_progress(console, after=0) as progress_for:
        shown = progress_for("prog")
        shown.sites(530, 531)
        shown.phase("verify")
        console.file.flush()
    text = buf.getvalue()
    assert "530/531 sites" in text or "prog: verify" in text
    assert "prog: verify" in text
    off = io.StringIO()  # not a terminal: nothing at all
    with site_progress(Console(file=off), after=0) as progress_for:
        shown = progress_for("prog")
        shown.sites(1, 2)
        shown.phase("verify")
    assert off.getvalue() == ""


def test_bench_tables_in_a_pipe_are_plain() -> None:
    import io

    from usdtpatch.report.render import render_table

    out = io.StringIO()
    render_table(out, "title", [("variant", "left"), ("x ref", "right")],
                 [["stap-nop1", "1.00"], ["usdtpatch-nop5-long-name", "12.50"]])
    text = out.getvalue()
    assert text.isascii() and "│" not in text and "─" not in text
    lines = text.splitlines()
    assert lines[0] == "title"
    assert lines[1].split() == ["variant", "x", "ref"]
    assert lines[2].split() == ["stap-nop1", "1.00"] and lines[3].endswith("12.50")
    assert len(lines[2]) == len(lines[3])  # the numbers right-aligned


# --- one red-zone verdict (item 10) ----------------------------------------------------------

RED_ZONE_CLOBBER = "optimized-call-clobbers-red-zone"


@pytest.mark.parametrize("name", ["redzone-leaf-nop5", "redzone-leaf-nored",
                                  "redzone-nonleaf-nop5", "nop5", "forms-mixed"])
def test_plan_verify_and_check_give_one_red_zone_verdict(name: str) -> None:
    """plan and verify flag the optimized call's writes below rsp on exactly the sites where
    check reports red-zone-live (the rule of analysis/hazards.red_zone)."""
    doc = json.loads(run_cli("check", "--json", "--fail-on", "never", fixture(name)).out)
    live = {f"{s['provider']}:{s['name']}" for s in doc["files"][0]["sites"]
            if any(x["code"] == "red-zone-live" for x in s["findings"])}
    plan = json.loads(run_cli("plan", "--json", fixture(name)).out)
    planned = {s["probe"] for s in plan["sites"]
               if any(f["code"] == RED_ZONE_CLOBBER for f in s["findings"])}
    verify = json.loads(run_cli("verify", "--json", fixture(name)).out)
    verified = {s["probe"] for s in verify["sites"]
                if any(h["code"] == RED_ZONE_CLOBBER for h in s["hazards"])}
    assert planned == verified == live
    if name == "redzone-leaf-nop5":
        assert live  # the rule flags this one
    if name in ("nop5", "redzone-leaf-nored"):  # cleared by the rule; the writes still measured
        assert not live and any(s["red_zone_writes"] for s in verify["sites"])


@pytest.mark.needs_cc
def test_an_indexed_red_zone_access_is_one_verdict_too(tmp_path: Path) -> None:
    """A leaf that fills its red zone through (%rsp,%rcx) with a negative %rcx (the live
    kernel test's program, which the live test shows clobbered): check's rule flags it, and
    plan and verify with it (before, check cleared it while plan and verify warned)."""
    import subprocess

    from tests.test_integrate_support import need
    from tests.test_live_kernel import REDZONE_MAIN_C, REDZONE_S

    need("gcc")
    (tmp_path / "rz.S").write_text(REDZONE_S)
    (tmp_path / "rzmain.c").write_text(REDZONE_MAIN_C)
    exe = tmp_path / "redzone"
    subprocess.run(["gcc", "-O2", "-o", exe, tmp_path / "rzmain.c", tmp_path / "rz.S"],
                   check=True)
    doc = json.loads(run_cli("check", "--json", "--fail-on", "never", exe).out)
    (site,) = doc["files"][0]["sites"]
    (live,) = [f for f in site["findings"] if f["code"] == "red-zone-live"]
    assert "plus the register %rcx" in live["message"]
    plan = json.loads(run_cli("plan", "--json", exe).out)
    assert [f["code"] for f in plan["sites"][0]["findings"]] == [RED_ZONE_CLOBBER]
    verify = json.loads(run_cli("verify", "--json", exe).out)
    assert [h["code"] for h in verify["sites"][0]["hazards"]] == [RED_ZONE_CLOBBER]


# --- one behaviour per option (issue 34, item 6) ----------------------------------------------

DEMO_PROBES = "(probes: demo:idle, demo:parse, demo:reply, demo:request)"


@pytest.mark.parametrize("argv", [
    ["list", "--probe", "nope"], ["list", "--provider", "nope"], ["show", "--probe", "nope"],
    ["plan", "--probe", "nope"], ["verify", "--probe", "nope"], ["check", "--probe", "nope"],
    ["check", "--json", "--probe", "nope"], ["list", "--json", "--probe", "nope:*"]],
    ids="-".join)
def test_a_pattern_selecting_nothing_is_one_error_everywhere(argv: list[str]) -> None:
    """exit 2, nothing on stdout, one line naming the pattern and the probes there are (list
    and plan exited 0 with an empty table; check and verify took no --probe)."""
    res = run_cli(argv[0], fixture("demo"), *argv[1:])
    assert res.rc == EXIT_UNUSABLE
    assert res.out == "" or argv[0] == "check"  # check prints its (empty) document
    assert res.err.count("\n") == 1, res.err
    assert "no probe matches" in res.err and DEMO_PROBES in res.err
    assert argv[-1] in res.err


def test_check_and_verify_take_probe() -> None:
    doc = json.loads(run_cli("check", "--json", fixture("demo"), "--probe", "re*").out)
    assert [s["name"] for s in doc["files"][0]["sites"]] == ["reply", "request"]
    res = run_cli("verify", "--json", fixture("demo"), "--probe", "idle", "--probe", "parse")
    assert res.rc == EXIT_OK, res.err
    assert sorted(s["probe"] for s in json.loads(res.out)["sites"]) == ["demo:idle",
                                                                        "demo:parse"]


def test_a_pattern_matching_one_of_several_files_is_no_error() -> None:
    res = run_cli("check", "--json", fixture("demo"), fixture("nop5"), "--probe", "demo:*")
    assert res.rc == EXIT_OK, res.err
    doc = json.loads(res.out)
    assert [len(f["sites"]) for f in doc["files"]] == [4, 0]


def test_plan_and_verify_name_the_kernel_not_a_form() -> None:
    """--form is a site form in rewrite and check; plan and verify take --kernel (rewrite's
    generations), the old --form spelling warns and still works."""
    for cmd in ("plan", "verify"):
        opts = {o for a in _subparsers()[cmd]._actions for o in a.option_strings}
        assert "--kernel" in opts
    new = run_cli("plan", "--json", fixture("pie"), "--kernel", "nop10-series")
    old = run_cli("plan", "--json", fixture("pie"), "--form", "nop10")
    assert new.rc == old.rc == EXIT_OK and new.err == ""
    assert new.out == old.out and '"nop10"' in new.out
    assert "deprecated" in old.err and "--kernel nop10" in old.err
    assert old.err.count("\n") == 1
    default = run_cli("plan", "--json", fixture("pie"))
    assert default.out == run_cli("plan", "--json", fixture("pie"), "--kernel", "6.18").out
    bad = run_cli("plan", fixture("pie"), "--form", "nop5", "--kernel", "nop10-series")
    assert bad.rc == EXIT_UNUSABLE


def test_the_apis_form_error_lists_auto() -> None:
    from usdtpatch import api

    for call in (api.check, api.rewrite):
        with pytest.raises(ValueError, match=r"expected one of auto, nop5, combo5, combo10"):
            call(fixture("demo"), form="bogus")


# --- a file without probes (issue 34, item 7) -------------------------------------------------

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


@pytest.mark.skipif(not LIBC.exists(), reason=f"{LIBC} not installed")
def test_a_file_without_probes_is_one_line_and_never_written(tmp_path: Path) -> None:
    """rewrite printed an empty table and `0 site(s)`, wrote a byte-identical copy and
    exited 0; now one line, nothing written: with -o exit 2 (the output asked for does not
    exist), with --dry-run or --in-place exit 0 (the file as it is is the answer)."""
    import shutil

    libc = tmp_path / "libc.so.6"
    shutil.copyfile(LIBC, libc)
    for bare in (libc, fixture("noprobes")):
        res = run_cli("rewrite", bare, "-o", tmp_path / "x")
        assert res.rc == EXIT_UNUSABLE and res.out == ""
        assert res.err.count("\n") == 1 and "no USDT probes" in res.err
        assert not (tmp_path / "x").exists()
    dry = run_cli("rewrite", "--dry-run", libc)
    assert dry.rc == EXIT_OK and dry.out == f"{libc}: no USDT probes: nothing to rewrite, " \
                                            f"nothing written\n"
    before = libc.read_bytes()
    inplace = run_cli("rewrite", "--in-place", libc)
    assert inplace.rc == EXIT_OK and inplace.out.count("\n") == 1 and libc.read_bytes() == before
    # several files: the others are written, the one without probes is not
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli("rewrite", "--no-verify", libc, fixture("demo"), "-o", out)
    assert res.rc == EXIT_UNUSABLE and res.err.count("\n") == 1 and "no USDT probes" in res.err
    assert sorted(p.name for p in out.iterdir()) == ["demo"]
    assert "libc" not in res.out
