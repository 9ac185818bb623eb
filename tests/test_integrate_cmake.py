"""The CMake integration, with the real cmake: examples/cmake built as a user would.

`app` (systemtap's header, 1-byte sites, a red-zone leaf) is rewritten by usdtpatch_rewrite;
`plain` uses usdtpatch_use_headers (5-byte sites at build time) and usdtpatch_check. Also: the
config package found through `usdtpatch --cmake-dir`, and its argument checking.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.test_integrate_support import (
    BIN,
    copy_examples,
    digest,
    is_rewritten,
    need,
    report_of,
    run,
    sha,
    sites_not_optimized,
)
from tests.test_sdt_support import compare_notes, load_probes
from usdtpatch import api, integrate

pytestmark = [pytest.mark.slow, pytest.mark.needs_cc]


def _configure(src: Path, out: Path, *defs: str, ok: bool = True) -> str:
    proc = run(["cmake", "-S", src, "-B", out, "-G", "Ninja" if _ninja() else "Unix Makefiles",
                "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
                f"-Dusdtpatch_DIR={integrate.cmake_dir()}",
                f"-DUSDTPATCH_EXECUTABLE={BIN / 'usdtpatch'}", *defs], src, ok=ok)
    return proc.stdout + proc.stderr


def _ninja() -> bool:
    import shutil

    return shutil.which("ninja") is not None


def test_cmake_example(tmp_path: Path) -> None:
    need("cmake", "gcc")
    src = copy_examples(tmp_path) / "cmake"
    out = tmp_path / "build"
    _configure(src, out)
    commands = (out / "build.ninja").read_text() if _ninja() else ""
    assert not commands or "post-link" in commands
    log = run(["cmake", "--build", out], src).stdout
    app, plain = out / "app", out / "plain"
    assert (f"usdtpatch: {app}: 5 site(s), 5 optimized on nop5, 0 optimized on nop10; "
            "rewritten") in log
    for f in (app, plain):
        assert sites_not_optimized(f) == []
    assert is_rewritten(app) and not is_rewritten(plain)
    assert report_of(out / "usdtpatch" / "app.json")["changed"] is True
    assert report_of(out / "usdtpatch" / "plain.json")["mode"] == "check"
    first = digest([app, plain])

    # a second build changes nothing, not even a time stamp
    run(["cmake", "--build", out], src)
    assert digest([app, plain]) == first
    # relinking from scratch gives the same bytes (deterministic) and the rewritten program
    # still runs
    run(["cmake", "--build", out, "--clean-first"], src)
    assert {k: v[0] for k, v in digest([app, plain]).items()} == \
        {k: v[0] for k, v in first.items()}
    assert run([app], tmp_path).stdout.startswith("app: average=")


def test_cmake_red_zone_leaf_fails_without_the_guard(tmp_path: Path) -> None:
    need("cmake", "gcc")
    src = copy_examples(tmp_path) / "cmake"
    out = tmp_path / "build"
    _configure(src, out, "-DAPP_REDZONE_GUARD=never", "-DAPP_FAIL_ON=error")
    proc = run(["cmake", "--build", out, "--target", "app"], src, ok=False)
    assert proc.returncode != 0
    assert f"usdtpatch: {out / 'app'}: error [red-zone-live] app:leaf: the site is optimized" \
        in proc.stdout + proc.stderr
    assert not (out / "app").exists()
    assert report_of(out / "usdtpatch" / "app.json")["failed"] is True
    # the same build with the guard passes
    _configure(src, out, "-DAPP_REDZONE_GUARD=auto")
    run(["cmake", "--build", out, "--target", "app"], src)
    assert sites_not_optimized(out / "app") == []


def test_use_headers_notes_equal_systemtap_build(tmp_path: Path) -> None:
    """`plain` built with usdtpatch's header: nothing to rewrite, and its notes are those of
    the same compile command with systemtap's header, field by field."""
    need("cmake", "gcc")
    src = copy_examples(tmp_path) / "cmake"
    out = tmp_path / "build"
    _configure(src, out)
    run(["cmake", "--build", out, "--target", "plain"], src)
    plain = out / "plain"
    assert api.rewrite(plain).changed is False  # a dry run: every site is a nop5 already
    entry = next(e for e in json.loads((out / "compile_commands.json").read_text())
                 if e["file"].endswith("plain.c"))
    argv = shlex.split(entry["command"])
    ours = f"-I{integrate.include_dir()}"
    assert ours in argv, argv  # usdtpatch_use_headers put it on the include path
    obj = tmp_path / "stap.o"
    argv = [a for a in argv if a != ours]
    o = argv.index("-o")
    argv[o + 1] = str(obj)
    run(argv, Path(entry["directory"]))
    ref = tmp_path / "plain-stap"
    run(["gcc", obj, "-o", ref], tmp_path)
    theirs_ps, ours_ps = load_probes(ref), load_probes(plain)
    assert sorted(p.name for p in ours_ps.probes) == ["counted", "start", "word"]
    assert compare_notes(theirs_ps, ours_ps) == []
    assert sha(ref) != sha(plain)  # two different headers really were used


