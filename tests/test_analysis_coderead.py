"""Code read as data is named (issue 46, class 6), on tests/data/coderead.c: a hook detector
compares the first byte after hooked's probe with its original (`cmpb $0x48, X(%rip)`), a
checksum loads the 8 bytes at summed's start (`mov summed(%rip), %rax`), which reach into
summed's window.

Before, nothing said so: the documented assumption `code-not-read` held silently, and the
rewritten program's detector and checksum gave other answers. Now each such site carries
`code-read-as-data` naming the instruction that reads, the address and the window; `plain`,
whose bytes nothing reads, has none. The window is still used (a warning): the rewritten
program differs exactly in what those instructions read, as the finding says.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, build_variant, run_cli
from tests.test_analysis_waysin import _site, _symbol
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "coderead.c"
BUILDS = {"gcc-O2-pie": ("gcc", ["-O2", "-fPIE", "-pie"]),
          "clang-O0-nopie": ("clang", ["-O0", "-fno-pie", "-no-pie"]),
          "gcc-O2-static": ("gcc", ["-O2", "-static"])}

pytestmark = [pytest.mark.needs_cc]


def _program(folder: Path, variant: str) -> Path:
    cc, flags = BUILDS[variant]
    return build_variant(SOURCE, folder / variant, cc, flags)


def _run(path: Path) -> list[str]:
    return subprocess.run([str(path), "2"], capture_output=True, text=True, timeout=30,
                          check=True).stdout.splitlines()


@pytest.mark.parametrize("variant", BUILDS)
def test_code_read_as_data_is_named(variant: str, tmp_path: Path) -> None:
    path = _program(tmp_path, variant)
    rep = check(load(path))
    for name, reader in (("hooked", "detector"), ("summed", "checksum")):
        s = _site(rep, name)
        assert s.outcome == "forward", (name, s.outcome)
        said = [f.message for f in s.findings if f.code == "code-read-as-data"]
        assert len(said) == 1, (name, s.findings)
        lo, hi = _symbol(path, reader)
        m = re.match(r"(0x[0-9a-f]+) \(.*\) reads the code at (0x[0-9a-f]+)", said[0])
        assert m and lo <= int(m.group(1), 16) < hi, said[0]
    assert not [f for f in _site(rep, "plain").findings if f.code == "code-read-as-data"]
    assert _mismatches(path) == []
    out = tmp_path / "out"
    assert run_cli("rewrite", path, "-o", out).rc == 0
    want, got = _run(path), _run(out)
    # the probes' functions run alike; what reads their code does not (as the finding says)
    assert got[:2] == want[:2]
    assert want[2].startswith("detector 1 ") and got[2].startswith("detector 0 ")
    assert want[2].split()[3] != got[2].split()[3]  # the checksum
