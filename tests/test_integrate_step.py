"""`usdtpatch post-link` (usdtpatch.integrate.step), the path options, [tool.usdtpatch] parsing.

On committed fixtures, without a compiler: the step every build integration runs must be
deterministic, idempotent, write its report, fail on findings with the finding's line, and
never leave a half-done or failed file behind.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.helpers import disable_prover, fixture, run_cli
from tests.test_integrate_support import (
    digest,
    is_rewritten,
    report_of,
    sha,
    sites_not_optimized,
)
from usdtpatch import __version__, integrate
from usdtpatch.integrate.setuptools import read_options
from usdtpatch.integrate.step import StepOptions, run_step

ROOT = Path(__file__).resolve().parent.parent


def _copy(tmp: Path, name: str = "redzone-leaf") -> Path:
    dest = tmp / name
    shutil.copy2(fixture(name), dest)
    return dest


def test_rewrite_in_place_then_nothing_changes(tmp_path: Path) -> None:
    app = _copy(tmp_path)
    report = tmp_path / "reports" / "app.json"
    res = run_cli("post-link", app, "--report", report, "--fail-on", "warning")
    assert res.rc == 0, res.err
    assert is_rewritten(app)
    assert sites_not_optimized(app) == []
    doc = report_of(report)
    assert doc["failed"] is False and doc["changed"] is True
    assert "rewritten (1 detour); form nop5, red-zone guard auto" in res.out  # what was used
    before = digest([app, report])
    again = run_cli("post-link", app, "--report", report, "--fail-on", "warning")
    assert again.rc == 0, again.err
    assert "already rewritten, left as it is" in again.out
    assert digest([app])["redzone-leaf"] == before["redzone-leaf"]  # bytes and mtime
    assert report_of(report)["changed"] is False


def test_deterministic_in_place_and_to_output(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = _copy(tmp_path / "a"), _copy(tmp_path / "b")
    out = tmp_path / "out"
    assert run_cli("post-link", a).rc == 0
    assert run_cli("post-link", b).rc == 0
    assert run_cli("post-link", fixture("redzone-leaf"), "-o", out).rc == 0
    assert sha(a) == sha(b) == sha(out)
    assert out.stat().st_mode & 0o111  # the input's mode


def test_fails_on_the_red_zone_hazard_and_removes_the_file(tmp_path: Path) -> None:
    app = _copy(tmp_path)
    report = tmp_path / "app.json"
    res = run_cli("post-link", app, "--redzone-guard", "never", "--fail-on", "error",
                  "--report", report)
    assert res.rc == 1
    line = next(x for x in res.err.splitlines() if "[red-zone-live]" in x)
    assert line.startswith(f"usdtpatch: {app}: error [red-zone-live] redzone:leaf: ")
    assert not app.exists()  # the next build must run the step again
    doc = report_of(report)
    assert doc["failed"] is True
    assert [f["code"] for f in doc["findings"]] == ["red-zone-live"]
    # the guard (the default) passes
    app = _copy(tmp_path)
    assert run_cli("post-link", app, "--fail-on", "error").rc == 0


def test_header_route_failure_names_the_header_guard(tmp_path: Path) -> None:
    """An unguarded nop5 site in a red-zone leaf, as usdtpatch's sys/sdt.h builds it with
    -DUSDTPATCH_REDZONE_GUARD=0 (fixtures/bin/redzone-leaf-nop5, built with the fixtures'
    own nop5 macro), checked by the step: the failing line ends with the hint, and the hint
    (line and JSON) names the header's guard macro as well as -mno-red-zone and the rewrite."""
    app = _copy(tmp_path, "redzone-leaf-nop5")
    report = tmp_path / "app.json"
    res = run_cli("post-link", "--check-only", app, "--fail-on", "error", "--report", report)
    assert res.rc == 1
    line = next(x for x in res.err.splitlines() if "[red-zone-live]" in x)
    hint = report_of(report)["findings"][0]["hint"]
    assert line.endswith(f" (hint: {hint})")
    for what in ("USDTPATCH_REDZONE_GUARD", "-mno-red-zone", "rewrite"):
        assert what in hint
    # warnings keep their one short line
    res = run_cli("post-link", "--check-only", _copy(tmp_path, "redzone-leaf"))
    assert all("(hint: " not in x for x in res.err.splitlines() if " warning [" in x)