def test_config_rejects_bad_arguments(tmp_path: Path) -> None:
    need("cmake", "gcc")
    src = tmp_path / "bad"
    src.mkdir()
    (src / "main.c").write_text("int main(void) { return 0; }\n")
    cases = {
        "usdtpatch_rewrite(app REDZONE_GUARD sometimes)": "REDZONE_GUARD must be one of",
        "usdtpatch_rewrite(app FAIL_ON fatal)": "FAIL_ON must be one of",
        "usdtpatch_rewrite(app FORK_GUARD sometimes)": "FORK_GUARD must be one of",
        "usdtpatch_rewrite(app STRIP yes)": "unknown arguments: STRIP",
        "usdtpatch_check(nosuch)": "'nosuch' is not a target",
        "add_library(st STATIC main.c)\nusdtpatch_rewrite(st)": "only executables and shared",
    }
    for i, (call, message) in enumerate(cases.items()):
        (src / "CMakeLists.txt").write_text(
            "cmake_minimum_required(VERSION 3.16)\nproject(bad C)\n"
            "find_package(usdtpatch CONFIG REQUIRED)\nadd_executable(app main.c)\n"
            f"{call}\n")
        log = _configure(src, tmp_path / f"b{i}", ok=False)
        assert message in log, (call, log[-2000:])
    # a version newer than the package is refused by the version file
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(bad C)\n"
        "find_package(usdtpatch 99 CONFIG REQUIRED)\n")
    log = _configure(src, tmp_path / "v", ok=False)
    assert "considered but not accepted" in log and "version: 0.1.0" in log


def test_cmake_debug_split_after_the_rewrite(tmp_path: Path) -> None:
    """The documented order: the rewrite first, then objcopy/strip; the stripped program is
    still the rewritten one, runs, its sites are optimized, and the split debug file has the
    program's build-id."""
    need("cmake", "gcc", "objcopy", "readelf")
    src = copy_examples(tmp_path) / "cmake"
    out = tmp_path / "build"
    _configure(src, out, "-DAPP_SPLIT_DEBUG=ON", "-DCMAKE_BUILD_TYPE=RelWithDebInfo")
    run(["cmake", "--build", out, "--target", "app"], src)
    app, debug = out / "app", out / "app.debug"
    assert is_rewritten(app) and sites_not_optimized(app) == []
    assert run([app], tmp_path).stdout.startswith("app: average=")

    def build_id(f: Path) -> str:
        text = run(["readelf", "-n", f], tmp_path).stdout
        return next(line.split()[-1] for line in text.splitlines() if "Build ID" in line)

    assert build_id(app) == build_id(debug)
    sections = run(["readelf", "-SW", app], tmp_path).stdout
    assert ".gnu_debuglink" in sections and ".debug_info" not in sections
