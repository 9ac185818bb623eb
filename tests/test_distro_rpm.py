"""The RPM macros (usdtpatch/integrate/rpm/macros.usdtpatch, `usdtpatch --rpm-macros`,
docs/distributions.md): tests/data/distro/hello-usdt.spec built with `rpmbuild -bb --load`.
The packaged binary (rpm2cpio | cpio) has 5-byte sites and runs as the build without the
rewrite does; the -debuginfo package (extracted after the rewrite) resolves in gdb; two builds
give the same files and the same .rpm files; `--without usdtpatch` and `_usdtpatch_disable`
opt out."""

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
DATA = ROOT / "tests" / "data" / "distro"
BINARY = "usr/bin/hello-usdt"

pytestmark = [pytest.mark.slow, pytest.mark.needs_cc]


@dataclass(frozen=True)
class Build:
    top: Path
    log: str

    def unpacked(self, name: str) -> Path:
        """The files of RPMS/x86_64/NAME-1.0-1.x86_64.rpm (rpm2cpio | cpio)."""
        dest = self.top / f"x-{name}"
        if not dest.exists():
            dest.mkdir()
            rpm = self.top / "RPMS" / "x86_64" / f"{name}-1.0-1.x86_64.rpm"
            payload = subprocess.run(["rpm2cpio", rpm], capture_output=True, check=True).stdout
            subprocess.run(["cpio", "-idm", "--quiet"], input=payload, cwd=dest, check=True)
        return dest


def rpmbuild(top: Path, *flags: str) -> Build:
    """rpmbuild -bb of the spec in `top` (its _topdir), usdtpatch's macros loaded."""
    (top / "SOURCES").mkdir(parents=True, exist_ok=True)
    for name in ("hello.c", "Makefile"):
        shutil.copy2(DATA / "hello-usdt" / name, top / "SOURCES" / name)
    macros = top / "macros.usdtpatch"
    macros.write_text(run_cli("--rpm-macros").out)
    env = build_env()
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["SOURCE_DATE_EPOCH"] = "1796126400"
    # rpm's own reproducibility settings: the header's build time and host, file mtimes
    same = ["--define", "use_source_date_epoch_as_buildtime 1",
            "--define", "clamp_mtime_to_source_date_epoch 1",
            "--define", "_buildhost reproducible"]
    proc = subprocess.run(["rpmbuild", "-bb", "--nodeps", "--load", macros,
                           "--define", f"_topdir {top}", *same, *flags,
                           DATA / "hello-usdt.spec"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"rpmbuild exited {proc.returncode}\n{log[-4000:]}")
    return Build(top, log)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    missing = [t for t in ("rpmbuild", "rpm2cpio", "cpio", "gcc", "make") if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (Debian's rpm, cpio)")
    if system_sdt_h() is None:
        pytest.skip("systemtap's sys/sdt.h is not installed (Debian systemtap-sdt-dev)")
    top = tmp_path_factory.mktemp("rpm")
    one = rpmbuild(top / "one")
    # the second build in the same _topdir (the debug information names the build folder)
    for name in ("hello-usdt", "hello-usdt-debuginfo"):
        one.unpacked(name)
    kept = top / "one-files"
    shutil.move(top / "one", kept)
    two = rpmbuild(top / "one")
    return {"one": Build(kept, one.log), "two": two,
            "off": rpmbuild(top / "off", "--without", "usdtpatch"),
            "disabled": rpmbuild(top / "disabled", "--define", "_usdtpatch_disable 1"),
            "combo10": rpmbuild(top / "combo10", "--define",
                                "_usdtpatch_options --kernel nop10-series")}


def forms(path: Path) -> set[SiteForm]:
    return {p.site.form for p in api.load(path).probes}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_packaged_binary_has_5_byte_sites_and_runs(builds: dict[str, Build]) -> None:
    new = builds["one"].unpacked("hello-usdt") / BINARY
    old = builds["off"].unpacked("hello-usdt") / BINARY
    assert forms(new) == {SiteForm.NOP5}
    assert sites_not_optimized(new) == []
    assert forms(old) == {SiteForm.NOP1}
    ran = [subprocess.run([p, "25"], capture_output=True, text=True, timeout=30, check=False)
           for p in (old, new)]
    assert ran[0].returncode == ran[1].returncode == 0
    assert ran[0].stdout == ran[1].stdout and "hello-usdt: total" in ran[0].stdout


def test_rewrite_runs_before_debuginfo_and_strip(builds: dict[str, Build]) -> None:
    log = builds["one"].log
    at = [log.index(s) for s in ("usdtpatch rewrite --tree", "/usr/bin/find-debuginfo",
                                 "/usr/lib/rpm/brp-strip ")]
    assert at == sorted(at)
    assert "hello-usdt: rewritten, 3 site(s) (3 detour), form nop5" in log


def test_debuginfo_resolves_in_gdb(builds: dict[str, Build]) -> None:
    if not shutil.which("gdb"):
        pytest.skip("not installed: gdb")
    binary = builds["one"].unpacked("hello-usdt") / BINARY
    debug = builds["one"].unpacked("hello-usdt-debuginfo") / "usr" / "lib" / "debug"
    assert forms(binary) == {SiteForm.NOP5}  # the debug package of the rewritten binary

    def info_line(debug_dir: Path) -> str:
        return subprocess.run(
            ["gdb", "-nx", "-batch", "-ex", f"set debug-file-directory {debug_dir}",
             "-ex", f"file {binary}", "-ex", "info line main", "-ex", "info line step"],
            capture_output=True, text=True, timeout=60, check=False).stdout

    with_debug = info_line(debug)
    assert "hello.c\" starts at address" in with_debug and "<step" in with_debug, with_debug
    assert "hello.c" not in info_line(debug.parent / "nowhere")


def test_two_builds_give_the_same_files(builds: dict[str, Build]) -> None:
    for which in ("one", "two"):
        assert forms(builds[which].unpacked("hello-usdt") / BINARY) == {SiteForm.NOP5}
    for name in ("hello-usdt", "hello-usdt-debuginfo"):
        a, b = builds["one"].unpacked(name), builds["two"].unpacked(name)
        files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
        assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
        assert files
        for f in files:
            assert sha(a / f) == sha(b / f), f
        rpms = [t / "RPMS" / "x86_64" / f"{name}-1.0-1.x86_64.rpm"
                for t in (builds["one"].top, builds["two"].top)]
        assert sha(rpms[0]) == sha(rpms[1]), name


def test_opting_out_and_options(builds: dict[str, Build]) -> None:
    for name in ("off", "disabled"):
        assert "rewrite --tree" not in builds[name].log
        assert forms(builds[name].unpacked("hello-usdt") / BINARY) == {SiteForm.NOP1}
    assert "--kernel nop10-series" in builds["combo10"].log
    assert forms(builds["combo10"].unpacked("hello-usdt") / BINARY) == {SiteForm.COMBO10}


def test_rpm_macros_prints_the_shipped_file() -> None:
    res = run_cli("--rpm-macros")
    assert res.rc == 0 and res.out == integrate.rpm_macros().read_text()
    assert "%__spec_install_post" in res.out and "_without_usdtpatch" in res.out
