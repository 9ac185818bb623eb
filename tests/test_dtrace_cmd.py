"""`usdtpatch dtrace -h / -G`: the .d parser, the generated header and semaphore object, and
the command line, checked against systemtap's dtrace script.

Shapes of .d files (tests/data/sdt/): app.d (typed, named arguments, two providers, `__`
names, #pragma D; with semaphores), plain.d (unnamed types; with and without semaphores),
pg_like.d (types defined with #define, needs -C), and the fixture fixtures/src/probes.d.
The same program (use_app.c + use_plain.c) built from systemtap's dtrace + sys/sdt.h and from
usdtpatch's must give the same notes but pc.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.test_sdt_support import (
    DATA,
    ROOT,
    SDT_INCLUDE,
    compare_notes,
    load_probes,
    need_toolchain,
    run_cc,
)
from usdtpatch.dtrace.header import macro_name, render_header, render_stub_source
from usdtpatch.dtrace.parse import ArgDecl, DScriptError, parse_dscript, tokenize
from usdtpatch.x86.nops import SiteForm

# --- the parser -----------------------------------------------------------------------------


def test_parse_typed_arguments() -> None:
    script = parse_dscript((DATA / "app.d").read_text(), "app.d")
    assert [p.name for p in script.providers] == ["app", "app_gc"]
    probes = {p.name: p for p in script.providers[0].probes}
    assert list(probes) == ["start", "request__begin", "request__end", "bytes", "twelve"]
    assert probes["start"].args == ()
    assert probes["request__begin"].args == (ArgDecl("const char *", "path"),
                                             ArgDecl("unsigned long long", "id"),
                                             ArgDecl("int", "method"))
    assert probes["bytes"].args[0] == ArgDecl("unsigned char *", "buf")
    assert len(probes["twelve"].args) == 12
    assert probes["twelve"].args[10] == ArgDecl("void *", "k")
    assert probes["request__begin"].dtrace_name == "request-begin"


@pytest.mark.parametrize(("decl", "expected"), [
    ("int", ArgDecl("int", None)),
    ("char *", ArgDecl("char *", None)),
    ("char **argv", ArgDecl("char **", "argv")),
    ("unsigned long long", ArgDecl("unsigned long long", None)),
    ("uint64_t", ArgDecl("uint64_t", None)),
    ("uint64_t n", ArgDecl("uint64_t", "n")),
    ("struct foo *", ArgDecl("struct foo *", None)),
    ("struct foo *f", ArgDecl("struct foo *", "f")),
    ("const volatile int x", ArgDecl("const volatile int", "x")),
    ("char [16]", ArgDecl("char [16]", None)),
], ids=lambda v: str(v) if isinstance(v, str) else "")
def test_argument_declarations(decl: str, expected: ArgDecl) -> None:
    script = parse_dscript(f"provider p {{ probe a({decl}); }};", "t.d")
    assert script.providers[0].probes[0].args == (expected,)


def test_void_means_no_arguments() -> None:
    script = parse_dscript("provider p { probe a(void); probe b(); };", "t.d")
    assert [pr.args for pr in script.providers[0].probes] == [(), ()]


def test_skips_comments_pragmas_and_declarations() -> None:
    text = ("// line comment with provider and probe words\n"
            "#pragma D option quiet\n"
            "typedef struct conn { int fd; struct { long x; } inner; } conn_t;\n"
            "struct later;\n"
            "provider p { /* probe hidden(int); */ probe a(conn_t *c); };\n")
    script = parse_dscript(text, "t.d")
    assert [pr.name for pr in script.providers[0].probes] == ["a"]
    assert script.providers[0].probes[0].line == 5


def test_line_markers_name_the_original_line() -> None:
    text = '# 1 "<built-in>"\n# 40 "orig.d"\nprovider p {\n  probe a(int x = 3);\n};\n'
    with pytest.raises(DScriptError, match=r"^orig\.d:41:\d+: "):
        parse_dscript(text, "pre.d")


@pytest.mark.parametrize(("text", "message"), [
    ("provider p { probe a(int) };", r"t\.d:1:26: expected ';' after probe 'a', found '}'"),
    ("provider p {\n  probe a(int)\n};", r"t\.d:2:15: expected ';' after probe 'a', found '}'"),
    ("provider p { probe a(int; };", r"expected ',' or '\)' after an argument of probe 'a'"),
    ("provider p { probe (int); };", r"expected a probe name, found '\('"),
    ("provider { probe a(); };", r"expected a provider name, found '\{'"),
    ("provider p { probe a(); probe a(int); };", r"probe 'a' is declared twice"),
    ("provider p { }; provider p { };", r"provider 'p' is declared twice"),
    ("provider p { probe a(" + ", ".join(["int"] * 13) + "); };",
     r"has 13 arguments; sys/sdt.h probes take at most 12"),
    ("provider p { probe a(int, void); };", r"has a 'void' argument"),
    ("provider p { probe a(int @x); };", r"unexpected character '@'"),
    ("provider p { probe a(*p); };", r"starts with '\*', expected a type name"),
    ("provider p { probe a(); ", r"expected 'probe' or '}' in provider 'p', found the end"),
    ("/* never closed\nprovider p {};", r"t\.d:1:1: unterminated /\* comment"),
    ("probe a();", r"expected 'provider', found 'probe'"),
    ("typedef int x", r"'typedef' declaration is not terminated by ';'"),
    ("/* nothing */\n", r"t\.d: no provider declaration found"),
    ("provider p { probe a(char [16); };", r"expected '\]' to close an array argument"),
], ids=["no-semicolon", "no-semicolon-eol", "unclosed-args", "no-probe-name",
        "no-provider-name", "dup-probe", "dup-provider", "13-args", "void-arg", "bad-char",
        "star-first", "unclosed-provider",
        "unclosed-comment", "no-provider-keyword", "unterminated-typedef", "empty",
        "unclosed-array"])
def test_rejects_malformed_scripts(text: str, message: str) -> None:
    with pytest.raises(DScriptError, match=message) as info:
        parse_dscript(text, "t.d")
    assert "\n" not in str(info.value)


def test_tokenize_positions() -> None:
    toks = tokenize("provider\n  p {", "x.d")
    assert [(t.text, t.line, t.col) for t in toks] == [("provider", 1, 1), ("p", 2, 3),
                                                        ("{", 2, 5), ("", 2, 6)]


# --- the generated text ---------------------------------------------------------------------

_DEFINE = re.compile(r"^#define\s+(\w+)(\([^)]*\))?", re.MULTILINE)


def defined_macros(header: str) -> dict[str, str]:
    """Function-like and object-like macros a header defines (name -> parameter list)."""
    return {m.group(1): (m.group(2) or "") for m in _DEFINE.finditer(header)}


def test_macro_names_follow_systemtap() -> None:
    script = parse_dscript("provider my_app { probe query__done(int); };", "t.d")
    prov = script.providers[0]
    assert macro_name(prov, prov.probes[0]) == "MY_APP_QUERY_DONE"
    header = render_header(script)
    macros = defined_macros(header)
    assert macros["MY_APP_QUERY_DONE"] == "(arg1)"
    assert macros["MY_APP_QUERY_DONE_ENABLED"] == "()"
    assert "my_app_query__done_semaphore" in header
    assert "DTRACE_PROBE1 (my_app, query__done, arg1)" in header


def test_no_semaphores_header_and_stub() -> None:
    script = parse_dscript((DATA / "plain.d").read_text(), "plain.d")
    header = render_header(script, semaphores=False)
    assert "_SDT_HAS_SEMAPHORES" not in header
    assert "semaphore" not in header.replace("semaphores", "")
    assert "#define PLAIN_ENTER_ENABLED() (1)" in header
    assert "semaphore" not in render_stub_source(script, semaphores=False).split("*/", 1)[1]


def _stap_dtrace(tmp: Path, args: list[str]) -> None:
    proc = subprocess.run(["dtrace", *args], capture_output=True, text=True, cwd=tmp,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def need_stap_dtrace() -> None:
    if not shutil.which("dtrace"):
        pytest.skip("systemtap's dtrace is not installed (Debian systemtap-sdt-dev)")
    need_toolchain("gcc", "clang")


D_FILES = ["app.d", "plain.d", "pg_like.d", "fixture-probes.d"]


def _d_path(name: str) -> Path:
    if name == "fixture-probes.d":
        p = ROOT / "fixtures" / "src" / "probes.d"
        if not p.is_file():
            pytest.skip(f"{p} is not there")
        return p
    return DATA / name


@pytest.mark.parametrize("dname", D_FILES)
@pytest.mark.needs_cc
def test_same_macros_as_systemtap(tmp_path: Path, dname: str) -> None:
    """Every macro systemtap's dtrace -h defines, ours defines with the same parameters."""
    need_stap_dtrace()
    src = _d_path(dname)
    cpp = ["-C"] if dname == "pg_like.d" else []
    _stap_dtrace(tmp_path, [*cpp, "-h", "-s", str(src), "-o", "stap.h"])
    res = run_cli("dtrace", *cpp, "-h", "-s", src, "-o", tmp_path / "ours.h")
    assert (res.rc, res.err) == (0, "")
    theirs = defined_macros((tmp_path / "stap.h").read_text())
    ours = defined_macros((tmp_path / "ours.h").read_text())
    probe_macros = {k: v for k, v in theirs.items()
                    if not k.startswith(("_", "STAP_")) and not k.endswith("_semaphore")}
    assert probe_macros
    assert {k: ours.get(k) for k in probe_macros} == probe_macros


