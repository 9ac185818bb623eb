"""Shared test helpers: where the fixtures are, the real binaries, running the CLI in-process."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from usdtpatch.cli import main
from usdtpatch.kernelfacts import generation

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "bin"

# Real binaries of this kind of machine with USDT probes (read only, never modified).
REAL_BINARIES = {
    "python3.11": Path("/usr/bin/python3.11"),
    "libstdc++": Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
    "libjvm": Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"),
}


# Debian packages the tests read as data, unpacked by `make test-data` (never installed, see the
# Makefile): build/cache/PACKAGE/root is the `dpkg -x` tree, build/cache/PACKAGE/version its
# version.
DEB_CACHE = ROOT / "build" / "cache"
PYTHON_STDLIB = Path("/usr/lib/python3.11")


# Python source that evaluates to this process's peak resident memory in KiB. Not
# getrusage's ru_maxrss: Linux carries that across execve, so a child spawned by a large
# process (a pytest worker holding a gigabyte) reports its parent's peak as its own.
# VmHWM belongs to the process's current address space only.
PEAK_RSS_KIB = ("int(next(line.split()[1] for line in open('/proc/self/status')"
                " if line.startswith('VmHWM:')))")


def deb_data(package: str) -> tuple[Path, str] | None:
    """(the unpacked tree, its version) of a data package fetched by `make test-data`."""
    d = DEB_CACHE / package
    try:
        return d / "root", (d / "version").read_text().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class CPythonTests:
    path: Path  # put on PYTHONPATH: its `test` package is the whole suite
    origin: str  # where the test modules come from, with their version
    matches: bool  # the suite's version is the installed interpreter's


def cpython_tests(tmp: Path) -> CPythonTests | None:
    """CPython 3.11's whole test suite as a folder for PYTHONPATH; None when it is not here.

    Debian splits the package: `test/__init__.py`, `test/support` and `test/libregrtest` are in
    libpython3.11-stdlib, the test modules in libpython3.11-testsuite. When the testsuite is
    installed, the stdlib's own folder is whole. Else the fetched modules (`make test-data`)
    and the stdlib's half are joined under `tmp` with symbolic links (the machine's files are
    only read)."""
    installed = PYTHON_STDLIB / "test"
    if (installed / "test_json").is_dir():  # the installed suite is pinned to the interpreter
        return CPythonTests(PYTHON_STDLIB, "the installed libpython3.11-testsuite", True)
    fetched = deb_data("libpython3.11-testsuite")
    if fetched is None or not installed.is_dir():
        return None
    root, version = fetched
    suite = root / "usr" / "lib" / "python3.11" / "test"
    if not suite.is_dir():
        return None
    joined = tmp / "cpython-tests"
    (joined / "test").mkdir(parents=True)
    for half in (installed, suite):
        for entry in half.iterdir():
            link = joined / "test" / entry.name
            if entry.name != "__pycache__" and not link.exists():
                link.symlink_to(entry)
    interpreter = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "python3.11"],
                                 capture_output=True, text=True, check=False).stdout.strip()
    return CPythonTests(joined, f"libpython3.11-testsuite {version} from {DEB_CACHE} "
                                f"(python3.11 is {interpreter or 'of unknown version'})",
                        version == interpreter)


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


def build_programs(folder: Path, source: str, builds: Mapping[str, tuple[str, Sequence[str]]],
                   name: str = "prog.c") -> dict[str, Path]:
    """`source` (C, written to folder/name) compiled once per build: {build name: (compiler,
    flags)} -> {build name: the program}; a build whose compiler is not installed is left
    out. A compile error fails the test with the compiler's message."""
    src = folder / name
    src.write_text(source)
    out: dict[str, Path] = {}
    for build, (cc, flags) in builds.items():
        if shutil.which(cc) is None:
            continue
        done = subprocess.run([cc, *flags, "-o", str(folder / build), str(src)],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{cc} {' '.join(flags)}: {done.stderr[-3000:]}"
        out[build] = folder / build
    return out


def build_variant(source: Path, exe: Path, cc: str, flags: Sequence[str]) -> Path:
    """The C program `source` built once into `exe` with `cc` and `flags` (no debug
    information, fixtures/src on the include path); the test skips when `cc` is not
    installed, and a compile error fails it with the compiler's message."""
    if shutil.which(cc) is None:
        pytest.skip(f"needs {cc}")
    if not exe.exists():
        done = subprocess.run([cc, *flags, "-g0", "-I", str(ROOT / "fixtures" / "src"),
                               str(source), "-o", str(exe)], capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
    return exe


def bpftrace_lines(path: Path, timeout: float = 90) -> list[str]:
    """What bpftrace prints while it runs `path` (-c) with every probe of the file attached:
    a line "@ provider:name ARGS" per hit, with up to 6 arguments (bpftrace's x86-64 limit);
    probes with rip-relative symbol arguments are left out (bpftrace 0.17 cannot read them:
    "deref ident is not handled yet"). The comparison of an original with its rewrite."""
    parts = []
    seen = set()
    for n in readelf_sdt_notes(path):
        if (n.provider, n.name) in seen or "(%rip)" in n.args:
            continue
        seen.add((n.provider, n.name))
        k = min(6, len(n.args.split()))
        fmt = " ".join(["%ld"] * k)
        args = "".join(f", arg{i}" for i in range(k))
        parts.append(f'usdt:{path}:{n.provider}:{n.name} '
                     f'{{ printf("@ {n.provider}:{n.name} {fmt}\\n"{args}); }}')
    done = subprocess.run(["bpftrace", "-e", " ".join(parts), "-c", str(path)],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env=dict(os.environ, LD_LIBRARY_PATH=str(path.parent)))
    assert done.returncode == 0, done.stderr[-2000:]
    return [ln for ln in done.stdout.splitlines() if ln.startswith("@ ")]


def bpftrace_original_and_rewritten(name: str, tmp: Path, rewrite: Callable[[Path, Path], object]
                                    ) -> tuple[list[str], list[str]]:
    """bpftrace_lines of fixture `name` copied to tmp/orig/NAME, and of its rewrite made by
    `rewrite(original, output)` into tmp/new/NAME (the same file name: the same probe paths
    but for the folder)."""
    orig, out = tmp / "orig" / name, tmp / "new" / name
    orig.parent.mkdir()
    out.parent.mkdir()
    shutil.copy2(fixture(name), orig)
    rewrite(orig, out)
    return bpftrace_lines(orig), bpftrace_lines(out)


def disable_prover(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every detour unprovable, so that a rewrite verifies it in the emulator (for the
    tests of the emulator's path: a rejecting verifier, a dying worker, a refusing machine)."""
    from usdtpatch.prove.prover import NOT_PROVABLE, Proof, Prover

    monkeypatch.setattr(Prover, "prove",
                        lambda self, *a, **k: Proof(NOT_PROVABLE, "disabled by the test"))


# The kernel generations the tests name (usdtpatch.kernelfacts.GENERATIONS: the code reads
# rows, never names one; a test states a row's facts)
NONE_GEN = generation("none")
NOP5_GEN = generation("nop5")
NOP10_GEN = generation("nop10")
