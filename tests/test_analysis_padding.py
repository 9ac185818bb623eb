"""Bytes something names are no padding (issue 46, class 5), on tests/data/pfe.c: `probed`
ends `nop (the probe); ret` and is followed by the 14-NOP sled of `sledded`'s patchable
function entry (-fpatchable-function-entry=16,14's layout, named by
`__patchable_function_entries`); `lateral` by 14 NOPs a local symbol names.

Before, both runs of NOPs were taken for unused padding: each site's forward window ran into
them and the rewrite's jump and int3 filler overwrote them (main, which checks every sled as a
patcher would before writing it, printed "sled changed"). Now the padding after a function
ends at the first byte that a symbol of any type, a section's start, a way in of the file-wide
index (here the sled's relocation or data word), a place-relative word or a relocation's place
names (targets.first_named); no stub goes there either. Each site takes its backward window,
check predicts rewrite, and the rewritten program's sleds are intact.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, build_variant, run_cli
from tests.test_analysis_waysin import _site
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "pfe.c"
BUILDS = {"gcc-O2-pie": ("gcc", ["-O2", "-fPIE", "-pie"]),
          "clang-O0-nopie": ("clang", ["-O0", "-fno-pie", "-no-pie"]),
          "gcc-O2-static": ("gcc", ["-O2", "-static"])}

pytestmark = [pytest.mark.needs_cc]


def _program(folder: Path, variant: str) -> Path:
    cc, flags = BUILDS[variant]
    return build_variant(SOURCE, folder / variant, cc, flags)


def _run(path: Path) -> str:
    done = subprocess.run([str(path), "3"], capture_output=True, text=True, timeout=30,
                          check=True)
    return done.stdout


@pytest.mark.parametrize("variant", BUILDS)
def test_named_bytes_are_no_padding(variant: str, tmp_path: Path) -> None:
    path = _program(tmp_path, variant)
    rep = check(load(path))
    assert rep.context is not None
    for name in ("probed", "lateral"):
        s = _site(rep, name)
        assert s.function is not None
        assert rep.context.function(s.function).padding_after == 0, name
        # the window stays in the function: the sled and the labelled NOPs are left as they are
        assert s.outcome == "backward", (name, s.outcome)
    assert _mismatches(path) == []
    out = tmp_path / "out"
    res = run_cli("rewrite", path, "-o", out)
    assert res.rc == 0, res.err
    want = _run(path)
    assert want.startswith("sled ok\npad ok\n")
    assert _run(out) == want