def _build_program(tmp: Path, cc: str, opt: str, ours: bool, plain_semaphores: bool) -> Path:
    """use_app.c + use_plain.c with headers and -G objects from one dtrace implementation."""
    d = tmp / ("ours" if ours else "stap")
    d.mkdir()
    for name in ("app", "plain"):
        extra = [] if plain_semaphores or name == "app" else ["--no-semaphores"]
        if ours:
            for mode, suffix in (("-h", ".h"), ("-G", ".o")):
                res = run_cli("dtrace", mode, *extra, "-s", DATA / f"{name}.d",
                              "-o", d / f"{name}{suffix}")
                assert (res.rc, res.err) == (0, ""), res.err
        else:
            _stap_dtrace(d, ["-h", "-s", str(DATA / f"{name}.d"), "-o", f"{name}.h"])
            _stap_dtrace(d, ["-G", "-s", str(DATA / f"{name}.d"), "-o", f"{name}.o"])
    # unguarded, so that the notes can equal systemtap's field by field (the red-zone guard,
    # the header's default, makes operands registers: tests/test_sdt_notes.py)
    inc = [f"-I{SDT_INCLUDE}", "-DUSDTPATCH_REDZONE_GUARD=0"] if ours else []
    out = d / "prog"
    run_cc([cc, f"-{opt}", *inc, f"-I{d}", str(DATA / "use_app.c"), str(DATA / "use_plain.c"),
            str(d / "app.o"), str(d / "plain.o"), "-o", str(out)])
    return out