def test_keep_on_failure_and_output_on_failure(tmp_path: Path) -> None:
    app = _copy(tmp_path)
    original = sha(app)
    res = run_cli("post-link", app, "--redzone-guard", "never", "--keep-on-failure")
    assert res.rc == 1 and app.exists() and sha(app) == original
    out = tmp_path / "out"
    assert run_cli("post-link", app, "-o", out, "--redzone-guard", "never").rc == 1
    assert not out.exists() and sha(app) == original
    assert [p.name for p in tmp_path.iterdir()] == ["redzone-leaf"]  # no temporary left


def test_check_only(tmp_path: Path) -> None:
    app = _copy(tmp_path)
    original = sha(app)
    res = run_cli("post-link", "--check-only", app, "--fail-on", "warning", "--keep-on-failure")
    assert res.rc == 1
    assert "warning [red-zone-rewrite] redzone:leaf:" in res.err
    ok = run_cli("post-link", "--check-only", app, "--fail-on", "error")
    assert ok.rc == 0 and sha(app) == original
    assert not is_rewritten(app)


def test_a_failing_check_keeps_its_input(tmp_path: Path) -> None:
    """A check never deletes or changes a file: `--check-only` that fails (here on a warning,
    without --keep-on-failure) leaves FILE byte for byte, its mtime too, and says nothing
    about removing it; so does run_step in check mode."""
    app = _copy(tmp_path)
    before = digest([app])
    res = run_cli("post-link", "--check-only", app, "--fail-on", "warning")
    assert res.rc == 1
    assert app.exists() and digest([app]) == before
    assert "removed" not in res.err
    step = run_step(str(app), options=StepOptions(mode="check", fail_on="warning"))
    assert step.failed and digest([app]) == before
    assert not any("removed" in line for line in step.lines)


def test_unusable_input_is_one_line_and_kept(tmp_path: Path) -> None:
    bad = tmp_path / "notelf"
    bad.write_bytes(b"#!/bin/sh\necho hi\n")
    res = run_cli("post-link", bad, "--report", tmp_path / "r.json")
    assert res.rc == 2
    assert res.err.count("\n") == 1 and str(bad) in res.err and "Traceback" not in res.err
    assert bad.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert not (tmp_path / "r.json").exists()
    app = _copy(tmp_path)
    same = run_cli("post-link", app, "-o", app)
    assert same.rc == 2 and "is the input" in same.err
    assert run_cli("post-link", tmp_path / "missing").rc == 2


def test_step_options_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="redzone_guard"):
        StepOptions(redzone_guard="sometimes")
    with pytest.raises(ValueError, match="fail_on"):
        StepOptions(fail_on="fatal")
    with pytest.raises(ValueError, match="fork_guard"):
        StepOptions(fork_guard="maybe")


def test_run_step_returns_lines_and_report(tmp_path: Path) -> None:
    app = _copy(tmp_path)
    res = run_step(str(app), None, StepOptions(), tmp_path / "r.json")
    assert res.changed and not res.failed
    assert res.report["rewrite"]["counts"] == {"detour": 1}
    assert json.loads((tmp_path / "r.json").read_text())["output"] == str(app)


# --- where build systems find usdtpatch's files --------------------------------------------


def test_path_options() -> None:
    cmake = run_cli("--cmake-dir")
    assert cmake.rc == 0
    assert (Path(cmake.out.strip()) / "usdtpatchConfig.cmake").is_file()
    assert Path(cmake.out.strip()) == integrate.cmake_dir()
    inc = Path(run_cli("--include-dir").out.strip())
    assert (inc / "sys" / "sdt.h").read_bytes() == \
        (ROOT / "sdt_headers" / "sys" / "sdt.h").read_bytes()
    mk = Path(run_cli("--make-include").out.strip())
    assert "usdtpatch_rewrite =" in mk.read_text()
    assert run_cli("--cmake-dir", "--include-dir").rc == 2  # one at a time


def test_cmake_version_file_matches_the_package() -> None:
    text = (integrate.cmake_dir() / "usdtpatchConfigVersion.cmake").read_text()
    m = re.search(r'set\(PACKAGE_VERSION "([^"]+)"\)', text)
    assert m is not None and m.group(1) == __version__


