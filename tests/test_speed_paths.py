"""What the fast paths of `list` and `check` rely on: a small import graph for `list`, the API
bound lazily on the package (`usdtpatch.rewrite` is the function; the rewriter is the
subpackage usdtpatch.rewriter), the cyclic
collector paused only while a read-only command runs, and the same answers as the API."""

from __future__ import annotations

import gc
import io
import subprocess
import sys
from typing import Any, cast

import pytest

from tests.helpers import ROOT, fixture
from usdtpatch import api, cli


def _python(code: str, *flags: str) -> str:
    res = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=False, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_list_imports_neither_the_site_analysis_nor_the_rewriter_nor_capstone() -> None:
    """`list` imports the library's face (usdtpatch.api, whose site analysis is deferred),
    and reads probes only."""
    got = _python("import sys, usdtpatch.cli.cmd_list, usdtpatch.report.plain\n"
                  "print(sorted(m for m in sys.modules if m in ('usdtpatch.analysis.check', "
                  "'usdtpatch.analysis.windows', 'capstone') or m.startswith('usdtpatch.rewrite')"
                  " or m.startswith('usdtpatch.sequences')))")
    assert got == "[]"


@pytest.mark.parametrize("argv", [["--version"], ["--cmake-dir"], ["--version", "--include-dir"]])
def test_version_and_the_paths_import_no_command(argv: list[str]) -> None:
    """`usdtpatch --version` imported every command's module, the emulator, capstone and
    iced-x86 among them: 0.5 s of CPU to print a line. The options that print and exit
    import no command module and no engine."""
    got = _python("import io, sys\nfrom usdtpatch.cli import main\n"
                  f"assert main({argv!r}, io.StringIO()) == 0\n"
                  "print(sorted(m for m in sys.modules if m.startswith('usdtpatch.cli.cmd_') or "
                  "m.split('.')[0] in ('unicorn', 'capstone', 'iced_x86', 'z3', 'pyvex', "
                  "'rich', 'keystone')))")
    assert got.splitlines()[-1] == "[]", got  # after what the option printed


@pytest.mark.parametrize("form", [["--json"], []], ids=["json", "table"])
def test_a_list_run_imports_neither_pathlib_nor_shutil_nor_typing(form: list[str]) -> None:
    """pathlib (with urllib and ipaddress) and shutil (with bz2 and lzma, through argparse's
    help formatter) cost `list` ~4 ms of start-up, typing ~3 ms (its names are only
    annotations there: `TYPE_CHECKING = False` guards their import); docs/performance.md.
    (-S: whatever the venv's .pth files import is not usdtpatch's doing; `list` needs no
    installed package.)"""
    got = _python("import io, sys\nfrom usdtpatch.cli import main\n"
                  f"main(['list', *{form!r}, {str(fixture('pie'))!r}], io.StringIO())\n"
                  "print(sorted(m for m in ('pathlib', 'shutil', 'typing') if m in sys.modules))",
                  "-S")
    assert got == "[]"


def test_help_is_as_wide_as_argparse_would_make_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from usdtpatch.cli import help_width

    for columns in ("100", "57", "5", "0", "junk"):
        monkeypatch.setenv("COLUMNS", columns)
        assert help_width() == shutil.get_terminal_size().columns - 2, columns


@pytest.mark.parametrize("first", ["import usdtpatch.rewriter.plan",
                                   "from usdtpatch.rewriter import build",
                                   "import usdtpatch.api", "pass"])
def test_the_package_attribute_rewrite_is_the_function(first: str) -> None:
    # whatever was imported first, usdtpatch.rewrite is api.rewrite (as when bound eagerly):
    # the rewriter's subpackage has another name, so importing it cannot rebind the attribute
    got = _python(f"{first}\nimport usdtpatch\nfrom usdtpatch import api, rewrite\n"
                  "import usdtpatch.rewriter.build\n"
                  "print(usdtpatch.rewrite is api.rewrite is rewrite, usdtpatch.load is api.load,"
                  " callable(usdtpatch.check))")
    assert got == "True True True"


def test_an_unknown_package_attribute_is_an_attribute_error() -> None:
    import usdtpatch

    with pytest.raises(AttributeError, match="no_such_name"):
        _ = usdtpatch.no_such_name


def test_a_mapped_load_gives_what_a_read_load_gives() -> None:
    """`list` maps its files (api.load's `mapped`), the other commands read them: the same
    probes, findings and headers."""
    for name in ("pie", "cxx-throw", "forms-mixed", "libprobes.so"):
        mapped, read = api.load(fixture(name), mapped=True), api.load(fixture(name))
        assert not isinstance(mapped.image.data, bytes), name
        assert isinstance(read.image.data, bytes), name
        assert bytes(mapped.image.data) == read.image.data, name
        assert (mapped.probes, mapped.findings, mapped.notes) == \
            (read.probes, read.findings, read.notes), name
        assert (mapped.image.sections, mapped.image.segments) == \
            (read.image.sections, read.image.segments), name


