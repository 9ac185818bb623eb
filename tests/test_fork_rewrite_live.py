"""Rewritten files fork while traced on Linux 6.18: with the fork guard (the default) every
child survives and its own probe hits are counted; with `--fork-guard never` the children die
with SIGSEGV at the site (the crash the guard exists for).

- a copy of Debian's python3.11 (the real binary is never modified), probe python:gc__start:
  gc.collect() in the parent until the site is optimized, os.fork(), gc.collect() in the
  child; and a multiprocessing pool with the fork start method whose workers collect;
- the pre-fork server fixture (fixtures/src/forkserver.c) built with systemtap's header and
  rewritten: its site in the executable (50 children), and its site in a shared library
  (libforksrv.so, rewritten) while fork is called from the executable.

Hits are counted by system-wide counting uprobes (one perf event per CPU, on the rewritten
file's inode, so other processes of the machine do not count), opened for the duration of one
run and closed in a finally block; every process started is killed by pid if still running.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import started
from tests.test_fork_support import (
    SRC,
    Run,
    cc,
    need_cc,
    need_kernel,
    open_everywhere,
    run_server,
    run_under_uprobes,
)
from usdtpatch.api import load, rewrite

pytestmark = pytest.mark.live

PYTHON = Path("/usr/bin/python3.11")
GUARDS = [("auto", True), ("never", False)]
GUARD_IDS = ["guarded", "unguarded"]


def _rewrite(src: Path, out: Path, fork_guard: str) -> Path:
    outcome = rewrite(src, out, fork_guard=fork_guard)
    assert outcome.changed and not outcome.failed
    return out


def _probe_offset(path: Path, name: str) -> int:
    probe = next(p for p in load(str(path)).probes if p.name == name)
    assert probe.offset is not None
    return probe.offset


def _semaphore_offset(path: Path, name: str) -> int:
    probe = next(p for p in load(str(path)).probes if p.name == name)
    sem = probe.semaphore
    return sem.offset if sem is not None and sem.offset else 0


@pytest.fixture(scope="module")
def pythons(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} is not installed")
    d = tmp_path_factory.mktemp("py")
    copy = d / "python3.11"
    shutil.copy2(PYTHON, copy)
    return {g: _rewrite(copy, d / f"python3.11.{g}", g) for g, _ in GUARDS}


GC_SCRIPT = r"""
import gc, os, sys
gc.disable()
for _ in range(3):
    gc.collect()