@pytest.mark.needs_cc
@pytest.mark.parametrize(("cc", "opt"), [("gcc", "O0"), ("gcc", "O1"), ("clang", "O2")])
def test_program_notes_match_systemtap(tmp_path: Path, cc: str, opt: str) -> None:
    need_stap_dtrace()
    theirs = load_probes(_build_program(tmp_path, cc, opt, ours=False, plain_semaphores=True))
    ours = load_probes(_build_program(tmp_path, cc, opt, ours=True, plain_semaphores=True))
    assert compare_notes(theirs, ours) == []
    assert {p.probe_id for p in ours.probes} >= {
        "app:start", "app:request__begin", "app:request__end", "app:bytes", "app:twelve",
        "app_gc:collect", "app_gc:done", "plain:enter", "plain:leave", "plain:tick"}
    for p in ours.probes:
        assert p.site.form == SiteForm.NOP5
        assert p.semaphore is not None and p.semaphore.section == ".probes", p.probe_id


@pytest.mark.needs_cc
def test_program_without_semaphores(tmp_path: Path) -> None:
    need_toolchain("gcc")
    prog = _build_program(tmp_path, "gcc", "O2", ours=True, plain_semaphores=False)
    ps = load_probes(prog)
    plain = [p for p in ps.probes if p.provider == "plain"]
    app = [p for p in ps.probes if p.provider == "app"]
    assert {p.name for p in plain} == {"enter", "leave", "tick"}
    assert all(p.semaphore is None for p in plain)
    assert app and all(p.semaphore is not None for p in app)
    # with no semaphore, PLAIN_ENTER_ENABLED() is 1: the probe runs without a tracer
    subprocess.run([str(prog)], check=True, timeout=20)