@pytest.mark.parametrize(("command", "paused"), [(["list"], True), (["check"], True),
                                                 (["show", "--probe", "a:b"], True),
                                                 (["rewrite", "--dry-run"], True),
                                                 (["plan"], False)])
def test_cycle_collection_is_paused_only_while_a_listed_command_runs(
        monkeypatch: pytest.MonkeyPatch, command: list[str], paused: bool) -> None:
    seen: list[bool] = []

    def fake(args: Any, out: Any, err: Any) -> int:
        seen.append(gc.isenabled())
        raise RuntimeError("boom")  # the collector comes back on the error path too

    real = cli.build_parser

    def parser(argv: list[str] | None = None) -> Any:
        p = real(argv)
        for action in p._subparsers._group_actions:  # type: ignore[union-attr]
            for sub in cast(dict[str, Any], action.choices).values():
                sub.set_defaults(func=fake)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    assert gc.isenabled()
    rc = cli.main([*command, str(fixture("pie"))], io.StringIO(), io.StringIO())
    assert rc == 3 and seen == [not paused] and gc.isenabled()


def test_the_sweep_binding_decodes_as_the_capstone_package() -> None:
    import capstone

    from usdtpatch.elf.image import parse_elf
    from usdtpatch.x86 import decode

    assert decode._lite(True) is not None and decode._lite(False) is not None
    for name in ("pie", "i386", "cxx-throw", "static"):
        image = parse_elf(fixture(name).read_bytes())
        for sec in image.sections:
            if sec.name not in (".text", ".rodata") or not sec.size:
                continue
            code = image.data[sec.offset : sec.offset + min(sec.size, 20000)]
            for mode64 in (True, False):
                md = capstone.Cs(capstone.CS_ARCH_X86,
                                 capstone.CS_MODE_64 if mode64 else capstone.CS_MODE_32)
                md.syntax = capstone.CS_OPT_SYNTAX_ATT
                for skip in (0, 1, 2):  # also from inside instructions, and junk (.rodata)
                    want = list(md.disasm_lite(code[skip:], sec.addr + skip))
                    assert decode._lite_rows(code[skip:], sec.addr + skip, mode64) == want
    assert decode._lite_rows(b"\x06\x90", 0x1000, True) == []  # first byte does not decode
    assert decode._lite_rows(b"", 0x1000, True) == []


def test_check_of_a_nop_file_does_not_import_the_capstone_package() -> None:
    got = _python("import io, sys\nfrom usdtpatch.cli import main\n"
                  f"main(['check', '--fail-on', 'never', {str(fixture('pie'))!r}], io.StringIO(),"
                  " io.StringIO())\nprint('capstone' in sys.modules)")
    assert got == "False"


@pytest.mark.parametrize(("command", "paused"), [(["check"], True), (["list"], True),
                                                 (["rewrite", "--dry-run"], True),
                                                 (["plan"], False)])
def test_cycle_collection_is_paused_while_a_listed_command_module_is_imported(
        monkeypatch: pytest.MonkeyPatch, command: list[str], paused: bool) -> None:
    seen: list[bool] = []
    real = cli.build_parser

    def parser(argv: list[str] | None = None) -> Any:
        seen.append(gc.isenabled())
        return real(argv)

    monkeypatch.setattr(cli, "build_parser", parser)
    assert gc.isenabled()
    cli.main([*command, str(fixture("pie"))], io.StringIO(), io.StringIO())
    assert seen == [not paused] and gc.isenabled()


@pytest.mark.parametrize("argv", [["--version", "check"], ["check", "--no-such-option"],
                                  ["check"]])
def test_the_collector_is_back_on_when_a_read_only_command_stops_at_parsing(
        argv: list[str]) -> None:
    assert gc.isenabled()
    rc = cli.main(argv, io.StringIO(), io.StringIO())
    assert gc.isenabled() and rc == (0 if argv[0] == "--version" else 2)


def test_the_check_table_does_not_import_json() -> None:
    code = ("import io, sys\nfrom usdtpatch.cli import main\n"
            "main(['check', '--fail-on', 'never', {flags}{path!r}], io.StringIO(), io.StringIO())\n"
            "print('json' in sys.modules)")
    path = str(fixture("pie"))
    assert _python(code.format(flags="", path=path)) == "False"
    assert _python(code.format(flags="'--json', ", path=path)) == "True"


def test_python_m_usdtpatch_prints_what_main_prints() -> None:
    path = str(fixture("pie"))
    res = subprocess.run([sys.executable, "-m", "usdtpatch", "check", "--fail-on", "never", path],
                         capture_output=True, text=True, cwd=ROOT, check=False, timeout=60)
    out = io.StringIO()
    assert cli.main(["check", "--fail-on", "never", path], out, io.StringIO()) == res.returncode
    assert res.stdout == out.getvalue() and res.stdout
