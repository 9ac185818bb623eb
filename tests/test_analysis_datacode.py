"""Data in code (issue 19, item 2): a note whose pc is a jump table placed in `.text`, a
constant island or padding reached by no path is refused, by `check` and `rewrite` alike, with
`probe-not-code`; the rewritten program runs to the original's output. Before, the island's
constant was overwritten by a nop5 (the program printed another value) and the table's site
went to the emulator, which failed it (`verification-failed`, a failure exit)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli
from usdtpatch.analysis.check import check
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "datacode.c"
NOT_CODE = {"intable": "inside the jump table", "island": "reached by no path",
            "padded": "reached by no path"}

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


@pytest.fixture(scope="module", params=["-O2", "-O0"])
def program(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("datacode") / f"datacode{request.param}"
    subprocess.run(["gcc", request.param, "-I", str(ROOT / "fixtures" / "src"), str(SOURCE),
                    "-o", str(exe)], check=True)
    return exe


def test_check_refuses_data_in_code(program: Path) -> None:
    rep = check(load(program))
    by = {s.probe.name: s for s in rep.sites}
    for name, why in NOT_CODE.items():
        s = by[name]
        assert s.blocked == "probe-not-code", (name, s.outcome, s.window)
        assert s.window is not None and why in s.window.reason
        assert any(f.code == "probe-not-code" for f in s.findings)
    assert by["plain"].outcome == "forward"


def test_rewrite_refuses_the_same_sites(program: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_cli("rewrite", program, "-o", out, "--json")
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    sites = {s["name"]: s for s in doc["files"][0]["sites"]}
    for name in NOT_CODE:
        assert sites[name]["code"] == "probe-not-code", sites[name]
    run = [subprocess.run([str(p), "3"], capture_output=True, text=True, timeout=30,
                          check=True).stdout for p in (program, out)]
    assert run[0] == run[1]


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
def test_rewritten_code_probe_traced(program: Path, tmp_path: Path) -> None:
    """The probe on code (plain, rewritten) traced: same hits, same output. (The notes on
    data are not traced: a uprobe there writes int3 into the data, in the original too.)"""
    out = tmp_path / "out"
    assert run_cli("rewrite", program, "-o", out).rc == 0

    def traced(path: Path) -> list[str]:
        done = subprocess.run(["bpftrace", "-e", f"usdt:{path}:datacode:plain "
                               "{ printf(\"@ %ld\\n\", arg0); }", "-c", f"{path} 3"],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return sorted(ln for ln in done.stdout.splitlines() if ln[:1] in "@0123456789")

    assert traced(out) == traced(program)
