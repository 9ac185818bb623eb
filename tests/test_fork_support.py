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

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import live_kernel_reason, runtime_address, started
from tests.test_sdt_support import run_cc
from usdtpatch.live.perf import Uprobe, open_uprobe
from usdtpatch.live.procfs import read_maps, read_mem
from usdtpatch.sequences.trampoline import TRAMPOLINE_NAME

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "fixtures" / "src"
SDT_INCLUDE = ROOT / "sdt_headers"


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
    """gcc with `args`; a failure raises BuildError with the command and gcc's message."""
    run_cc(["gcc", *args], cwd)


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


@contextlib.contextmanager
def counting(sites: Sequence[tuple[Path, int, int]]) -> Iterator[list[Uprobe]]:
    """open_everywhere at each (file, offset, semaphore offset) of `sites`; all closed on
    exit."""
    uprobes: list[Uprobe] = []
    try:
        for path, off, sem in sites:
            uprobes += open_everywhere(path, off, sem)
        yield uprobes
    finally:
        for u in uprobes:
            u.close()


@dataclass(frozen=True, slots=True)
class ChildRun:
    """What a program run by run_under_uprobes did."""

    line: str  # its first line after "go"
    before: int  # hits counted when it said it was ready
    after: int  # hits counted between "go" and that line
    hits: int  # every hit counted, to its exit
    out: str  # its output after that line
    site: bytes  # the first site's bytes when it was ready
    trampoline: bool  # whether it had a trampoline page then


def run_under_uprobes(argv: Sequence[str], sites: Sequence[tuple[Path, int, int]], *,
                      ready: str = "ready", last: str = "", env: dict[str, str] | None = None,
                      timeout: float = 120) -> ChildRun:
    """Run `argv` under counting uprobes at `sites` (see counting). When it prints a line
    starting with `ready`, every site must read the optimized `call` in it; it is told "go",
    its next line is read, `last` is written to it and its stdin closed; it must exit 0. The
    uprobes are closed and the program is stopped by pid (tests/conftest.py) whatever
    happens."""
    with counting(sites) as uprobes, started(argv, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True,
                                             env=env) as proc:
        first = proc.line(timeout)
        assert first is not None and first.startswith(ready), first
        before = sum(u.count() for u in uprobes)
        codes = [read_mem(proc.pid, runtime_address(proc.pid, path, off), 5)
                 for path, off, _ in sites]
        for (path, off, _), code in zip(sites, codes, strict=True):
            assert code[0] == 0xE8, f"{path}:{off:#x} not optimized before the fork: {code.hex()}"
        tramp = any(m.path == TRAMPOLINE_NAME for m in read_maps(proc.pid))
        proc.say("go\n")
        line = (proc.line(timeout) or "").strip()
        after = sum(u.count() for u in uprobes) - before
        out = proc.finish(last, timeout)
        assert proc.proc.returncode == 0, (proc.proc.returncode, line, out)
        return ChildRun(line, before, after, sum(u.count() for u in uprobes), out, codes[0],
                        tramp)


def run_server(cmd: list[str], probe_file: Path, probe_offset: int, before: int,
               children: int, after: int, env: dict[str, str] | None = None,
               more: tuple[tuple[Path, int], ...] = ()) -> Run:
    """Run the server under counting uprobes at (probe_file, probe_offset) and the `more`
    probes; `hits` sums them all, `parent_site` is the first one's."""
    sites = [(path, off, 0) for path, off in ((probe_file, probe_offset), *more)]
    run = run_under_uprobes([*cmd, str(before), str(children), str(after)], sites,
                            ready="ready ns=", env=env)
    last = [ln for ln in (run.line, *run.out.splitlines()) if ln.strip()][-1]
    return Run(parse_report(last), run.hits, run.site, run.trampoline)


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