@pytest.mark.needs_cc
def test_stub_object_defines_hidden_semaphores(tmp_path: Path) -> None:
    need_toolchain("gcc", "readelf")
    res = run_cli("dtrace", "-G", "-s", DATA / "app.d", "-o", tmp_path / "app.o")
    assert (res.rc, res.err) == (0, "")
    syms = subprocess.run(["readelf", "-sW", str(tmp_path / "app.o")], capture_output=True,
                          text=True, check=True).stdout
    sems = {ln.split()[-1]: ln.split() for ln in syms.splitlines() if "_semaphore" in ln}
    assert set(sems) == {"app_start_semaphore", "app_request__begin_semaphore",
                         "app_request__end_semaphore", "app_bytes_semaphore",
                         "app_twelve_semaphore", "app_gc_collect_semaphore",
                         "app_gc_done_semaphore"}
    for fields in sems.values():
        assert fields[2] == "2" and fields[3] == "OBJECT" and fields[5] == "HIDDEN"
    secs = subprocess.run(["readelf", "-SW", str(tmp_path / "app.o")], capture_output=True,
                          text=True, check=True).stdout
    assert " .probes " in secs


def test_cpp_option(tmp_path: Path) -> None:
    need_toolchain("cpp")
    res = run_cli("dtrace", "-C", "-DLOCKMODE_T=int", "-h", "-s", DATA / "pg_like.d",
                  "-o", tmp_path / "pg.h")
    assert (res.rc, res.err) == (0, "")
    header = (tmp_path / "pg.h").read_text()
    assert "/* PGLIKE_TRANSACTION_START ( unsigned int ) */" in header
    assert "( unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, int )" \
        in header
    assert "#define PGLIKE_BUFFER_READ_START(arg1, arg2, arg3, arg4, arg5)" in header


@pytest.mark.needs_cc
def test_default_output_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need_toolchain("gcc")
    monkeypatch.chdir(tmp_path)
    assert run_cli("dtrace", "-h", "-s", DATA / "plain.d").rc == 0
    assert run_cli("dtrace", "-G", "-s", DATA / "plain.d").rc == 0
    assert (tmp_path / "plain.h").is_file() and (tmp_path / "plain.o").is_file()


def test_ignored_systemtap_options(tmp_path: Path) -> None:
    res = run_cli("dtrace", "-64", "-fPIC", "--types", "-x", "nolibs", "-h", "-s",
                  DATA / "plain.d", "-o", tmp_path / "p.h", "extra.o")
    assert (res.rc, res.err) == (0, "")


@pytest.mark.parametrize(("argv", "message"), [
    (["-s", "{d}/plain.d"], r"give -h .* or -G"),
    (["-h"], r"-s FILE\.d is required"),
    (["-h", "-s", "{tmp}/missing.d"], r"missing\.d: no such file"),
    (["-h", "-s", "{tmp}/bad.d"], r"bad\.d:2:\d+: expected ';' after probe 'a'"),
    (["-C", "-h", "-s", "{tmp}/err.d"], r"err\.d: cpp failed: .*#error"),
], ids=["no-mode", "no-script", "missing-file", "syntax", "cpp-fails"])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, argv: list[str], message: str) -> None:
    (tmp_path / "bad.d").write_text("provider p {\n  probe a(int)\n};\n")
    (tmp_path / "err.d").write_text("#error stop here\nprovider p {};\n")
    args = [a.format(d=DATA, tmp=tmp_path) for a in argv]
    res = run_cli("dtrace", *args)
    assert res.rc == 2
    assert res.out == ""
    lines = res.err.strip().splitlines()
    assert len(lines) == 1, res.err
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "p.h").exists()


def test_failing_compiler_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "false")
    res = run_cli("dtrace", "-G", "-s", DATA / "plain.d", "-o", tmp_path / "p.o")
    assert res.rc == 2
    assert len(res.err.strip().splitlines()) == 1
    assert "false failed on the semaphore source" in res.err
    assert not (tmp_path / "p.o").exists()


def test_both_modes_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    res = run_cli("dtrace", "-h", "-G", "-s", DATA / "plain.d", "-o", tmp_path / "p.h")
    assert res.rc == 2
    assert "argument -G: not allowed with argument -h" in capsys.readouterr().err  # argparse
    assert not (tmp_path / "p.h").exists()


@pytest.mark.needs_cc
def test_keep_prints_and_keeps_the_source(tmp_path: Path) -> None:
    need_toolchain("gcc")
    res = run_cli("dtrace", "-G", "-k", "-s", DATA / "plain.d", "-o", tmp_path / "p.o")
    assert res.rc == 0
    kept = tmp_path / "p.semaphores.c"
    assert res.err.strip() == f"source: {kept}"
    assert "plain_enter_semaphore" in kept.read_text()
