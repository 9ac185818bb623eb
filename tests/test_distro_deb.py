"""The debhelper addon (usdtpatch/integrate/debhelper/, docs/distributions.md): a real source
package (tests/data/distro/hello-usdt, `dh $@ --with usdtpatch`) built with
`dpkg-buildpackage -us -uc -b`. The packaged binary has 5-byte sites and runs as the build
without usdtpatch does; its -dbgsym package's debug file resolves in gdb for the rewritten
binary; two builds (in different folders) give identical .debs; DEB_BUILD_OPTIONS=nousdtpatch
leaves the sites as they are; DEB_USDTPATCH_OPTIONS reaches the rewrite; the build log says
what was rewritten."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.test_integrate_support import build_env, sites_not_optimized
from tests.test_sdt_support import system_sdt_h
from usdtpatch import api, integrate
from usdtpatch.x86.nops import SiteForm

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "data" / "distro" / "hello-usdt"
BINARY = "usr/bin/hello-usdt"

pytestmark = [pytest.mark.slow, pytest.mark.needs_cc]


def deb_env(**extra: str) -> dict[str, str]:
    """A build's environment: dh_usdtpatch and its addon found through --debhelper-dir, and
    `usdtpatch` the code under test."""
    env = build_env()
    where = str(integrate.debhelper_dir())
    env["PATH"] = f"{where}{os.pathsep}{env['PATH']}"
    env["PERL5LIB"] = where
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("DEB_BUILD_OPTIONS", None)
    env.pop("DEB_USDTPATCH_OPTIONS", None)
    env.update(extra)
    return env


@dataclass(frozen=True)
class Build:
    folder: Path  # the source tree (its parent holds the .debs)
    log: str

    def deb(self, name: str) -> Path:
        return self.folder.parent / f"{name}_1.0_amd64.deb"

    def unpacked(self, name: str) -> Path:
        dest = self.folder.parent / f"x-{name}"
        if not dest.exists():
            subprocess.run(["dpkg-deb", "-x", self.deb(name), dest], check=True)
        return dest


def build(where: Path, env: dict[str, str], sequence_dependency: bool = False) -> Build:
    """`sequence_dependency`: the addon named by a Build-Depends on dh-sequence-usdtpatch, not
    by --with (no package provides it here: dpkg-buildpackage -d leaves the check out)."""
    src = where / "hello-usdt"
    shutil.copytree(SOURCE, src)
    flags = []
    if sequence_dependency:
        control, rules = src / "debian" / "control", src / "debian" / "rules"
        control.write_text(control.read_text().replace(
            "systemtap-sdt-dev\n", "systemtap-sdt-dev, dh-sequence-usdtpatch\n"))
        rules.write_text(rules.read_text().replace("dh $@ --with usdtpatch", "dh $@"))
        assert "dh-sequence-usdtpatch" in control.read_text()
        flags = ["-d"]
    proc = subprocess.run(["dpkg-buildpackage", "-us", "-uc", "-b", *flags], cwd=src,
                          env=deb_env(**env), capture_output=True, text=True, timeout=600,
                          check=False)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"dpkg-buildpackage exited {proc.returncode}\n{log[-4000:]}")
    return Build(src, log)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    missing = [t for t in ("dpkg-buildpackage", "dh", "gcc", "make") if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (Debian's debhelper, dpkg-dev)")
    if system_sdt_h() is None:
        pytest.skip("systemtap's sys/sdt.h is not installed (Debian systemtap-sdt-dev)")
    done = {name: build(tmp_path_factory.mktemp(name), env) for name, env in (
        ("one", {}), ("two", {}), ("off", {"DEB_BUILD_OPTIONS": "nousdtpatch"}))}
    done["sequence"] = build(tmp_path_factory.mktemp("sequence"), {}, sequence_dependency=True)
    return done


def forms(path: Path) -> set[SiteForm]:
    return {p.site.form for p in api.load(path).probes}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_packaged_binary_has_5_byte_sites_and_runs(builds: dict[str, Build]) -> None:
    new = builds["one"].unpacked("hello-usdt") / BINARY
    old = builds["off"].unpacked("hello-usdt") / BINARY
    assert forms(new) == {SiteForm.NOP5}
    assert sites_not_optimized(new) == []
    assert forms(old) == {SiteForm.NOP1}  # nousdtpatch: the sites as the compiler left them
    ran = [subprocess.run([p, "25"], capture_output=True, text=True, timeout=30, check=False)
           for p in (old, new)]
    assert ran[0].returncode == ran[1].returncode == 0
    assert ran[0].stdout == ran[1].stdout and "hello-usdt: total" in ran[0].stdout


def test_build_log_says_what_was_rewritten(builds: dict[str, Build]) -> None:
    log = builds["one"].log
    assert "usdtpatch rewrite --tree debian/hello-usdt -j" in log
    assert "debian/hello-usdt/usr/bin/hello-usdt: rewritten, 3 site(s) (3 detour), form nop5" \
        in log
    # after the install step, before dh_dwz and dh_strip
    ran = [line.split()[-1] if line.startswith("   debian/rules ") else line.split()[0]
           for line in log.splitlines() if line.startswith(("   dh_", "   debian/rules "))]
    order = [ran.index(c) for c in ("override_dh_auto_install", "dh_usdtpatch", "dh_dwz",
                                    "dh_strip")]
    assert order == sorted(order), ran
    assert "nousdtpatch" in builds["off"].log and "rewrite --tree" not in builds["off"].log


def test_build_dependency_on_dh_sequence_usdtpatch_runs_it(builds: dict[str, Build]) -> None:
    assert "   dh_usdtpatch" in builds["sequence"].log
    assert forms(builds["sequence"].unpacked("hello-usdt") / BINARY) == {SiteForm.NOP5}


def test_dbgsym_resolves_in_gdb_for_the_rewritten_binary(builds: dict[str, Build]) -> None:
    if not shutil.which("gdb"):
        pytest.skip("not installed: gdb")
    binary = builds["one"].unpacked("hello-usdt") / BINARY
    debug = builds["one"].unpacked("hello-usdt-dbgsym") / "usr" / "lib" / "debug"
    assert forms(binary) == {SiteForm.NOP5}  # the dbgsym of the rewritten binary

    def info_line(debug_dir: Path) -> str:
        return subprocess.run(
            ["gdb", "-nx", "-batch", "-ex", f"set debug-file-directory {debug_dir}",
             "-ex", f"file {binary}", "-ex", "info line main", "-ex", "info line step"],
            capture_output=True, text=True, timeout=60, check=False).stdout

    with_debug = info_line(debug)
    assert 'of "./hello.c" starts at address' in with_debug, with_debug
    assert "<step" in with_debug
    # the binary itself carries no debug information: what resolved came from the dbgsym
    assert "hello.c" not in info_line(debug.parent / "nowhere")


def test_two_builds_give_identical_debs(builds: dict[str, Build]) -> None:
    for name in ("hello-usdt", "hello-usdt-dbgsym"):
        assert sha(builds["one"].deb(name)) == sha(builds["two"].deb(name)), name
    assert sha(builds["one"].deb("hello-usdt")) != sha(builds["off"].deb("hello-usdt"))


def test_options_variable_reaches_the_rewrite(builds: dict[str, Build]) -> None:
    """dh_usdtpatch run again in the nousdtpatch build's tree, with DEB_USDTPATCH_OPTIONS and
    options after --: the form named is the one written."""
    src = builds["off"].folder
    binary = src / "debian" / "hello-usdt" / BINARY
    proc = subprocess.run(["dh_usdtpatch", "--", "--redzone-guard", "never"], cwd=src,
                          env=deb_env(DEB_USDTPATCH_OPTIONS="--kernel nop10-series"),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--kernel nop10-series --redzone-guard never" in proc.stdout
    assert forms(binary) == {SiteForm.COMBO10}


def test_debhelper_dir_holds_the_command_and_the_addon() -> None:
    res = run_cli("--debhelper-dir")
    assert res.rc == 0
    where = Path(res.out.strip())
    assert where == integrate.debhelper_dir()
    assert os.access(where / "dh_usdtpatch", os.X_OK)
    assert (where / "Debian" / "Debhelper" / "Sequence" / "usdtpatch.pm").is_file()
    assert run_cli("--debhelper-dir", "--cmake-dir").rc == 2  # one at a time
