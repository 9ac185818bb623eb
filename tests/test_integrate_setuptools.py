"""The Python build integrations, in a fresh venv with build isolation: pip builds
examples/setuptools (a C extension) from its sdist, and usdtpatch.integrate.setuptools.build_ext
rewrites the module through the Python API; pip builds examples/scikit-build, whose CMake finds
usdtpatch through the `cmake.root` entry point with no flag.

usdtpatch itself is built into a wheel from a copy of this tree and installed into the fresh
venv (and found by pip's isolated build environment through --find-links): the wheel must
carry the build files (CMake config, make include, sys/sdt.h) and the cmake.root entry point.
"""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from tests.test_integrate_support import (
    EXAMPLES,
    ROOT,
    digest,
    is_rewritten,
    need,
    report_of,
    run,
    sha,
    sites_not_optimized,
)

pytestmark = [pytest.mark.slow, pytest.mark.needs_cc]

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
_IGNORE_BUILT = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fresh venv with usdtpatch installed from a wheel of this tree; (venv, wheelhouse)."""
    need("gcc")
    root = tmp_path_factory.mktemp("setuptools")
    src = root / "usdtpatch-src"
    src.mkdir()
    for name in ("usdtpatch", "sdt_headers"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=_IGNORE)
    for name in ("pyproject.toml", "README.md", "LICENSE", "fixtures/bin/demo",
                 "docs/findings.md"):  # the last two: what usdtpatch/data/ links to
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    wheels = root / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, src], root)
    env = root / "venv"
    run([sys.executable, "-m", "venv", env], root)
    (wheel,) = wheels.glob("usdtpatch-*.whl")
    run([env / "bin" / "pip", "install", "-q", wheel], root)
    return env, wheels


def readme_command(folder: str, env: Path, wheels: Path, copy: Path) -> list[str | Path]:
    """examples/README.md's build command of `folder`, as written there, run in the test's
    venv: its pip, the wheelhouse the test built in place of the checkout's build/wheels
    (`make wheel`, checked below), the example's copy (and -v, for the build's log)."""
    table = (EXAMPLES / "README.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith(f"| `{folder}/` |"))
    words = row.split("|")[2].strip().strip("`").split()
    assert words[:2] == ["pip", "install"], row
    subst: dict[str, str | Path] = {"pip": env / "bin" / "pip", "build/wheels": wheels,
                                    f"examples/{folder}": copy}
    return [*[subst.get(w, w) for w in words[:2]], "-v", *[subst.get(w, w) for w in words[2:]]]


def test_readme_commands_from_a_checkout() -> None:
    """pip install examples/setuptools failed from a checkout (usdtpatch is on no package
    index): the README builds the wheel with `make wheel` and points pip at it."""
    readme = (EXAMPLES / "README.md").read_text()
    assert "make wheel" in readme
    for folder in ("setuptools", "scikit-build"):
        cmd = readme_command(folder, Path("/env"), Path("/wheels"), Path("/copy"))
        assert "--find-links" in cmd and Path("/wheels") in cmd and Path("/copy") in cmd
    dry = run(["make", "-n", "-C", ROOT, "wheel"], ROOT).stdout
    assert "pip wheel" in dry and "-w build/wheels ." in dry


def test_wheel_carries_the_build_files(venv: tuple[Path, Path]) -> None:
    env, wheels = venv
    (wheel,) = wheels.glob("usdtpatch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("usdtpatch/integrate/cmake/usdtpatchConfig.cmake",
              "usdtpatch/integrate/cmake/usdtpatchConfigVersion.cmake",
              "usdtpatch/integrate/make/usdtpatch.mk", "usdtpatch/integrate/include/sys/sdt.h",
              "usdtpatch/integrate/debhelper/dh_usdtpatch",
              "usdtpatch/integrate/debhelper/Debian/Debhelper/Sequence/usdtpatch.pm",
              "usdtpatch/integrate/rpm/macros.usdtpatch"):
        assert f in names
    dh = zipfile.ZipFile(wheel).getinfo("usdtpatch/integrate/debhelper/dh_usdtpatch")
    assert (dh.external_attr >> 16) & 0o111, "dh_usdtpatch must stay executable (dh runs it)"
    py = env / "bin" / "python"
    script = ("import json; from importlib.metadata import entry_points\n"
              "(ep,) = entry_points(group='cmake.root', name='usdtpatch')\n"
              "print(json.dumps([ep.value, ep.load().__path__[0]]))")
    value, folder = json.loads(run([py, "-c", script], env).stdout)
    assert value == "usdtpatch.integrate"
    assert (Path(folder) / "cmake" / "usdtpatchConfig.cmake").is_file()
    for flag, name in (("--cmake-dir", "usdtpatchConfig.cmake"), ("--make-include", ""),
                       ("--debhelper-dir", "dh_usdtpatch")):
        where = Path(run([env / "bin" / "usdtpatch", flag], env).stdout.strip())
        assert where.is_relative_to(env) and (where / name).is_file()
    inc = Path(run([env / "bin" / "usdtpatch", "--include-dir"], env).stdout.strip())
    assert inc.is_relative_to(env) and not inc.is_symlink()
    assert (inc / "sys" / "sdt.h").read_bytes() == \
        (ROOT / "sdt_headers" / "sys" / "sdt.h").read_bytes()


def test_installed_wheel_runs_demo_and_explain(venv: tuple[Path, Path],
                                               tmp_path: Path) -> None:
    """demo's program, the findings page (explain, SARIF's rule help) and the licence are in
    the wheel: the installed tool needs no source tree (run from an empty folder)."""
    env, wheels = venv
    (wheel,) = wheels.glob("usdtpatch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"usdtpatch/data/demo", "usdtpatch/data/findings.md"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    usdtpatch = env / "bin" / "usdtpatch"
    demo = run([usdtpatch, "demo"], cwd)
    assert "demo done: every step passed" in demo.stdout
    text = run([usdtpatch, "explain", "red-zone-live"], cwd).stdout
    assert text.startswith("red-zone-live (error):") and "- meaning:" in text
    sarif = json.loads(run([usdtpatch, "check", "--sarif", "--fail-on", "never",
                            env / "lib" / "python3.11" / "site-packages" / "usdtpatch" /
                            "data" / "demo"], cwd).stdout)
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert rules and all("- meaning:" in r["help"]["text"] for r in rules)
    assert "docs/findings.md" not in json.dumps(sarif)


def _sdist(env: Path, work: Path) -> Path:
    example = work / "probedemo"
    shutil.copytree(EXAMPLES / "setuptools", example, ignore=_IGNORE_BUILT)
    run([env / "bin" / "python", "-c",
         "from setuptools.build_meta import build_sdist; build_sdist('dist')"], example)
    (sdist,) = (example / "dist").glob("probedemo-*.tar.gz")
    return sdist


def test_pip_builds_the_extension_from_its_sdist(venv: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    env, wheels = venv
    sdist = _sdist(env, tmp_path)
    proc = run([env / "bin" / "pip", "install", "-v", "--find-links", wheels, sdist], tmp_path)
    log = proc.stdout + proc.stderr
    assert "usdtpatch: build/lib" in log
    assert "4 optimized on nop5, 0 optimized on nop10; rewritten" in log
    (module,) = (env / "lib").glob("python3*/site-packages/probedemo/_probes*.so")
    assert is_rewritten(module)
    assert sites_not_optimized(module) == []
    out = run([env / "bin" / "python", "-c",
               "import probedemo; print(probedemo.checksum(b'usdt' * 5000))"], tmp_path).stdout
    assert int(out) > 0
    # the rewrite is a function of the linked file: the original given back by `restore`,
    # rewritten again, is the installed module byte for byte (two pip builds of the sdist
    # link different files: -g records pip's random build folder)
    original, again = tmp_path / "original.so", tmp_path / "again.so"
    run([env / "bin" / "usdtpatch", "restore", module, "-o", original], tmp_path)
    assert not is_rewritten(original)
    run([env / "bin" / "usdtpatch", "post-link", original, "-o", again], tmp_path)
    assert sha(again) == sha(module)


def test_build_ext_is_idempotent_and_fails_on_findings(venv: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    env, _ = venv
    example = tmp_path / "probedemo"
    shutil.copytree(EXAMPLES / "setuptools", example, ignore=_IGNORE_BUILT)
    py = env / "bin" / "python"
    run([py, "setup.py", "-q", "build_ext"], example)
    (module,) = (example / "build").glob("lib*/probedemo/_probes*.so")
    (report,) = (example / "build").glob("temp*/usdtpatch/probedemo._probes.json")
    assert report_of(report)["changed"] is True
    assert sites_not_optimized(module) == []
    first = digest([module])
    run([py, "setup.py", "-q", "build_ext"], example)  # up to date: skipped, then left alone
    assert digest([module]) == first
    run([py, "setup.py", "-q", "build_ext", "--force"], example)  # relinked, rewritten again
    assert sha(module) == first[module.name][0]

    # told not to guard the red-zone leaf and to fail on errors: the build stops
    pyproject = example / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('redzone_guard = "auto"',
                                                         'redzone_guard = "never"')
                         .replace('fail_on = "warning"', 'fail_on = "error"'))
    proc = run([py, "setup.py", "-q", "build_ext", "--force"], example, ok=False)
    assert proc.returncode != 0
    assert "error [red-zone-live] probedemo:mix: the site is optimized" in proc.stderr
    assert "usdtpatch stopped the build of probedemo._probes" in proc.stderr
    assert not module.exists()
    # a wrong [tool.usdtpatch] is one clear error naming the file
    pyproject.write_text(pyproject.read_text().replace('redzone_guard = "never"',
                                                         'redzone_guard = "maybe"'))
    proc = run([py, "setup.py", "-q", "build_ext", "--force"], example, ok=False)
    assert proc.returncode != 0
    assert f"usdtpatch: {Path('pyproject.toml')}: [tool.usdtpatch] redzone_guard must be" \
        in proc.stderr


def test_scikit_build_core_finds_usdtpatch_with_no_flag(venv: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    need("cmake")
    env, wheels = venv
    example = tmp_path / "skb"
    shutil.copytree(EXAMPLES / "scikit-build", example, ignore=_IGNORE_BUILT)
    proc = run(readme_command("scikit-build", env, wheels, example), tmp_path)
    log = proc.stdout + proc.stderr
    code = [line for line in (example / "CMakeLists.txt").read_text().splitlines()
            if not line.lstrip().startswith("#")]
    assert not [line for line in code if "usdtpatch_DIR" in line or "PREFIX_PATH" in line]
    assert "4 optimized on nop5, 0 optimized on nop10; rewritten (4 detour)" in log
    (module,) = (env / "lib").glob("python3*/site-packages/probedemo_cmake/_probes*.so")
    assert is_rewritten(module)
    assert sites_not_optimized(module) == []
    out = run([env / "bin" / "python", "-c",
               "from probedemo_cmake import _probes; print(_probes.checksum(b'x' * 9000))"],
              tmp_path).stdout
    assert int(out) > 0


def test_the_setuptools_example_builds_with_its_readme_command(venv: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    env, wheels = venv
    example = tmp_path / "probedemo"
    shutil.copytree(EXAMPLES / "setuptools", example, ignore=_IGNORE_BUILT)
    proc = run(readme_command("setuptools", env, wheels, example), tmp_path)
    log = proc.stdout + proc.stderr
    assert "4 optimized on nop5, 0 optimized on nop10; rewritten" in log
    (module,) = (env / "lib").glob("python3*/site-packages/probedemo/_probes*.so")
    assert is_rewritten(module) and sites_not_optimized(module) == []
