"""Every command, fed bad or foreign input, ends with a clear line and an exit status, never a
traceback or an internal error; an output that cannot be written leaves nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch.cli.common import EXIT_INTERNAL, EXIT_UNUSABLE

COMMANDS = {
    "check": ["check"],
    "show": ["show", "--probe", "basic:compute"],
    "rewrite": ["rewrite", "--dry-run", "--no-verify"],
    "plan": ["plan"],
    "verify": ["verify"],
}
FOREIGN = ["aarch64", "i386", "bigendian", "odd-note", "bad-args", "noprobes"]


def _inputs(tmp: Path) -> list[Path]:
    data = fixture("pie").read_bytes()
    paths = []
    for cut in (0, 3, 17, 63, 64, 200, 1000, len(data) // 2, len(data) - 100):
        p = tmp / f"cut{cut}"
        p.write_bytes(data[:cut])
        paths.append(p)
    junk = tmp / "junk"
    junk.write_bytes(os.urandom(3000))
    paths.append(junk)
    return paths + [fixture(n) for n in FOREIGN]


@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_no_traceback_on_bad_or_foreign_input(command: str, tmp_path: Path) -> None:
    for path in _inputs(tmp_path):
        res = run_cli(*COMMANDS[command], path)
        assert res.rc != EXIT_INTERNAL, f"{command} {path.name}: {res.err}"
        assert "Traceback" not in res.err and "Traceback" not in res.out
        if res.rc == EXIT_UNUSABLE:
            lines = [ln for ln in res.err.splitlines() if ln.strip()]
            assert lines and all(ln.startswith("usdtpatch:") for ln in lines), \
                f"{command} {path.name}: {res.err!r}"


def test_rewrite_to_an_unwritable_place_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "missing-dir" / "out"
    res = run_cli("rewrite", "--no-verify", fixture("pie"), "-o", target)
    assert res.rc == EXIT_UNUSABLE and len(res.err.strip().splitlines()) == 1
    assert not target.exists() and not target.parent.exists()
    blocker = tmp_path / "a-file"  # a path through a regular file: even root cannot write it
    blocker.write_bytes(b"x")
    res = run_cli("rewrite", "--no-verify", fixture("pie"), "-o", blocker / "out")
    assert res.rc == EXIT_UNUSABLE and len(res.err.strip().splitlines()) == 1
    assert blocker.read_bytes() == b"x" and sorted(p.name for p in tmp_path.iterdir()) == \
        ["a-file"]


def test_rewrite_refuses_foreign_architectures(tmp_path: Path) -> None:
    for name in ("aarch64", "i386", "bigendian"):
        out = tmp_path / name
        res = run_cli("rewrite", "--no-verify", fixture(name), "-o", out)
        assert res.rc == EXIT_UNUSABLE, res.err
        assert "x86-64" in res.err and not out.exists()


def test_restore_refuses_a_file_that_was_not_rewritten(tmp_path: Path) -> None:
    res = run_cli("restore", fixture("pie"), "-o", tmp_path / "x")
    assert res.rc == EXIT_UNUSABLE and "not rewritten" in res.err
    assert not (tmp_path / "x").exists()


def test_restore_detects_a_file_changed_after_the_rewrite(tmp_path: Path) -> None:
    out = tmp_path / "rw"
    assert run_cli("rewrite", "--no-verify", fixture("pie"), "-o", out).rc == 0
    data = bytearray(out.read_bytes())
    data[0x1100] ^= 0xFF  # a byte of the original code, after the rewrite
    out.write_bytes(bytes(data))
    res = run_cli("restore", out, "-o", tmp_path / "back")
    assert res.rc == EXIT_UNUSABLE and "sha256" in res.err
    assert not (tmp_path / "back").exists()
