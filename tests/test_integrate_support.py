"""Helpers shared by the build-integration tests (tests/test_integrate_*.py), and tests of them.

The example projects under examples/ are copied into the test's temporary folder and built
there with the real tools; `usdtpatch` is the one of the Python running the tests (its bin/
first on PATH), so the build runs the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import fixture, run_cli
from tests.test_sdt_support import system_sdt_h

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent


def need(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    if system_sdt_h() is None:
        pytest.skip("systemtap's sys/sdt.h is not installed (Debian systemtap-sdt-dev)")


def build_env() -> dict[str, str]:
    """The environment of a build: this Python's usdtpatch first on PATH, no user flags."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CFLAGS", "LDFLAGS", "CPPFLAGS", "MAKEFLAGS", "USDTPATCH_DEBUG")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def copy_examples(tmp: Path) -> Path:
    """A fresh copy of examples/ (the examples refer to ../src)."""
    dest = tmp / "examples"
    shutil.copytree(EXAMPLES, dest, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "dist", "*.egg-info"))
    return dest


def run(cmd: Sequence[str | os.PathLike[str]], cwd: Path, ok: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one build command; with `ok`, a failure fails the test with its log."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or build_env(),
                          capture_output=True, text=True, check=False, timeout=300)
    if ok and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def digest(paths: list[Path]) -> dict[str, tuple[str, int]]:
    """sha256 and mtime (ns) of each file, to prove a second build changed nothing."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in paths}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sites_not_optimized(path: Path) -> list[str]:
    """`usdtpatch check` on a built file: the sites the nop5 generation would not optimize,
    and the failure of the command itself (exit status, findings at warning or worse)."""
    res = run_cli("check", "--json", "--fail-on", "warning", path)
    doc = json.loads(res.out)
    bad = [f"{s['provider']}:{s['name']}: {s['kernels']['nop5']['outcome']}"
           for f in doc["files"] for s in f["sites"]
           if s["kernels"]["nop5"]["outcome"] != "optimized"]
    if not doc["files"] or not doc["files"][0]["sites"]:
        bad.append("no probe sites at all")
    if res.rc != 0:
        bad.append(f"check exited {res.rc}: {res.err.strip()}")
    return bad


def is_rewritten(path: Path) -> bool:
    """The file carries usdtpatch's restore marker."""
    from usdtpatch.elf.image import parse_elf

    return parse_elf(path.read_bytes()).section(".note.usdtpatch") is not None


def report_of(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    assert doc["schema"] == "usdtpatch/build-report"
    assert path.with_suffix(".html").is_file()
    return doc


# --- the helpers must reject what is wrong -------------------------------------------------


def test_check_not_optimized_rejects_one_byte_sites() -> None:
    bad = sites_not_optimized(fixture("redzone-leaf"))
    assert bad and any("redzone:leaf: int3" in b for b in bad)
    assert sites_not_optimized(fixture("nop5")) == []
    assert "no probe sites at all" in sites_not_optimized(fixture("noprobes"))


def test_is_rewritten_tells_the_marker() -> None:
    assert not is_rewritten(fixture("redzone-leaf"))


def test_digest_sees_a_touch(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    before = digest([f])
    os.utime(f, ns=(1, 1))
    assert digest([f]) != before