def test_the_metadata_names_no_address_the_project_does_not_have() -> None:
    """Issue 47, item 8: the project has no public home yet, so the package metadata names
    none (no invented URL) and the README, the wheel's long description, says so; an
    address added to one must be added to the other."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    readme = (ROOT / "README.md").read_text()
    urls = project.get("urls", {})
    if not urls:
        assert "no public home" in readme
        assert not re.search(r"https?://", (ROOT / "pyproject.toml").read_text())
    else:
        assert all(u in readme for u in urls.values()), urls


def test_entry_point_and_package_data_declared() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["cmake.root"]["usdtpatch"] == "usdtpatch.integrate"
    data = project["tool"]["setuptools"]["package-data"]["usdtpatch.integrate"]
    for pattern in data:
        assert list(integrate.HERE.glob(pattern)), pattern


# --- [tool.usdtpatch] ------------------------------------------------------------------------


def test_read_options(tmp_path: Path) -> None:
    p = tmp_path / "pyproject.toml"
    assert read_options(p) == StepOptions()  # no file: the defaults
    p.write_text('[project]\nname = "x"\n')
    assert read_options(p) == StepOptions()
    p.write_text('[tool.usdtpatch]\nform = "combo5"\nredzone_guard = "always"\n'
                 'fail-on = "warning"\nmode = "check"\nverify = false\nfork_guard = "never"\n')
    assert read_options(p) == StepOptions(mode="check", form="combo5", redzone_guard="always",
                                          fail_on="warning", verify=False, fork_guard="never")


@pytest.mark.parametrize(("text", "message"), [
    ('[tool.usdtpatch]\nstrip = true\n', "has no key 'strip'"),
    ('[tool.usdtpatch]\nredzone-guard = "sometimes"\n', "redzone_guard must be one of"),
    ('[tool.usdtpatch]\nguard = "never"\n', "no key 'guard' (the red-zone guard's key is "
                                             "redzone_guard)"),
    ('[tool.usdtpatch]\nfork-guard = "sometimes"\n', "fork_guard must be one of"),
    ('[tool.usdtpatch]\nfail_on = 2\n', "fail_on has the wrong type"),
    ('[tool.usdtpatch]\nverify = "yes"\n', "verify has the wrong type"),
    ('[tool.usdtpatch\n', "not valid TOML"),
    ('[tool]\nusdtpatch = 3\n', "must be a table"),
])
def test_read_options_rejects(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "pyproject.toml"
    p.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as exc:
        read_options(p)
    assert str(p) in str(exc.value)


FOREIGN = ["aarch64", "i386", "bigendian", "odd-note", "bad-args", "noprobes", "stripped"]


def test_no_traceback_on_bad_or_foreign_input(tmp_path: Path) -> None:
    data = fixture("pie").read_bytes()
    inputs = []
    for cut in (0, 17, 64, 1000, len(data) // 2):
        p = tmp_path / f"cut{cut}"
        p.write_bytes(data[:cut])
        inputs.append(p)
    inputs += [_copy(tmp_path, name) for name in FOREIGN]
    for path in inputs:
        before = path.read_bytes()
        res = run_cli("post-link", path, "--no-verify", "--fail-on", "never")
        assert res.rc in (0, 2), f"{path.name}: {res.rc} {res.err}"
        assert "Traceback" not in res.err + res.out
        if res.rc == 2:
            lines = [ln for ln in res.err.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith(f"usdtpatch: {path}"), res.err
            assert path.read_bytes() == before  # unusable: kept as it was
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_unwritable_output_or_report_leaves_nothing(tmp_path: Path) -> None:
    app = _copy(tmp_path)
    original = sha(app)
    res = run_cli("post-link", app, "-o", tmp_path / "missing-dir" / "out")
    assert res.rc == 2 and len(res.err.strip().splitlines()) == 1
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"x")
    res = run_cli("post-link", app, "--report", blocker / "r.json")
    assert res.rc == 2 and len(res.err.strip().splitlines()) == 1, res.err
    assert sha(app) == original  # not rewritten: the step stopped before the rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "redzone-leaf"]


def test_a_site_that_fails_verification_fails_the_step(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A detour the emulator rejects leaves its site as it was; the step reports the site as
    an error and fails at the default level (here a verifier that rejects every detour)."""
    from usdtpatch.verification import equivalence

    class Rejects:
        def __call__(self, *args: object, **kwargs: object) -> str:
            return "registers differ after the window (test)"

    monkeypatch.setattr(equivalence, "DetourVerifier", Rejects)
    disable_prover(monkeypatch)  # else the prover accepts the detour without the emulator
    app = _copy(tmp_path)
    original = sha(app)
    res = run_cli("post-link", app, "--keep-on-failure")
    assert res.rc == 1
    line = next(x for x in res.err.splitlines() if "registers differ" in x)
    assert line.startswith(f"usdtpatch: {app}: error [") and "redzone:leaf:" in line
    assert sha(app) == original
