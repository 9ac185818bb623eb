"""The library (usdtpatch.api, re-exported by the package): what the CLI is built on."""

from __future__ import annotations

import hashlib
import re
import shutil
import stat
from pathlib import Path

import pytest

import usdtpatch
from tests.helpers import ROOT, fixture
from usdtpatch import api
from usdtpatch.errors import InputError, OutputError, UnsupportedError
from usdtpatch.report.checkjson import result_json
from usdtpatch.report.rewrite import outcome_json
from usdtpatch.rewriter.plan import Action, Status


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def prog(tmp_path: Path) -> Path:
    p = tmp_path / "prog"
    shutil.copy2(fixture("demo"), p)
    return p


def test_package_exports_the_api() -> None:
    for name in usdtpatch.__all__:
        assert getattr(usdtpatch, name) is not None, name
    assert usdtpatch.rewrite is api.rewrite and usdtpatch.load is api.load
    assert (ROOT / "usdtpatch" / "py.typed").is_file()
    with pytest.raises(AttributeError):
        _ = usdtpatch.no_such_name


def test_the_api_names_are_written_once() -> None:
    """api.__all__ is the list: the package face repeats it (to bind the names without
    importing api), its docstring and the README name every function of it."""
    import inspect

    errors = {"ElfFormatError", "InputError", "OutputError", "UnsupportedError",
              "UsdtpatchError"}
    assert sorted(usdtpatch.__all__) == sorted({*api.__all__, *errors, "__version__"})
    functions = [n for n in api.__all__ if inspect.isfunction(getattr(api, n))]
    assert len(functions) >= 8
    readme_row = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
                      if ln.startswith("| `usdtpatch/api.py` |"))
    for text in (usdtpatch.__doc__ or "", readme_row):
        named = set(re.findall(r"`(\w+)`", text))
        assert set(functions) <= named, sorted(set(functions) - named)


def test_load_and_check() -> None:
    ps = api.load(fixture("demo"))
    assert [p.probe_id for p in ps.probes][:2] == ["demo:parse", "demo:reply"]
    res = api.check(fixture("redzone-leaf"))
    assert res.path.endswith("redzone-leaf")
    assert any(f.code == "red-zone-rewrite" for f in res.findings)
    assert result_json(res)["path"] == res.path  # the check document's entry (report/)
    with pytest.raises(InputError):
        api.load("/nonexistent/file")


def test_rewrite_writes_a_verified_output_keeping_the_mode(prog: Path, tmp_path: Path) -> None:
    prog.chmod(0o750)
    before = _sha(prog)
    out = api.rewrite(prog, tmp_path / "out")
    assert out.changed and not out.failed and out.verified and out.note is None
    assert all(s.action is Action.DETOUR and s.status is Status.REWRITTEN for s in out.sites)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o750
    assert _sha(prog) == before
    assert outcome_json(out)["counts"] == {"detour": 4}


def test_dry_run_writes_nothing(prog: Path) -> None:
    out = api.rewrite(prog)
    assert out.changed and out.output is None
    assert sorted(p.name for p in prog.parent.iterdir()) == ["prog"]


def test_already_rewritten_is_an_outcome(prog: Path, tmp_path: Path) -> None:
    api.rewrite(prog, tmp_path / "once")
    again = api.rewrite(tmp_path / "once", tmp_path / "twice")
    assert again.already_rewritten and not again.changed and not again.failed
    assert _sha(tmp_path / "twice") == _sha(tmp_path / "once")


def test_in_place_and_refusals(prog: Path) -> None:
    with pytest.raises(OutputError, match="in-place"):
        api.rewrite(prog, prog)
    with pytest.raises(ValueError):
        api.rewrite(prog, prog.parent / "x", in_place=True)
    out = api.rewrite(prog, in_place=True)
    assert out.output == str(prog) and out.changed
    with pytest.raises(UnsupportedError):
        api.rewrite(fixture("i386"))


