"""The GNU make integration, with the real make: examples/make built with -j2.

Both programs are rewritten right after they are linked by `$(call usdtpatch_rewrite,$@)`
from the include file that `usdtpatch --make-include` names.
"""

from __future__ import annotations

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
    sites_not_optimized,
)

pytestmark = [pytest.mark.slow, pytest.mark.needs_cc]


def _make(src: Path, *args: str, ok: bool = True) -> str:
    proc = run(["make", "-j2", f"USDTPATCH={BIN / 'usdtpatch'}", *args], src, ok=ok)
    return proc.stdout + proc.stderr


def test_make_example(tmp_path: Path) -> None:
    need("make", "gcc")
    src = copy_examples(tmp_path) / "make"
    log = _make(src)
    outputs = [src / "app", src / "plain"]
    for f in outputs:
        assert is_rewritten(f)
        assert sites_not_optimized(f) == []
        assert f"usdtpatch: {f.name}: " in log
        assert report_of(src / "usdtpatch-reports" / f"{f.name}.json")["changed"] is True
    sdt = src / "plain-sdt"  # usdtpatch's header: 5-byte sites, only checked
    assert not is_rewritten(sdt) and sites_not_optimized(sdt) == []
    assert report_of(src / "usdtpatch-reports" / "plain-sdt.json")["mode"] == "check"
    outputs.append(sdt)
    first = digest(outputs)
    assert "Nothing to be done" in _make(src)
    assert digest(outputs) == first  # bytes and time stamps
    # a relink from scratch gives the same bytes
    _make(src, "clean")
    _make(src)
    assert {k: v[0] for k, v in digest(outputs).items()} == {k: v[0] for k, v in first.items()}
    assert run([src / "plain"], src).stdout == "plain: 5 words, 23 bytes\n"


def test_make_red_zone_leaf_fails_without_the_guard(tmp_path: Path) -> None:
    need("make", "gcc")
    src = copy_examples(tmp_path) / "make"
    log = _make(src, "app", "USDTPATCH_REDZONE_GUARD=never", "USDTPATCH_FAIL_ON=error", ok=False)
    assert "usdtpatch: app: error [red-zone-live] app:leaf: the site is optimized" in log
    assert "Error" in log
    assert not (src / "app").exists()  # so the next make runs the step again
    _make(src, "app")  # the guard (the default) passes
    assert sites_not_optimized(src / "app") == []
