"""`usdtpatch demo`: every step through the library; the copies stay only with --out."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.helpers import fixture, run_cli


def test_demo_with_out_keeps_the_copies(tmp_path: Path) -> None:
    res = run_cli("demo", "--out", tmp_path)
    assert res.rc == 0, res.err
    assert "run both:" in res.out
    rewritten, restored = tmp_path / "demo.rewritten", tmp_path / "demo.restored"
    assert rewritten.is_file() and restored.is_file()
    assert hashlib.sha256(restored.read_bytes()).digest() == \
        hashlib.sha256(fixture("demo").read_bytes()).digest()


def test_demo_in_a_temporary_folder_points_at_nothing() -> None:
    res = run_cli("demo")
    assert res.rc == 0, res.err
    assert "run both:" not in res.out  # the temporary folder is gone when the demo ends
    # the files it named are gone with the folder: the last line says so, and how to keep them
    import re

    named = set(re.findall(r"(/\S*usdtpatch-demo-[^/\s]+)/demo\.re", res.out))
    assert len(named) == 1
    folder = named.pop()
    assert not Path(folder).exists()
    last = res.out.strip().splitlines()[-1]
    assert last.startswith(f"{folder} was a temporary folder: it is removed now") and \
        "--out DIR" in last
