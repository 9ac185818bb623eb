"""An instruction capstone does not know (issue 19, item 6): `serialize` (0f 01 e8) is
decoded by its length (iced-x86, through usdtpatch.x86.relocate), so the function holding it
is analysed as usual: before, every instruction of it counted as a branch target
(`window-all-targets`) and its probe stayed on the int3 path. Bytes neither decoder knows
still make the function all-targets."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli
from usdtpatch.analysis.check import check
from usdtpatch.api import load
from usdtpatch.x86.decode import Flow, sweep


def test_serialize_is_one_instruction() -> None:
    sw = sweep(bytes.fromhex("4889f8" "0f01e8" "90" "c3"), 0x1000)
    assert sw.bad == ()
    assert [(i.address, i.size, i.text, i.flow) for i in sw.insns][1] == \
        (0x1003, 3, "serialize", Flow.NONE)


def test_bytes_no_decoder_knows_stay_bad() -> None:
    sw = sweep(bytes.fromhex("4889f8" "06" "c3"), 0x1000)  # push %es: not in 64-bit mode
    assert sw.bad


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    exe = tmp_path_factory.mktemp("serialize") / "serialize"
    subprocess.run(["gcc", "-O2", "-I", str(ROOT / "fixtures" / "src"),
                    str(ROOT / "tests" / "data" / "serialize.c"), "-o", str(exe)], check=True)
    return exe


@pytest.mark.needs_cc
def test_function_with_serialize_gets_a_window(program: Path, tmp_path: Path) -> None:
    (site,) = check(load(program)).sites
    assert site.outcome == "forward", (site.outcome, site.blocked, site.window)
    out = tmp_path / "out"
    res = run_cli("rewrite", program, "-o", out)
    assert res.rc == 0, res.err
    run = [subprocess.run([str(p)], capture_output=True, text=True, check=True).stdout
           for p in (program, out)]
    assert run[0] == run[1]


@pytest.mark.needs_cc
@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
def test_function_with_serialize_traced(program: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run_cli("rewrite", program, "-o", out).rc == 0

    def traced(path: Path) -> list[str]:
        done = subprocess.run(["bpftrace", "-e", f"usdt:{path}:serialize:site "
                               "{ printf(\"@ %ld\\n\", arg0); }", "-c", str(path)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return sorted(ln for ln in done.stdout.splitlines() if ln.startswith(("@ ", "serialize")))

    assert traced(out) == traced(program)
