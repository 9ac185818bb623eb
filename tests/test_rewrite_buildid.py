"""The rewritten file's build-id (issue 33, item 2; docs/rewrite.md, "Debugging information").

The output kept the original's build-id: with the original in perf's build-id cache (which
`perf record` fills by itself), `perf probe -x REWRITTEN` put its uprobe on the cached
original ("Failed to add events") and `perf buildid-cache --add REWRITTEN` added nothing;
and a debugger that finds separate debug information by build-id took the original's, whose
line rows place breakpoints inside rewritten windows. Now the output has a build-id of its
own, derived from the original's and the rewrite (the same rewrite gives the same id), the
original's in the marker; `--keep-build-id` keeps the original's (for a debug file of the
original by build-id, with that risk).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.marker import marker_of
from usdtpatch.elf.notes import build_id

pytestmark = [pytest.mark.needs_cc]

SRC = ROOT / "tests" / "data" / "unwind" / "btc.c"


def _id(path: Path) -> str | None:
    image = parse_elf(path.read_bytes())
    sec = image.section(".note.gnu.build-id")
    return None if sec is None else build_id(image.section_data(sec))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the program, its rewrite, its rewrite with --keep-build-id)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("buildid")
    exe = d / "btc"
    subprocess.run(["gcc", "-O2", "-g", "-Wl,--build-id", "-o", str(exe), str(SRC)],
                   check=True, timeout=120)
    rw, kept = d / "btc.rw", d / "btc.kept"
    assert run_cli("rewrite", exe, "-o", rw).rc == 0
    assert run_cli("rewrite", exe, "-o", kept, "--keep-build-id").rc == 0
    return exe, rw, kept


def test_a_new_build_id_by_default(built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    exe, rw, kept = built
    old, new = _id(exe), _id(rw)
    assert old is not None and new is not None and len(new) == len(old)
    assert new != old
    assert _id(kept) == old
    doc = marker_of(parse_elf(rw.read_bytes()))
    assert doc is not None and doc["build_id"] == old  # the original's, recorded
    again = tmp_path / "again"
    assert run_cli("rewrite", exe, "-o", again).rc == 0
    assert again.read_bytes() == rw.read_bytes()  # derived, not random
    for f in (rw, kept):
        back = tmp_path / f"{f.name}.back"
        assert run_cli("restore", f, "-o", back).rc == 0
        assert back.read_bytes() == exe.read_bytes()


def _debug_dir(exe: Path, at: Path) -> Path:
    """A debug-file-directory holding the original's separate debug file by build-id."""
    bid = _id(exe)
    assert bid is not None
    dst = at / ".build-id" / bid[:2] / f"{bid[2:]}.debug"
    dst.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(dst)], check=True,
                   timeout=60)
    return at


@pytest.mark.slow
def test_gdb_takes_the_originals_debug_file_only_with_keep_build_id(
        built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """With --keep-build-id gdb reads the original's debug file for the stripped rewrite (its
    rows are the original's: the trade-off); by default it does not take it for this file."""
    if shutil.which("gdb") is None:
        pytest.skip("needs gdb")
    exe, rw, kept = built
    dirs = _debug_dir(exe, tmp_path / "debug")

    def reads_debug_file(f: Path) -> bool:
        shipped = tmp_path / f"{f.name}.stripped"
        subprocess.run(["strip", str(f), "-o", str(shipped)], check=True, timeout=60)
        done = subprocess.run(["gdb", "-q", "-nx", "-batch", "-iex",
                               f"set debug-file-directory {dirs}", "-iex",
                               "set debuginfod enabled off", "-ex", "info line framed",
                               str(shipped)], capture_output=True, text=True, timeout=60,
                              check=False)
        return "btc.c" in done.stdout  # line rows: only the debug file has them

    assert reads_debug_file(exe)
    assert reads_debug_file(kept)
    assert not reads_debug_file(rw)


def _perf_reason() -> str | None:
    if shutil.which("perf") is None:
        return "needs perf"
    try:
        level = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    except (OSError, ValueError):
        return "perf_event_paranoid is not readable"
    if os.geteuid() != 0:
        return f"perf probe needs root (perf_event_paranoid {level})"
    return None


@pytest.mark.live
@pytest.mark.slow
def test_perf_probe_and_record_with_the_original_cached(built: tuple[Path, Path, Path],
                                                        tmp_path: Path) -> None:
    reason = _perf_reason()
    if reason is not None:
        pytest.skip(reason)
    exe, rw, _kept = built
    env = dict(os.environ, HOME=str(tmp_path))  # perf's build-id cache: $HOME/.debug

    def perf(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["perf", *map(str, argv)], capture_output=True, text=True,
                              env=env, timeout=120, check=False, cwd=tmp_path)

    rec = perf("record", "-q", "-o", tmp_path / "orig.data", exe, "4")  # caches the original
    assert rec.returncode == 0, rec.stderr
    assert (tmp_path / ".debug" / ".build-id" / str(_id(exe))[:2]).is_dir()
    assert perf("buildid-cache", "--add", rw).returncode == 0
    assert (tmp_path / ".debug" / ".build-id" / str(_id(rw))[:2]).is_dir()  # added
    added = perf("probe", "-x", rw, "-a", "sdt_btc:loop")
    try:
        assert added.returncode == 0, added.stderr
        rec = perf("record", "-q", "-o", tmp_path / "rw.data", "-e", "sdt_btc:loop", rw, "0")
        assert rec.returncode == 0, rec.stderr
        report = perf("report", "-i", tmp_path / "rw.data", "--stdio", "-q", "--sort", "sym")
        assert report.returncode == 0, report.stderr
        assert "framed" in report.stdout, report.stdout
        script = perf("script", "-i", tmp_path / "rw.data", "-F", "event")
        assert script.stdout.count("sdt_btc:loop") == 5, script.stdout  # outer(5): 5 hits
    finally:
        perf("probe", "-d", "sdt_btc:*")
