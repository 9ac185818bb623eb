"""Programs built with usdtpatch's <sys/sdt.h> fork while traced (Linux 6.18): with the fork
guard (the default with nop5 sites) every child survives and its own hits are counted; built
with -DUSDTPATCH_FORK_GUARD=0 the children die with SIGSEGV at the site (the hazard the guard
exists for). Also the build-level properties of the guard: one handler per linked object, a
table entry per site, no dynamic symbol, no relocation, the header's embedded code equal to
the committed bytes.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.test_fork_support import SDT_INCLUDE, SRC, cc, need_cc, need_kernel, run_server
from usdtpatch.api import load

pytestmark = [pytest.mark.live, pytest.mark.needs_cc]

BEFORE, AFTER = 10, 100


def _build(tmp: Path, name: str, *flags: str) -> Path:
    out = tmp / name
    cc(["-O2", f"-I{SDT_INCLUDE}", *flags, str(SRC / "forkserver.c"), "-o", str(out)])
    return out


def _offset(binary: Path) -> int:
    ps = load(str(binary))
    (probe,) = ps.probes
    assert probe.offset is not None
    return probe.offset


@pytest.mark.parametrize(("guard", "children"), [("1", 1), ("1", 50), ("0", 1), ("0", 50)],
                         ids=["guarded-1", "guarded-50", "unguarded-1", "unguarded-50"])
def test_header_built_child_survives(tmp_path: Path, guard: str, children: int) -> None:
    need_kernel()
    need_cc()
    binary = _build(tmp_path, "srv", f"-DUSDTPATCH_FORK_GUARD={guard}")
    run = run_server([str(binary)], binary, _offset(binary), BEFORE, children, AFTER)
    assert run.parent_site[0] == 0xE8, run.parent_site.hex()  # optimized before the fork
    assert run.parent_has_trampoline
    if guard == "1":
        assert run.report.ok == children and run.report.signaled == 0
        assert run.hits == BEFORE + children * AFTER
    else:
        assert run.report.signaled == children and run.report.lastsig == signal.SIGSEGV
        assert run.hits == BEFORE  # no child hit is counted: each died at its first


@pytest.mark.parametrize("guard", ["1", "0"], ids=["guarded", "unguarded"])
def test_header_built_library_and_executable(tmp_path: Path, guard: str) -> None:
    """Two objects, each with its own table and handler: sites in libforksrv.so and in the
    executable, both optimized before the fork, fork called from the executable."""
    need_kernel()
    need_cc()
    flag = f"-DUSDTPATCH_FORK_GUARD={guard}"
    lib = tmp_path / "libforksrv.so"
    cc(["-O2", "-fPIC", "-shared", f"-I{SDT_INCLUDE}", flag, str(SRC / "forkserver-lib.c"),
        "-o", str(lib)])
    exe = tmp_path / "srv"
    cc(["-O2", f"-I{SDT_INCLUDE}", flag, "-DUSE_LIB", "-DEXE_PROBE", str(SRC / "forkserver.c"),
        f"-L{tmp_path}", "-lforksrv", "-Wl,-rpath,$ORIGIN", "-o", str(exe)])
    run = run_server([str(exe)], lib, _offset(lib), BEFORE, 5, AFTER,
                     more=((exe, _offset(exe)),))
    if guard == "1":
        assert run.report.ok == 5
        assert run.hits == 2 * (BEFORE + 5 * AFTER)
    else:
        assert run.report.signaled == 5 and run.report.lastsig == signal.SIGSEGV
        assert run.hits == 2 * BEFORE


def test_header_built_cxx_lto(tmp_path: Path) -> None:
    """C++ and link-time optimization (every translation unit's handler in one LTO partition:
    `.ifndef` keeps it to one definition)."""
    need_kernel()
    need_cc()
    import shutil

    if not shutil.which("g++"):
        pytest.skip("g++ is not installed")
    src = tmp_path / "srv.cc"
    src.write_text((SRC / "forkserver.c").read_text())
    other = tmp_path / "other.cc"
    other.write_text("#include <sys/sdt.h>\nvoid other_probe(long x) { STAP_PROBE1(o, p, x); }\n")
    exe = tmp_path / "srv"
    proc = subprocess.run(
        ["g++", "-O2", "-flto", f"-I{SDT_INCLUDE}", str(src), str(other), "-o", str(exe)],
        capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    ps = load(str(exe))
    hit = next(p for p in ps.probes if p.name == "hit")
    assert hit.offset is not None
    run = run_server([str(exe)], exe, hit.offset, BEFORE, 3, AFTER)
    assert run.report.ok == 3 and run.hits == BEFORE + 3 * AFTER


@pytest.mark.parametrize(("compiler", "flags"), [
    ("gcc", ["-fno-pie", "-no-pie"]), ("gcc", ["-static"]), ("clang", ["-fPIE", "-pie"]),
    ("clang", ["-O0", "-fno-pie", "-no-pie"]),
], ids=["gcc-nopie", "gcc-static", "clang-pie", "clang-O0-nopie"])
def test_header_built_shapes(tmp_path: Path, compiler: str, flags: list[str]) -> None:
    need_kernel()
    import shutil

    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    exe = tmp_path / "srv"
    proc = subprocess.run([compiler, "-O2", f"-I{SDT_INCLUDE}", *flags, str(SRC / "forkserver.c"),
                           "-o", str(exe)], capture_output=True, text=True, check=False)
    if proc.returncode != 0 and "-static" in flags:
        pytest.skip(f"no static libc here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    run = run_server([str(exe)], exe, _offset(exe), BEFORE, 5, AFTER)
    assert run.report.ok == 5 and run.hits == BEFORE + 5 * AFTER