print("ready", flush=True)
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    for _ in range(CHILD_COLLECTS):
        gc.collect()
    # the kernel optimized the site again in the child: it has a trampoline page of its own
    with open("/proc/self/maps") as f:
        os._exit(0 if "[uprobes-trampoline]" in f.read() else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
sys.stdin.readline()
"""

CHILD_COLLECTS = 7


def _run_python(binary: Path, script: str, timeout: float = 60) -> tuple[str, int, int]:
    """(the script's report line, hits before "go", hits between "go" and the report) of
    gc__start. The script says "ready", waits for a line, forks and reports, then waits for
    a line again before it exits (the interpreter's own collections at exit do not count)."""
    site = (binary, _probe_offset(binary, "gc__start"), _semaphore_offset(binary, "gc__start"))
    # the parent's site is optimized before the fork (run_under_uprobes checks it)
    run = run_under_uprobes([str(binary), "-c", script], [site], last="\n", timeout=timeout)
    return run.line, run.before, run.after


@pytest.mark.parametrize(("guard", "survives"), GUARDS, ids=GUARD_IDS)
def test_python_gc_fork(pythons: dict[str, Path], guard: str, survives: bool) -> None:
    need_kernel()
    script = GC_SCRIPT.replace("CHILD_COLLECTS", str(CHILD_COLLECTS))
    last, before, after = _run_python(pythons[guard], script)
    assert before >= 3
    if survives:
        assert last == "child 0"
        assert after == CHILD_COLLECTS  # the child's own hits, counted
    else:
        assert last == f"child {-signal.SIGSEGV}"
        assert after == 0


POOL_SCRIPT = r"""
import gc, multiprocessing, sys
def work(n):
    for _ in range(n):
        gc.collect()
    return n
if __name__ == "__main__":
    gc.disable()
    for _ in range(3):
        gc.collect()
    print("ready", flush=True)
    sys.stdin.readline()
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(3)
    try:
        res = pool.map_async(work, [5] * 12).get(timeout=TIMEOUT)
        print("pool", sum(res), flush=True)
    except multiprocessing.TimeoutError:
        print("pool timeout", flush=True)
    finally:
        pool.terminate()
        pool.join()
    sys.stdin.readline()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("guard", "survives"), GUARDS, ids=GUARD_IDS)
def test_python_multiprocessing_fork_pool(pythons: dict[str, Path], guard: str,
                                          survives: bool) -> None:
    need_kernel()
    # a pool whose worker died never finishes: wait 5 s for it, 60 s for a working one
    script = POOL_SCRIPT.replace("TIMEOUT", "60" if survives else "5")
    last, before, after = _run_python(pythons[guard], script)
    assert before >= 3
    if survives:
        assert last == "pool 60"
        assert after >= 60  # every task's collections, in the workers
    else:
        # a worker that dies at the site loses its task: the pool never finishes
        assert last == "pool timeout"


# --- the pre-fork server fixture ------------------------------------------------------------

SHAPES = {"pie": ["-fPIE", "-pie"], "nopie": ["-fno-pie", "-no-pie"],
          "static": ["-static"], "static-pie": ["-static-pie"],
          "pie-relr": ["-fPIE", "-pie", "-Wl,-z,pack-relative-relocs"]}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fixture built with systemtap's header (1-byte sites), then rewritten: keys
    "<shape>/<guard>" for the executable, "lib/<guard>" for the library's directory."""
    need_cc()
    d = tmp_path_factory.mktemp("srv")
    out: dict[str, Path] = {}
    built: dict[str, Path] = {}
    for shape, flags in SHAPES.items():
        try:
            cc(["-O2", *flags, str(SRC / "forkserver.c"), "-o", str(d / f"server-{shape}")])
        except AssertionError:
            continue  # no static libc here: those shapes skip
        built[shape] = d / f"server-{shape}"
    cc(["-O2", "-fPIC", "-shared", str(SRC / "forkserver-lib.c"), "-o",
        str(d / "libforksrv.so")])
    cc(["-O2", "-fPIE", "-pie", "-DUSE_LIB", str(SRC / "forkserver.c"), f"-L{d}",
        "-lforksrv", "-Wl,-rpath,$ORIGIN", "-o", str(d / "server-lib")])
    for g, _ in GUARDS:
        gd = d / g
        gd.mkdir()
        for shape, path in built.items():
            out[f"{shape}/{g}"] = _rewrite(path, gd / path.name, g)
        _rewrite(d / "libforksrv.so", gd / "libforksrv.so", g)
        shutil.copy2(d / "server-lib", gd / "server-lib")  # untouched: it has no probe
        out[f"lib/{g}"] = gd
    return out


@pytest.mark.needs_cc
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("guard", "survives"), GUARDS, ids=GUARD_IDS)
def test_rewritten_prefork_server(servers: dict[str, Path], guard: str, survives: bool,
                                  shape: str) -> None:
    """50 children, one after the other, each hitting the probe 20 times."""
    exe = servers.get(f"{shape}/{guard}")
    if exe is None:
        pytest.skip(f"gcc cannot link {shape} executables here (no static libc, or a linker "
                    f"without -z pack-relative-relocs)")
    run = run_server([str(exe)], exe, _probe_offset(exe, "hit"), 10, 50, 20)
    assert run.parent_site[0] == 0xE8 and run.parent_has_trampoline
    if survives:
        assert run.report.ok == 50 and run.hits == 10 + 50 * 20
    else:
        assert run.report.signaled == 50 and run.report.lastsig == signal.SIGSEGV
        assert run.hits == 10


@pytest.mark.needs_cc
@pytest.mark.parametrize(("guard", "survives"), GUARDS, ids=GUARD_IDS)
def test_rewritten_library_fork_from_executable(servers: dict[str, Path], guard: str,
                                                survives: bool) -> None:
    """The sites are in libforksrv.so (rewritten); the executable (not rewritten, no probe)
    calls fork."""
    lib = servers[f"lib/{guard}"] / "libforksrv.so"
    run = run_server([str(lib.parent / "server-lib")], lib, _probe_offset(lib, "hit"),
                     10, 5, 100)
    _children_as_expected(run, survives, before=10, children=5, after=100)


@pytest.fixture(scope="module")
def forks_in_lib(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The executable with the probe forks through libforksrv.so (forkserver-lib.c
    -DFORK_HELPER): it imports no fork itself. The executable is rewritten, per guard."""
    need_cc()
    d = tmp_path_factory.mktemp("forklib")
    cc(["-O2", "-fPIC", "-shared", "-DFORK_HELPER", str(SRC / "forkserver-lib.c"), "-o",
        str(d / "libforksrv.so")])
    cc(["-O2", "-fPIE", "-pie", "-DFORK_IN_LIB", str(SRC / "forkserver.c"), f"-L{d}",
        "-lforksrv", "-Wl,-rpath,$ORIGIN", "-o", str(d / "server-forklib")])
    return {g: _rewrite(d / "server-forklib", d / f"server-forklib.{g}", g) for g, _ in GUARDS}


@pytest.mark.needs_cc
@pytest.mark.parametrize(("guard", "survives"), GUARDS, ids=GUARD_IDS)
def test_executable_forked_by_its_library(forks_in_lib: dict[str, Path], guard: str,
                                          survives: bool) -> None:
    """A library the executable loads calls fork (as libvirt's virFork does for libvirtd):
    `auto` guards the executable though it names no fork, and its children survive."""
    exe = forks_in_lib[guard]
    assert "fork" not in {n.split("@")[0] for n in _imports(exe)}
    run = run_server([str(exe)], exe, _probe_offset(exe, "hit"), 10, 5, 20)
    _children_as_expected(run, survives, before=10, children=5, after=20)


def _children_as_expected(run: Run, survives: bool, *, before: int, children: int,
                          after: int) -> None:
    """The parent's site was optimized when it forked; guarded, every child exits 0 and its
    hits are counted; unguarded, every child dies with SIGSEGV at its first hit."""
    assert run.parent_site[0] == 0xE8
    if survives:
        assert run.report.ok == children and run.hits == before + children * after
    else:
        assert run.report.signaled == children and run.report.lastsig == signal.SIGSEGV
        assert run.hits == before


def _imports(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return [ln.split()[-1] for ln in out.splitlines() if " UND " in ln]


# --- the issue's own scenario, with bpftrace ------------------------------------------------

BPF_SCRIPT = r"""
import gc, os, sys
gc.disable()
sys.stdin.readline()
for _ in range(3):
    gc.collect()
pid = os.fork()
if pid == 0:
    for _ in range(CHILD_COLLECTS):
        gc.collect()
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.getpid(), pid, os.waitstatus_to_exitcode(status), flush=True)
sys.stdin.readline()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("guard", "survives"), GUARDS, ids=GUARD_IDS)
def test_python_gc_fork_under_bpftrace(pythons: dict[str, Path], guard: str,
                                       survives: bool) -> None:
    """bpftrace counts python:gc__start per pid: the parent's 3 collections, and with the
    guard the child's own 7 under the child's pid; without it the child dies (SIGSEGV)."""
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace is not installed")
    binary = pythons[guard]
    script = BPF_SCRIPT.replace("CHILD_COLLECTS", str(CHILD_COLLECTS))
    program = f'usdt:{binary}:python:gc__start {{ @[pid] = count(); }} ' \
              'BEGIN { printf("attached\\n"); }'
    with started(["bpftrace", "-e", program], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True) as tracer:
        seen: list[str | None] = []
        while not seen or "attached" not in (seen[-1] or ""):  # warnings, "Attaching N probes"
            seen.append(tracer.line(60))
            assert seen[-1] is not None and len(seen) < 20, f"bpftrace did not attach: {seen}"
        with started([binary, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     text=True) as proc:
            proc.say("go\n")
            parent, child, status = (int(x) for x in (proc.line(60) or "").split())
            proc.finish("\n", timeout=60)
        tracer.signal(signal.SIGINT)
        out = tracer.finish(timeout=60)
    counts = {int(m[0]): int(m[1]) for m in re.findall(r"@\[(\d+)\]: (\d+)", out)}
    assert counts.get(parent, 0) >= 3, out
    if survives:
        assert status == 0
        assert counts.get(child) == CHILD_COLLECTS, out
    else:
        assert status == -signal.SIGSEGV
        assert child not in counts, out


NESTED_SCRIPT = r"""
import gc, os, sys
gc.disable()
for _ in range(3):
    gc.collect()
print("ready", flush=True)
sys.stdin.readline()
def child(depth):
    for _ in range(3):
        gc.collect()  # optimized again in this process by now
    if depth:
        pid = os.fork()
        if pid == 0:
            child(depth - 1)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status))
    os._exit(0)
pid = os.fork()
if pid == 0:
    child(2)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize(("guard", "survives"), GUARDS, ids=GUARD_IDS)
def test_python_nested_forks(pythons: dict[str, Path], guard: str, survives: bool) -> None:
    """A child that forks in turn, twice: each generation re-arms what its parent had
    re-optimized."""
    last, before, after = _run_python(pythons[guard], NESTED_SCRIPT)
    assert before >= 3
    if survives:
        assert last == "child 0" and after == 9  # 3 generations of 3 collections
    else:
        assert last == f"child {-signal.SIGSEGV}" and after == 0


@pytest.mark.needs_cc
@pytest.mark.parametrize(("guard", "survives"), GUARDS, ids=GUARD_IDS)
def test_rewritten_combo5_server(tmp_path: Path, guard: str, survives: bool) -> None:
    """--form combo5: `nop; nop5`, the note on the nop; a consumer that probes pc + 1 (what
    libbpf >= 1.7 does on a kernel with the uprobe syscall) gets the optimized path, and the
    guard covers it."""
    need_cc()
    src = tmp_path / "server"
    cc(["-O2", str(SRC / "forkserver.c"), "-o", str(src)])
    out = tmp_path / "server.rw"
    outcome = rewrite(src, out, form="combo5", fork_guard=guard)
    assert outcome.changed and not outcome.failed
    off = _probe_offset(out, "hit") + 1
    run = run_server([str(out)], out, off, 10, 10, 20)
    assert run.parent_site[0] == 0xE8
    if survives:
        assert run.report.ok == 10 and run.hits == 10 + 10 * 20
    else:
        assert run.report.signaled == 10 and run.hits == 10


@pytest.mark.needs_cc
@pytest.mark.parametrize("where", ["executable", "library"])
def test_rewritten_guard_without_proc(servers: dict[str, Path], where: str) -> None:
    """In a mount namespace without /proc: the registration finds the auxiliary vector after
    the initial environment, and the child handler makes the page writable for a moment
    (mprotect) instead of writing through /proc/self/mem."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    if where == "executable":
        exe = probe = servers["pie/auto"]
    else:
        exe, probe = servers["lib/auto"] / "server-lib", servers["lib/auto"] / "libforksrv.so"
    # $ORIGIN needs /proc/self/exe: name the library's folder instead
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f'umount -l /proc && LD_LIBRARY_PATH={exe.parent} exec {exe} "$@"', "sh"]
    run = run_server(cmd, probe, _probe_offset(probe, "hit"), 10, 5, 20)
    assert run.parent_site[0] == 0xE8
    assert run.report.ok == 5 and run.hits == 10 + 5 * 20


@pytest.mark.parametrize("guarded", [True, False], ids=["guard-only-rewrite", "original"])
def test_nop5_fixture_gets_a_guard_only_rewrite(tmp_path: Path, guarded: bool) -> None:
    """fixtures/bin/fork: its site already is a nop5 (nothing to rewrite) and it forks:
    `rewrite` adds only the fork guard. Traced, the original's child dies (status 11); the
    rewritten one's child runs its 50 hits."""
    from tests.helpers import fixture

    src = fixture("fork")
    binary = src
    if guarded:
        binary = tmp_path / "fork"
        outcome = rewrite(src, binary)
        assert outcome.changed and not outcome.failed
    off = _probe_offset(binary, "tick")
    uprobes = open_everywhere(binary, off)
    try:
        proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60,
                              check=False)
        hits = sum(u.count() for u in uprobes)
    finally:
        for u in uprobes:
            u.close()
    if guarded:
        assert proc.returncode == 0, proc.stdout
        assert "fork: child=3725" in proc.stdout
        assert hits == 100 + 50 + 100
    else:
        assert proc.returncode == 1 and "child failed status=11" in proc.stdout
        assert hits == 100  # the parent's; it stops once its child failed
