"""Helpers of the fork-guard tests: build the pre-fork server fixture (fixtures/src/
forkserver.c), run it under counting uprobes, and report what its children did. The tests of
the helpers themselves are at the end (the parser of the server's report must reject what it
does not understand).

A run: the server hits forksrv:hit BEFORE times under a system-wide counting uprobe (one perf
event per CPU), says "ready"; the harness reads the site's bytes from /proc/PID/mem (the
parent's site must be the optimized `call`), tells it to go; it forks CHILDREN children, each
hitting the probe AFTER times. The uprobes are closed in a finally block and the server is
killed by pid if it is still running.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import live_kernel_reason
from usdtpatch.live.perf import Uprobe, open_uprobe
from usdtpatch.live.procfs import read_maps, read_mem

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "fixtures" / "src"
SDT_INCLUDE = ROOT / "sdt_headers"
TRAMPOLINE = "[uprobes-trampoline]"


def need_kernel() -> None:
    """Skip unless the optimized uprobe path can be exercised here (tests/conftest.py's one
    check; tests marked `live` get it without calling this)."""
    reason = live_kernel_reason()
    if reason is not None:
        pytest.skip(reason)


def need_cc() -> None:
    import shutil

    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed")


def cc(args: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(["gcc", *args], capture_output=True, text=True, cwd=cwd, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"gcc {' '.join(args)}\n{proc.stderr[-3000:]}")


@dataclass(frozen=True, slots=True)
class ServerReport:
    ok: int
    signaled: int
    lastsig: int


_REPORT = re.compile(r"^children ok=(\d+) signaled=(\d+) lastsig=(\d+) ns=(\d+)$")


def parse_report(line: str) -> ServerReport:
    m = _REPORT.match(line.strip())
    if m is None:
        raise ValueError(f"unexpected server output: {line!r}")
    return ServerReport(int(m[1]), int(m[2]), int(m[3]))


@dataclass(frozen=True, slots=True)
class Run:
    report: ServerReport
    hits: int  # counted by the uprobes, parent and children
    parent_site: bytes  # the site's bytes in the parent when it was ready to fork
    parent_has_trampoline: bool


def site_address(pid: int, path: Path, offset: int) -> int:
    real = os.path.realpath(path)
    for m in read_maps(pid):
        if m.path == real and m.offset <= offset < m.offset + (m.end - m.start):
            return m.start + offset - m.offset
    raise AssertionError(f"{path}:{offset:#x} is not mapped in {pid}")


def open_everywhere(path: Path, offset: int, semaphore: int = 0) -> list[Uprobe]:
    """A counting uprobe on every CPU for every process (`semaphore`: its file offset)."""
    probes: list[Uprobe] = []
    try:
        for cpu in range(os.cpu_count() or 1):
            probes.append(open_uprobe(str(path), offset, pid=-1, cpu=cpu,
                                      ref_ctr_offset=semaphore))
    except BaseException:
        for u in probes:
            u.close()
        raise
    return probes


def run_server(cmd: list[str], probe_file: Path, probe_offset: int, before: int,
               children: int, after: int, env: dict[str, str] | None = None,
               more: tuple[tuple[Path, int], ...] = ()) -> Run:
    """Run the server under counting uprobes at (probe_file, probe_offset) and the `more`
    probes; `hits` sums them all, `parent_site` is the first one's."""
    uprobes: list[Uprobe] = []
    proc: subprocess.Popen[str] | None = None
    try:
        for path, off in ((probe_file, probe_offset), *more):
            uprobes += open_everywhere(path, off)
        proc = subprocess.Popen([*cmd, str(before), str(children), str(after)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env)
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().startswith("ready ns=")
        site = b""
        for path, off in ((probe_file, probe_offset), *more):
            code = read_mem(proc.pid, site_address(proc.pid, path, off), 5)
            assert code[0] == 0xE8, f"{path}:{off:#x} not optimized before the fork: {code.hex()}"
            site = site or code
        tramp = any(m.path == TRAMPOLINE for m in read_maps(proc.pid))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, (proc.returncode, out)
        hits = sum(u.count() for u in uprobes)
        return Run(parse_report(out.strip().splitlines()[-1]), hits, site, tramp)
    finally:
        for u in uprobes:
            u.close()
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


# --- the helpers' own tests ---------------------------------------------------------------

def test_parse_report_accepts_the_servers_line() -> None:
    assert parse_report("children ok=50 signaled=0 lastsig=0 ns=7\n") == ServerReport(50, 0, 0)


@pytest.mark.parametrize("line", ["", "ready", "children ok=1 signaled=0",
                                  "children ok=1 signaled=0 lastsig=0",
                                  "children ok=x signaled=0 lastsig=0 ns=1",
                                  "children ok=1 signaled=0 lastsig=0 ns=1 extra"])
def test_parse_report_rejects_other_lines(line: str) -> None:
    with pytest.raises(ValueError, match="unexpected server output"):
        parse_report(line)