def test_options_take_enums_or_strings(prog: Path) -> None:
    a = api.rewrite(prog, form=api.Form.COMBO5, redzone_guard=api.Guard.NEVER, verify=False)
    b = api.rewrite(prog, form="combo5", redzone_guard="never", verify=False)
    assert a.form is b.form is api.Form.COMBO5 and not a.verified
    assert [s.new_pc for s in a.sites] == [s.new_pc for s in b.sites]
    with pytest.raises(ValueError, match="form='nop7'"):
        api.rewrite(prog, form="nop7")


def test_a_failed_detour_makes_the_outcome_failed(prog: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Verification is on by default, with a new verifier object per call (the emulator's:
    the prover, which would prove these detours, is off)."""
    import usdtpatch.verification.equivalence as eq

    made: list[object] = []

    class Rejecting:
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.append(self)

        def __call__(self, *args: object) -> str:
            return "rejected by the test"

    monkeypatch.setattr(eq, "DetourVerifier", Rejecting)
    out = api.rewrite(prog, tmp_path / "out", prove=False)
    assert out.failed and not out.changed
    assert {s.code for s in out.sites} == {"verification-failed"}
    assert all(s.status is Status.FAILED for s in out.sites)
    api.rewrite(prog, prove=False)
    assert len(made) == 2  # one per call, none kept between calls


def test_restore_round_trip(prog: Path, tmp_path: Path) -> None:
    api.rewrite(prog, tmp_path / "rw")
    back = api.restore(tmp_path / "rw", tmp_path / "back")
    assert back.size == prog.stat().st_size
    assert _sha(tmp_path / "back") == _sha(prog)
    assert api.restore(tmp_path / "rw").data == prog.read_bytes()
    with pytest.raises(UnsupportedError, match="not rewritten"):
        api.restore(prog)


def test_plan_and_verify() -> None:
    plan = api.plan(fixture("nop5"))
    assert plan.sites and plan.load_base_source == "default"
    rep = api.verify(fixture("nop5"), plan=plan)
    assert rep.ok and rep.verdicts
    assert api.verify(fixture("nop5")).ok


def test_dtrace_header(tmp_path: Path) -> None:
    d = tmp_path / "p.d"
    d.write_text("provider app { probe start(int, char *); };\n")
    text = api.dtrace_header(d)
    assert "APP_START(" in text and "APP_START_ENABLED" in text
    with pytest.raises(InputError):
        api.dtrace_header(tmp_path / "missing.d")


def test_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README.md has no Python example under '## Python API'"
    shutil.copy2(fixture("demo"), tmp_path / "prog")
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "4 probes: demo:parse" in printed and "changed: True failed: False" in printed
    assert _sha(tmp_path / "prog.orig") == _sha(tmp_path / "prog")


def test_cli_builds_no_namespace_outside_argument_parsing() -> None:
    """Commands call the library, never each other through hand-built argparse Namespaces."""
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "usdtpatch").rglob("*.py")
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if "Namespace(" in line]
    assert offenders == []


def test_output_is_validated_before_it_is_renamed(prog: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite whose bytes fail the output check leaves nothing behind and says why."""
    from usdtpatch.elf import validate

    seen: list[int] = []

    def reject(data: bytes, original: object = None) -> None:
        seen.append(len(data))
        raise OutputError("output check: rejected by the test")

    monkeypatch.setattr(validate, "validate_output", reject)
    with pytest.raises(OutputError, match="rejected by the test"):
        api.rewrite(prog, tmp_path / "out")
    assert seen and not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prog"]


def test_dry_run_plans_without_building(prog: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from usdtpatch.rewriter import build

    def no_build(plan: object, keep_build_id: bool = False) -> None:
        raise AssertionError("a dry run must not build the file")

    monkeypatch.setattr(build, "build_rewrite", no_build)
    from tests.helpers import run_cli

    res = run_cli("rewrite", "--dry-run", "--json", prog)
    assert res.rc == 0, res.err
    assert '"action": "detour"' in res.out
    with pytest.raises(AssertionError, match="must not build"):
        api.rewrite(prog, prog.parent / "out")


# --- what the CLI and the build integration take from the face (issue 35, item 4) ---------

def test_rewrite_bytes_gives_what_rewrite_writes_and_writes_it_when_told(
        prog: Path, tmp_path: Path) -> None:
    api.rewrite(prog, tmp_path / "a", kernel="6.18", verify=False)
    r = api.rewrite_bytes(prog, tmp_path / "b", kernel="6.18", verify=False)
    assert not (tmp_path / "b").exists() and r.outcome.changed and r.data is not None
    assert r.data == (tmp_path / "a").read_bytes()
    assert api.check_bytes(tmp_path / "b", r.data).findings == \
        api.check(tmp_path / "a").findings
    r.write()
    assert _sha(tmp_path / "b") == _sha(tmp_path / "a")
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == stat.S_IMODE(prog.stat().st_mode)
    assert api.marked(api.load(tmp_path / "b", mapped=True))
    assert not api.marked(api.load(prog))
    with pytest.raises(ValueError, match="nothing to write"):
        api.rewrite_bytes(prog, kernel="6.18", verify=False).write()


def test_rewrite_files_answers_each_file_in_order_in_workers_too(tmp_path: Path) -> None:
    names = ["demo", "pie", "noprobes", "forms-mixed"]
    todo: list[tuple[Path, Path | None]] = [(fixture(n), None) for n in names]
    todo.insert(2, (tmp_path / "missing", None))
    for jobs in (1, 2):
        got = list(api.rewrite_files(todo, jobs=jobs, kernel="6.18", verify=False))
        assert [a.path for a in got] == [str(p) for p, _ in todo]
        assert isinstance(got[2].error, InputError) and got[2].outcome is None
        for a, (p, _) in zip(got, todo, strict=True):
            if a.outcome is not None:
                alone = api.rewrite(p, kernel="6.18", verify=False)
                assert outcome_json(a.outcome) == outcome_json(alone), (jobs, p)
                assert a.size_before == p.stat().st_size


def test_plan_with_a_protocol_is_the_protocols_sequences() -> None:
    proto = api.read_protocol(ROOT / "usdtpatch" / "sequences" / "protocols" / "nop5.toml")
    plan = api.plan(fixture("demo"), protocol=proto)
    assert plan.protocol == proto.model and plan.sites
    assert api.verify(fixture("demo"), plan=plan).ok
    bad = ROOT / "fixtures" / "src" / "probes.d"  # not a protocol file
    with pytest.raises(api.ProtocolError):
        api.read_protocol(bad)


@pytest.mark.parametrize("call", ["load", "check", "rewrite_plan", "rewrite", "restore", "plan",
                                  "verify", "check_bytes", "rewrite_bytes"])
def test_every_error_about_an_input_names_the_file(tmp_path: Path, call: str) -> None:
    """The library's errors are read without their call (a log, a list of errors): each
    names the input it is about, e.g. a Python file given to check, or an empty file."""
    for name, data in (("api.py", (ROOT / "usdtpatch" / "api.py").read_bytes()),
                       ("empty", b"")):
        path = tmp_path / name
        path.write_bytes(data)
        fn = getattr(api, call)
        args: tuple[object, ...] = (path,)
        if call == "check_bytes":
            args = (path, data)
        with pytest.raises(api.UsdtpatchError) as caught:
            fn(*args)
        assert str(caught.value).startswith(f"{path}: not an ELF file: "), str(caught.value)
        assert str(caught.value).count(str(path)) == 1
    assert str(caught.value) == f"{path}: not an ELF file: an empty file"


def test_a_file_the_message_names_already_is_named_once(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        api.check(tmp_path / "missing")
    assert str(caught.value) == f"{tmp_path / 'missing'}: no such file"
