"""Shared test helpers: where the fixtures are, the real binaries, running the CLI in-process."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from usdtpatch.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "bin"

# Real binaries of this kind of machine with USDT probes (read only, never modified).
REAL_BINARIES = {
    "python3.11": Path("/usr/bin/python3.11"),
    "libstdc++": Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
    "libjvm": Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"),
}


def fixture_files() -> list[Path]:
    """Every committed fixture binary (regular files under fixtures/bin)."""
    if not FIXTURES.is_dir():
        return []
    return sorted(p for p in FIXTURES.iterdir() if p.is_file() and not p.name.startswith("."))


def fixture(name: str) -> Path:
    return FIXTURES / name


@dataclass
class CliResult:
    rc: int
    out: str
    err: str


def run_cli(*argv: str | os.PathLike[str]) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    rc = main([str(a) for a in argv], out=out, err=err)
    return CliResult(rc, out.getvalue(), err.getvalue())


@dataclass(frozen=True)
class ReadelfNote:
    provider: str
    name: str
    pc: int
    base: int
    semaphore: int
    args: str


_NOTE_RE = re.compile(
    r"^\s*stapsdt\s+0x[0-9a-f]+\s+NT_STAPSDT.*?\n"
    r"\s+Provider: (?P<provider>.*)\n"
    r"\s+Name: (?P<name>.*)\n"
    r"\s+Location: (?P<pc>0x[0-9a-f]+), Base: (?P<base>0x[0-9a-f]+), "
    r"Semaphore: (?P<sem>0x[0-9a-f]+)\n"
    r"(?:\s+Arguments: (?P<args>.*)\n)?",
    re.MULTILINE,
)


def readelf_sdt_notes(path: Path) -> list[ReadelfNote]:
    """binutils `readelf -n` as an independent oracle for the SDT notes of a file."""
    exe = shutil.which("readelf")
    assert exe is not None
    text = subprocess.run([exe, "-n", str(path)], capture_output=True, text=True,
                          check=False).stdout
    out: list[ReadelfNote] = []
    for m in _NOTE_RE.finditer(text):
        out.append(ReadelfNote(m["provider"], m["name"], int(m["pc"], 16), int(m["base"], 16),
                               int(m["sem"], 16), (m["args"] or "").rstrip()))
    return out
