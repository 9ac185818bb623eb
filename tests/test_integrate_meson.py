"""The Meson integration, with the real meson and ninja: examples/meson.

Meson has no post-link hook: each program is linked as `<name>-raw` and a custom_target writes
the rewritten copy (`usdtpatch rewrite @INPUT@ -o @OUTPUT@`, or `usdtpatch post-link` with a
report and a failure level); the install-script alternative rewrites the installed copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_integrate_support import (
    copy_examples,
    digest,
    is_rewritten,
    need,
    report_of,
    run,
    sha,
    sites_not_optimized,
)

pytestmark = [pytest.mark.slow, pytest.mark.needs_cc]


def _setup(tmp: Path, *options: str) -> tuple[Path, Path]:
    src = copy_examples(tmp) / "meson"
    out = tmp / "build"
    run(["meson", "setup", *options, out, src], src)
    return src, out


def test_meson_example(tmp_path: Path) -> None:
    need("meson", "ninja", "gcc")
    src, out = _setup(tmp_path)
    log = run(["meson", "compile", "-C", out], src).stdout
    app, plain = out / "app", out / "plain"
    assert "usdtpatch: app: 5 site(s), 5 optimized on nop5, 0 optimized on nop10; rewritten" in log
    for f in (app, plain):
        assert is_rewritten(f)
        assert sites_not_optimized(f) == []
    assert not is_rewritten(out / "app-raw")  # the linker's output stays as it was
    # built with usdtpatch's header (--include-dir): 5-byte sites, nothing rewritten
    assert not is_rewritten(out / "plain-sdt") and sites_not_optimized(out / "plain-sdt") == []
    assert report_of(out / "app.usdtpatch.json")["failed"] is False
    first = digest([app, plain])
    assert "no work to do" in run(["meson", "compile", "-C", out], src).stdout
    assert digest([app, plain]) == first
    # relinking from scratch gives the same bytes
    run(["ninja", "-C", out, "-t", "clean"], src)
    run(["meson", "compile", "-C", out], src)
    assert {k: v[0] for k, v in digest([app, plain]).items()} == \
        {k: v[0] for k, v in first.items()}

    # install --strip: the custom targets' outputs as built (not stripped), plain-installed
    # stripped by meson and then rewritten by the install script
    dest = tmp_path / "dest"
    env_log = run(["meson", "install", "-C", out, "--strip", "--destdir", dest], src).stdout
    bindir = next(dest.rglob("bin"))
    assert sha(bindir / "app") == sha(app)
    assert sha(bindir / "plain") == sha(plain)
    assert is_rewritten(bindir / "plain-installed"), env_log
    assert not is_rewritten(out / "plain-installed")
    assert sites_not_optimized(bindir / "plain-installed") == []
    assert run([bindir / "plain-installed"], tmp_path).stdout == "plain: 5 words, 23 bytes\n"


def test_meson_red_zone_leaf_fails_without_the_guard(tmp_path: Path) -> None:
    need("meson", "ninja", "gcc")
    src, out = _setup(tmp_path, "-Dredzone_guard=never", "-Dfail_on=error")
    proc = run(["meson", "compile", "-C", out, "app"], src, ok=False)
    assert proc.returncode != 0
    assert "usdtpatch: " in proc.stdout and \
        "error [red-zone-live] app:leaf: the site is optimized" in proc.stdout
    assert not (out / "app").exists()
    run(["meson", "configure", out, "-Dredzone_guard=auto"], src)
    run(["meson", "compile", "-C", out, "app"], src)
    assert sites_not_optimized(out / "app") == []
