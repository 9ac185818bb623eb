"""Shared test helpers: the live-kernel check, started processes, and the markers' behaviour.

Markers (registered in pyproject.toml, `--strict-markers`):
- `slow`: takes more than a few seconds (a build matrix, a real binary, an external tracer);
  `pytest -m "not slow"` is the quick inner loop, `make test` runs everything.
- `live`: uses the real kernel's uprobes. Skipped, with the reason, unless the machine has
  root, the uprobe PMU and the uprobe syscall (`live_kernel_reason()`); a module adds its own
  further needs (gcc, bpftrace, CPU 0) as ordinary skips.
- `needs_cc`: compiles C/C++ with gcc, g++ or clang.
- `guest`: boots a guest kernel under qemu (tests/guests.py, tests/test_live_guest_*.py). Not
  under `uprobe_lock`: the uprobes a guest attaches are the guest kernel's, which no host test
  sees; guests take a lock of their own instead (one at a time: the CPU, tests/guests.py).

Processes: `start_process` (a fixture) and `started` (a context manager) start a program and
always stop it by its pid, whatever the test does.

Parallel runs (`make test` runs `pytest -n auto --dist loadscope`, pytest-xdist): each module
is one unit of work, so that its module-scoped fixtures (compiled programs, rewritten real
binaries) are made once, on one worker, and its tests run in file order. Every `live` test
holds one lock while it runs (`uprobe_lock`, a file lock every worker and every other test run
of this machine shares): those tests attach the kernel's uprobes (directly, or through
bpftrace, perf or bcc), count hits and time programs, and must not see another test's probes.
A test that attaches uprobes without the `live` marker takes the lock with `uprobe_lock()`.
(Not xdist_group/--dist loadgroup: with pytest 9.2 pytest-xdist 3.8 cannot attach the group
to a test's node id, and the groups are silently ignored.)
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

# The CLI's piped tables and rich's page honour $COLUMNS (report/plain.py), and pytest-xdist's
# workers are started with COLUMNS=80 and LINES=24: every test sees no page width unless it
# sets one itself (monkeypatch), whoever runs it, serially or not.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# --- the real kernel ----------------------------------------------------------------------


@functools.cache
def live_kernel_reason() -> str | None:
    """None when optimized uprobes can be used here, else why not (one sentence).

    Needs root (perf_event_open uprobes on other processes or system-wide, /proc/PID/mem),
    the uprobe PMU, and the uprobe syscall 336 (Linux 6.18+: without it nop5 sites are never
    optimized)."""
    if os.geteuid() != 0:
        return "needs root (perf_event_open uprobes, /proc/PID/mem)"
    from usdtpatch.errors import UsdtpatchError
    from usdtpatch.live.perf import has_uprobe_syscall, uprobe_pmu_type

    try:
        uprobe_pmu_type()
    except UsdtpatchError as exc:
        return str(exc)
    if not has_uprobe_syscall():
        return ("the kernel has no uprobe syscall (336): nop5 sites are never optimized "
                "before Linux 6.18")
    return None


UPROBE_LOCK = os.path.join(tempfile.gettempdir(), "usdtpatch-tests-uprobes.lock")


@contextlib.contextmanager
def uprobe_lock(path: str = UPROBE_LOCK) -> Iterator[None]:
    """Hold the lock of the tests that use the kernel's uprobes (an exclusive flock on
    `path`, released when the descriptor closes: also when the process dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A `live` test runs, from its setup (module fixtures included) to its teardown, holding
    uprobe_lock."""
    if item.get_closest_marker("live") is None:
        return (yield)
    with uprobe_lock():
        return (yield)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("live") is not None:
        reason = live_kernel_reason()
        if reason is not None:
            pytest.skip(reason)


# --- processes ----------------------------------------------------------------------------


class Started:
    """A started program. `line()` reads its stdout (when piped) with a timeout; `stop()`
    kills it by pid and reaps it (idempotent)."""

    def __init__(self, argv: Sequence[str | os.PathLike[str]], **popen: Any) -> None:
        self.proc: subprocess.Popen[Any] = subprocess.Popen(
            [os.fspath(a) for a in argv], **popen)
        self.pid = self.proc.pid
        self._buf = b""

    def line(self, timeout: float) -> str | None:
        """The next line of stdout without its newline, or None at EOF or after `timeout`."""
        assert self.proc.stdout is not None, "start it with stdout=subprocess.PIPE"
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def say(self, text: str) -> None:
        """Write `text` to the program's stdin (started with stdin=subprocess.PIPE, text=True)."""
        assert self.proc.stdin is not None, "start it with stdin=subprocess.PIPE"
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def finish(self, text: str = "", timeout: float = 60) -> str:
        """Write `text` to stdin and close it, wait for the exit, and return the rest of the
        output (what `line()` read ahead first; started with text=True)."""
        out, _ = self.proc.communicate(text, timeout=timeout)
        rest, self._buf = self._buf.decode(errors="replace"), b""
        return rest + (out or "")

    def signal(self, sig: int) -> None:
        """Send `sig` to the program (by pid) if it is still running."""
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@contextlib.contextmanager
def started(argv: Sequence[str | os.PathLike[str]], **popen: Any) -> Iterator[Started]:
    """Start `argv` (keyword arguments go to subprocess.Popen); stopped by pid on exit."""
    proc = Started(argv, **popen)
    try:
        yield proc
    finally:
        proc.stop()


StartProcess = Callable[..., Started]


@pytest.fixture
def start_process() -> Iterator[StartProcess]:
    """`start_process(argv, **popen) -> Started`; every program started through it is stopped
    by pid when the test ends, passed or failed."""
    procs: list[Started] = []

    def start(argv: Sequence[str | os.PathLike[str]], **popen: Any) -> Started:
        proc = Started(argv, **popen)
        procs.append(proc)
        return proc

    yield start
    for proc in reversed(procs):
        proc.stop()


def runtime_address(pid: int, path: str | os.PathLike[str], offset: int) -> int:
    """Where file offset `offset` of `path` is mapped in process `pid` (from its maps)."""
    from usdtpatch.live.procfs import read_maps

    real = os.path.realpath(path)
    for m in read_maps(pid):
        if m.path == real and m.offset <= offset < m.offset + (m.end - m.start):
            return int(m.start + offset - m.offset)
    raise AssertionError(f"file offset {offset:#x} of {path} is not mapped in {pid}")


def assert_optimized_after_hits(pid: int, addresses: dict[str, int], probes: Sequence[Any],
                                hits: int = 3, timeout: float = 20.0) -> None:
    """Wait until every probe (usdtpatch.live.perf uprobes) counted `hits`, then check that each
    site of `addresses` (name -> runtime address) reads `e8 rel32` into [uprobes-trampoline]."""
    from usdtpatch.live.procfs import read_maps, read_mem
    from usdtpatch.sequences.trampoline import TRAMPOLINE_NAME

    deadline = time.monotonic() + timeout
    while min(p.count() for p in probes) < hits and time.monotonic() < deadline:
        time.sleep(0.02)
    assert min(p.count() for p in probes) >= hits, [p.count() for p in probes]
    tramps = [m for m in read_maps(pid) if m.path == TRAMPOLINE_NAME]
    assert tramps, f"no {TRAMPOLINE_NAME} mapping after the hits"
    for name, a in addresses.items():
        code = read_mem(pid, a, 5)
        assert code[0] == 0xE8, f"{name}: not optimized: {code.hex()}"
        dest = a + 5 + int.from_bytes(code[1:5], "little", signed=True)
        assert any(m.start <= dest < m.end for m in tramps), f"{name}: call {dest:#x}"


def pinned_to_cpu0() -> None:
    """preexec_fn for a program that must run on CPU 0 (where a per-CPU probe is opened)."""
    os.sched_setaffinity(0, {0})


SIGNALS_SENT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the ones tests send


def default_sigint() -> None:
    """preexec_fn for a program a test interrupts with SIGINT, SIGTERM or SIGHUP: it starts
    with their default actions whatever the test run's are. A shell without job control
    starts a background job (`make test &`, `pytest ... &`) with SIGINT ignored, `nohup make
    test` runs it with SIGHUP ignored; an ignored signal stays ignored across exec, and
    Python installs no KeyboardInterrupt handler for a signal it starts ignoring (nor does
    usdtpatch its SIGTERM/SIGHUP handler: cli._terminating leaves an ignored signal
    ignored)."""
    for sig in SIGNALS_SENT:
        signal.signal(sig, signal.SIG_DFL)


def cpu0_reason() -> str | None:
    return None if 0 in os.sched_getaffinity(0) else "CPU 0 is not available to pin on"


__all__ = ["StartProcess", "Started", "cpu0_reason", "default_sigint", "live_kernel_reason",
           "pinned_to_cpu0",
           "runtime_address", "started", "uprobe_lock"]
