"""Guest kernels for the live tests (docs/kernel.md, "Kernels you can test on"): boot a kernel
fetched by `make guest-kernels` (tools/fetch_kernels.py) under qemu with virtme-ng, run a
command in it, and the checks of one guest session (tests/guest_session.py) with the facts each
kernel generation must show.

- `boot(key, command, rwdir, timeout)`: one boot of guest `key` running `command` (the host's
  root over 9p, `rwdir` writable), stopped by its pid (its process group: vng and qemu) when
  it ends, when `timeout` passes, or when the caller fails; returns the guest command's exit
  code and output, the wall time and the CPU time of vng and qemu.
- `GuestChecks`: the tests of one guest, a class a tests/test_live_guest_*.py module
  subclasses with its KEY (one module per kernel, so that pytest-xdist spreads them): a
  class-scoped fixture compiles the site program ON THE HOST (gcc under TCG is slow), boots
  the guest once, reads the session's JSON; each test asserts one fact against EXPECTED.

Guests run one at a time (GUEST_LOCK, a file lock every worker and test run of the machine
shares), but not under conftest's uprobe_lock: the uprobes a guest attaches are the guest
kernel's, which no host test sees. The lock is for the CPU: a guest keeps a core busy (its
two vCPUs on one TCG thread, VNG_OPTIONS says why), a session takes 1-2 minutes alone and up
to 3.3 minutes under the load of other engineers' suites, and two guests at once beside the
rest of `make test` would each take about twice as long: past the 4-minute limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "build" / "cache" / "kernels"  # tools/fetch_kernels.py's DEST
SITES_C = ROOT / "tests" / "data" / "guests" / "sites.c"
ARGS_C = ROOT / "tests" / "data" / "guests" / "args.c"
GUEST_LOCK = os.path.join(tempfile.gettempdir(), "usdtpatch-tests-guests.lock")
RECORDS = ROOT / "build" / "guests"  # KEY.json: the last session of each guest
SESSION_LIMIT = 240.0  # seconds of wall time for one guest session, boot included
# vng's options (kernel-facts.md "Measured on Linux 7.3"): the host's root over 9p, the PC
# machine (not microvm), TCG (nested KVM boots nothing here), 2 GiB, two vCPUs.
# -v: the guest's console goes to the log (vng.log in the session's directory).
# thread=single: the two vCPUs take turns on one host thread. With qemu's default
# multi-threaded TCG, 7.3 died once in bpftrace's perf_event_open ("Oops: int3" in __schedule:
# another vCPU ran the int3 a jump-label patch writes for a moment, after the patch was done:
# code written by one vCPU is not seen in order by another); one thread has no such race, and
# leaves the machine's second core to the rest of the test run.
VNG_OPTIONS = ("--force-9p", "--disable-microvm", "--disable-kvm", "-m", "2G", "-p", "2", "-v",
               "--qemu-opts=-accel tcg,thread=single")

# --- the sites and what each generation does with them ------------------------------------

FORMS: dict[str, bytes] = {  # the bytes at each form's note pc (tests/data/guests/sites.c)
    "nop1": bytes.fromhex("90"),
    "nop5": bytes.fromhex("0f1f440000"),
    "combo5": bytes.fromhex("90") + bytes.fromhex("0f1f440000"),
    "combo10": bytes.fromhex("90") + bytes.fromhex("662e0f1f840000000000"),
    "nop10": bytes.fromhex("662e0f1f840000000000"),
}
# (check name, form, attach at pc + delta)
SITE_CHECKS: tuple[tuple[str, str, int], ...] = (
    ("nop1@pc", "nop1", 0), ("nop5@pc", "nop5", 0), ("combo5@pc", "combo5", 0),
    ("combo5@pc+1", "combo5", 1), ("combo10@pc", "combo10", 0),
    ("combo10@pc+1", "combo10", 1), ("nop10@pc", "nop10", 0),
)
# The probe of args.c's `usdtpatch rewrite --form combo10` copy, attached at its new pc + 1
# (the nop10 of its `90` + nop10): the rewrite on the generation's fast path.
REWRITTEN_CHECK = ("rewritten-combo10@pc+1", "combo10", 1)
SITE_NAMES = tuple(name for name, _f, _d in (*SITE_CHECKS, REWRITTEN_CHECK))
ITERATIONS = 10_000  # passes of one site per check (a counting uprobe must count exactly)
KCHECK_ITERATIONS = 1_000  # passes of every site under kcheck (`sites all N`)
REWRITE_ITERATIONS = 1_000  # passes of the rewritten args program's probe

# What the kernel does with the probed instruction (kernel-facts.md, "Measured on Linux 7.3",
# the table "site bytes at the note pc | attached at | 6.1 | 6.18 | 7.2.13 | 7.3"):
INT3 = "int3"  # cc over byte 0 while attached, every hit counted, restored at detach
NOP5 = "nop5"  # optimized after the first hit: e8 rel32 into [uprobes-trampoline]
NOP10 = "nop10"  # optimized: 48 8d 64 24 80 e8 rel32; detach restores bytes 0..4 only
# A CS-prefixed nop10 before the nop10 generation: the probe is lost and the bytes stay. Attached
# to a process already running the file (as here), perf_event_open fails with errno 524
# (ENOTSUPP: measured on 6.1); kernel-facts.md measured "the open succeeds, 0 hits" (the
# uprobe registered before the file was mapped). Either way never a hit.
NEVER = "never fires"
ENOTSUPP = 524
# Per generation (docs/kernel.md: none = the uprobe syscall answers ENOSYS, nop5 = ENXIO,
# nop10 = EPROTO). The guests run `none` (6.1) and `nop10` (7.3, 7.2.13); `nop5` is the host
# (6.18), written down for comparison.
EXPECTED: dict[str, dict[str, str]] = {
    "none": {"nop1@pc": INT3, "nop5@pc": INT3, "combo5@pc": INT3, "combo5@pc+1": INT3,
             "combo10@pc": INT3, "combo10@pc+1": NEVER, "nop10@pc": NEVER,
             "rewritten-combo10@pc+1": NEVER},
    "nop5": {"nop1@pc": INT3, "nop5@pc": NOP5, "combo5@pc": INT3, "combo5@pc+1": NOP5,
             "combo10@pc": INT3, "combo10@pc+1": NEVER, "nop10@pc": NEVER,
             "rewritten-combo10@pc+1": NEVER},
    "nop10": {"nop1@pc": INT3, "nop5@pc": INT3, "combo5@pc": INT3, "combo5@pc+1": INT3,
              "combo10@pc": INT3, "combo10@pc+1": NOP10, "nop10@pc": NOP10,
              "rewritten-combo10@pc+1": NOP10},
}
ERRNO_NAME = {"none": "ENOSYS", "nop5": "ENXIO", "nop10": "EPROTO"}
# kcheck on the site program: the note pc of each probe, where kcheck attaches (pc + 1 for a
# `90` + nop10 on the nop10 generation, the pc elsewhere) and what it must find there.
KCHECK_EXPECTED: dict[str, dict[str, tuple[int, str]]] = {
    "none": {"nop1": (0, INT3), "nop5": (0, INT3), "combo5": (0, INT3),
             "combo10": (0, INT3), "nop10": (0, NEVER)},
    "nop5": {"nop1": (0, INT3), "nop5": (0, NOP5), "combo5": (1, NOP5),
             "combo10": (0, INT3), "nop10": (0, NEVER)},
    "nop10": {"nop1": (0, INT3), "nop5": (0, INT3), "combo5": (0, INT3),
              "combo10": (1, NOP10), "nop10": (0, NOP10)},
}
# The session run on this machine's own kernel, without a guest (tests/test_live_host.py):
# its generation is the running kernel's, told by the uprobe syscall's answer.
HOST_KEY = "host"


def generation(key: str) -> str:
    """`nop10-7.3` -> `nop10`: the generation a guest is an example of (the host's: the
    running kernel's)."""
    if key == HOST_KEY:
        from usdtpatch.kernelfacts import generation_of_errno, uprobe_syscall_errno

        gen, _why = generation_of_errno(uprobe_syscall_errno())
        return gen.name if gen is not None else "unknown"
    return key.split("-", 1)[0]


def run_here(command: Sequence[str], rwdir: Path, timeout: float) -> GuestRun:
    """The session's command run on this machine's kernel (no guest), stopped by its pid
    however the run ends: a GuestRun as boot() gives it."""
    start = time.monotonic()
    before = os.times()
    proc = subprocess.Popen(list(command), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop_group(proc.pid)
        out, _ = proc.communicate()
    after = os.times()
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    return GuestRun(exit_code=None if timed_out else proc.returncode, output=out or "",
                    vng_exit=0, seconds=time.monotonic() - start, cpu_seconds=cpu,
                    timed_out=timed_out, log="", pid=proc.pid)


# --- booting ------------------------------------------------------------------------------


class GuestUnavailable(Exception):
    """The guest's kernel is not there (the reason `make guest-kernels` wrote, or why not)."""


def kernel(key: str) -> tuple[Path, str]:
    """(vmlinuz, release) of guest `key`, fetched by `make guest-kernels`."""
    err = KERNELS / f"{key}.error"
    if err.is_file():
        raise GuestUnavailable(f"no {key} guest kernel: {err.read_text().strip()}")
    try:
        info = json.loads((KERNELS / key / "kernel.json").read_text())
    except (OSError, ValueError) as exc:
        raise GuestUnavailable(f"no {key} guest kernel in {KERNELS} (run `make "
                               f"guest-kernels`): {exc}") from None
    image = KERNELS / key / str(info["vmlinuz"])
    if not image.is_file():
        raise GuestUnavailable(f"{image} is missing (run `make guest-kernels`)")
    return image, str(info["release"])


def vng() -> str:
    found = shutil.which("vng", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                      os.environ.get("PATH", "")]))
    if found is None:
        raise GuestUnavailable("no vng (virtme-ng, the test extra of pyproject.toml)")
    for tool in ("qemu-system-x86_64", "busybox"):
        if shutil.which(tool) is None:
            raise GuestUnavailable(f"no {tool} (make system-packages installs it)")
    return found


def guest_lock(path: str = GUEST_LOCK) -> contextlib.AbstractContextManager[None]:
    """One guest at a time on this machine (the module's docstring says why): conftest's
    machine-wide file lock, on a file of the guests' own."""
    from tests.conftest import uprobe_lock

    return uprobe_lock(path)


@dataclasses.dataclass
class GuestRun:
    exit_code: int | None  # the guest command's (None: it never finished)
    output: str  # the guest command's stdout and stderr
    vng_exit: int | None  # vng's own (None: stopped at the time limit)
    seconds: float  # wall time, boot to power-off
    cpu_seconds: float  # user + system time of vng and qemu
    timed_out: bool
    log: str  # vng's and qemu's own output (the tail)
    pid: int  # vng's, the leader of the process group that was stopped


def _stop_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def group_alive(pid: int) -> bool:
    """Whether a process of group `pid` is left that is not a zombie (init reaps those)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pid and fields[0] != "Z":  # fields: state ppid pgrp ...
            return True
    return False


def boot(key: str, command: Sequence[str], rwdir: Path, timeout: float) -> GuestRun:
    """Boot guest `key`, run `command` in it (cwd: this checkout) with `rwdir` writable, and
    stop it by its pid (vng's process group, qemu in it) however the run ends."""
    image, _release = kernel(key)
    runner = vng()
    rwdir.mkdir(parents=True, exist_ok=True)
    out, rc = rwdir / "guest.out", rwdir / "guest.rc"
    for f in (out, rc):
        f.unlink(missing_ok=True)
    # virtme-ng's script I/O ports are not there with busybox's init: the command's output and
    # exit code come back through the shared directory.
    script = (f"cd {shlex.quote(str(ROOT))} && {{ {shlex.join(command)}; }} "
              f"> {shlex.quote(str(out))} 2>&1; echo $? > {shlex.quote(str(rc))}")
    argv = [runner, "-r", str(image), *VNG_OPTIONS, "--rwdir", str(rwdir), "-e", script]
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")]))
    log = rwdir / "vng.log"
    start = time.monotonic()
    with open(log, "wb") as logf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                cwd=ROOT, env=env, start_new_session=True)
    status: int | None = None
    usage: resource.struct_rusage | None = None
    try:
        while True:
            pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                status, usage = st, ru
                break
            if time.monotonic() - start > timeout:
                break
            time.sleep(0.2)
    finally:
        _stop_group(proc.pid)
        if status is None:
            _pid, st, ru = os.wait4(proc.pid, 0)
            usage = ru
        proc.returncode = -1  # reaped here, not by Popen
        deadline = time.monotonic() + 10  # qemu, reparented, dies after vng: wait for it
        while group_alive(proc.pid) and time.monotonic() < deadline:
            _stop_group(proc.pid)
            time.sleep(0.1)
    seconds = time.monotonic() - start
    cpu = (usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
    code: int | None = None
    with contextlib.suppress(OSError, ValueError):
        code = int(rc.read_text().strip())
    try:
        text = out.read_text(errors="replace")
    except OSError:
        text = ""
    return GuestRun(exit_code=code, output=text,
                    vng_exit=None if status is None else os.waitstatus_to_exitcode(status),
                    seconds=seconds, cpu_seconds=cpu, timed_out=status is None,
                    log=log.read_text(errors="replace")[-3000:], pid=proc.pid)


# --- a session ----------------------------------------------------------------------------


def compile_sites(tmp: Path) -> Path:
    exe = tmp / "sites"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(SITES_C)], check=True,
                   capture_output=True, timeout=120)
    return exe


def file_offsets(path: Path) -> dict[str, int]:
    """form -> file offset of its site (the symbol FORM_site)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    out: dict[str, int] = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection), f"{path} has no .symtab"
        loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        for form in FORMS:
            sym = symtab.get_symbol_by_name(f"{form}_site")
            assert sym, f"{path} has no {form}_site"
            vaddr = int(sym[0]["st_value"])
            seg = next(s for s in loads
                       if s["p_vaddr"] <= vaddr < s["p_vaddr"] + s["p_filesz"])
            out[form] = vaddr - int(seg["p_vaddr"]) + int(seg["p_offset"])
    return out


def compile_rewritten(tmp: Path) -> tuple[Path, Path]:
    """(the original, its `usdtpatch rewrite --form combo10` copy) of args.c."""
    exe, rewritten = tmp / "args", tmp / "args.combo10"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(ARGS_C)], check=True, capture_output=True,
                   timeout=120)
    subprocess.run([sys.executable, "-m", "usdtpatch", "rewrite", str(exe), "-o", str(rewritten),
                    "--form", "combo10"], check=True, capture_output=True, timeout=300)
    return exe, rewritten


def note_pc_offset(path: Path) -> int:
    """The file offset of the one probe's note pc in `path` (`usdtpatch list --json`)."""
    out = subprocess.run([sys.executable, "-m", "usdtpatch", "list", "--json", str(path)],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    probes = json.loads(out)["files"][0]["probes"]
    assert len(probes) == 1, probes
    return int(probes[0]["file_offset"])


def session_spec(exe: Path, rewritten: Path) -> dict[str, Any]:
    offsets = file_offsets(exe)
    checks: list[dict[str, Any]] = [{"name": "kernel", "kind": "kernel"}]
    for name, form, delta in SITE_CHECKS:
        checks.append({"name": name, "kind": "site", "program": str(exe), "form": form,
                       "site_offset": offsets[form], "offset": offsets[form] + delta,
                       "length": len(FORMS[form]), "iterations": ITERATIONS})
    checks.append({"name": "kcheck", "kind": "kcheck", "program": str(exe),
                   "args": ["all", str(KCHECK_ITERATIONS)], "timeout": 90})
    # bpftrace (0.17, Debian 12's) attaches at each note pc. The bare nop10 apart: where the
    # kernel refuses it, bpftrace refuses the whole script (measured on 6.1: exit 255).
    probes = ", ".join(f"usdt:{exe}:guest:{form}" for form in FORMS if form != "nop10")
    for name, script in (("bpftrace", f"{probes} {{ @[probe] = count(); }}"),
                         ("bpftrace-nop10", f"usdt:{exe}:guest:nop10 {{ @[probe] = count(); }}")):
        checks.append({"name": name, "kind": "bpftrace", "program": str(exe),
                       "args": ["all", str(KCHECK_ITERATIONS)], "timeout": 150,
                       "script": script})
    n = str(REWRITE_ITERATIONS)
    pc = note_pc_offset(rewritten)
    name, form, delta = REWRITTEN_CHECK
    checks.append({"name": name, "kind": "site", "program": str(rewritten), "form": form,
                   "site_offset": pc, "offset": pc + delta, "length": len(FORMS[form]),
                   "iterations": ITERATIONS, "args": [str(ITERATIONS), "wait"]})
    # bpftrace at the nop10 itself (pc + 1, by address: bpftrace's usdt probes attach at the
    # pc), the arguments read from the registers the note names (-8@%rdi -8@%rax): the
    # values the optimized path hands a consumer.
    checks.append({"name": "rewritten-traced-pc+1", "kind": "bpftrace",
                   "program": str(rewritten), "args": [n], "timeout": 150,
                   "script": f"uprobe:{rewritten}:{pc + 1:#x} {{ @hits = count(); "
                             f"@arg0 = sum(reg(\"di\")); @arg1 = sum(reg(\"ax\")); }}"})
    checks.append({"name": "rewritten-untraced", "kind": "run", "program": str(rewritten),
                   "args": [n], "timeout": 60})
    checks.append({"name": "rewritten-traced", "kind": "bpftrace", "program": str(rewritten),
                   "args": [n], "timeout": 150,
                   "script": f"usdt:{rewritten}:guest:tick {{ @hits = count(); "
                             f"@arg0 = sum(arg0); @arg1 = sum(arg1); }}"})
    return {"checks": checks}


@dataclasses.dataclass
class Session:
    key: str
    unavailable: str | None = None  # why there are no results
    run: GuestRun | None = None
    doc: dict[str, Any] = dataclasses.field(default_factory=dict)
    spec: dict[str, Any] = dataclasses.field(default_factory=dict)

    def result(self, name: str) -> dict[str, Any]:
        """The result of check `name`; the test FAILS (never skips) when there is none."""
        if self.unavailable is not None:
            pytest.fail(self.unavailable, pytrace=False)
        results: dict[str, Any] = self.doc.get("results", {})
        if name not in results:
            run = self.run
            why = "no session document" if not self.doc else f"no result for {name}"
            detail = "" if run is None else (
                f" (guest exit {run.exit_code}, vng exit {run.vng_exit}, "
                f"{run.seconds:.0f} s{', stopped at the time limit' if run.timed_out else ''};"
                f" guest output: {run.output[-1500:]!r}; vng: {run.log[-800:]!r})")
            pytest.fail(f"{self.key}: {why}{detail}", pytrace=False)
        res: dict[str, Any] = results[name]
        if "error" in res:
            pytest.fail(f"{self.key} {name}: the check failed in the guest: {res['error']}",
                        pytrace=False)
        return res


def run_session(key: str, tmp: Path, limit: float = SESSION_LIMIT) -> Session:
    """Compile the programs here, boot guest `key` once (under GUEST_LOCK) and run every
    check of the session in it."""
    if key != HOST_KEY:
        try:
            kernel(key)
        except GuestUnavailable as exc:
            return Session(key, unavailable=str(exc))
    exe = compile_sites(tmp)
    original, rewritten = compile_rewritten(tmp)
    spec = session_spec(exe, rewritten)
    spec["original_output"] = subprocess.run(
        [str(original), str(REWRITE_ITERATIONS)], capture_output=True, text=True, check=True,
        timeout=60).stdout
    spec_path, out_path = tmp / "spec.json", tmp / "out.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    command = [sys.executable, "-m", "tests.guest_session", str(spec_path), str(out_path)]
    if key == HOST_KEY:  # the caller holds the live tests' uprobe lock (the `live` marker)
        run = run_here(command, tmp, limit)
    else:
        with guest_lock():
            start = time.monotonic()
            try:
                run = boot(key, command, tmp, limit)
                # A guest that stopped early without running its command at all (seen once in
                # a dozen boots of 7.3: vng exit 255 after 6 s, nothing written) is booted again,
                # within what is left of the limit; the first attempt's log is kept.
                if run.exit_code is None and not run.timed_out and not out_path.exists():
                    (tmp / "vng.log").rename(tmp / "vng-first-attempt.log")
                    run = boot(key, command, tmp, limit - (time.monotonic() - start))
                    run.seconds = time.monotonic() - start
            except GuestUnavailable as exc:
                return Session(key, unavailable=str(exc))
    doc: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads(out_path.read_text())
    timing = {"key": key, "boot_and_session_seconds": round(run.seconds, 1),
              "guest_session_seconds": doc.get("session_seconds"),
              "cpu_seconds": round(run.cpu_seconds, 1), "checks": doc.get("seconds")}
    # The last session of each guest, kept for a reader (pytest's temporary directories are
    # removed three runs later): its timings and everything the guest measured.
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{key}.json").write_text(json.dumps({**timing, "session": doc}, indent=1))
    return Session(key, run=run, doc=doc, spec=spec)


# --- the tests of one guest ---------------------------------------------------------------


def _site_expectation(key: str, name: str) -> str:
    return EXPECTED[generation(key)][name]


def _delta(name: str) -> int:
    return next(d for n, _f, d in (*SITE_CHECKS, REWRITTEN_CHECK) if n == name)


def _form(name: str) -> str:
    return next(f for n, f, _d in (*SITE_CHECKS, REWRITTEN_CHECK) if n == name)


def _state(res: dict[str, Any], state: str) -> bytes:
    """The site's bytes at `state` (attached, after_hits, detached); when the kernel refused
    the probe, the bytes read after the program ran unprobed stand for every state."""
    return bytes.fromhex(res[state] if "attach_errno" not in res else res["unprobed_after_run"])


def _expected_attached(before: bytes, kind: str, delta: int) -> bytes:
    if kind == NEVER:
        return before
    return before[:delta] + b"\xcc" + before[delta + 1:]


class GuestChecks:
    """The tests of one guest: a subclass sets KEY (the guest, e.g. "nop10-7.3")."""

    KEY: ClassVar[str] = ""

    @pytest.fixture(scope="class")
    @classmethod
    def session(cls, tmp_path_factory: pytest.TempPathFactory) -> Session:
        return run_session(cls.KEY, tmp_path_factory.mktemp(cls.KEY))

    def test_session_in_time(self, session: Session) -> None:
        """The whole session, boot to power-off, within its limit and exit 0 in the guest."""
        session.result("kernel")
        assert session.run is not None
        assert not session.run.timed_out and session.run.exit_code == 0, (
            session.run.seconds, session.run.exit_code, session.run.output[-2000:])

    def test_uprobe_syscall_errno(self, session: Session) -> None:
        import errno

        res = session.result("kernel")
        want = ERRNO_NAME[generation(self.KEY)]
        got = res["uprobe_syscall_errno"]
        assert errno.errorcode.get(got, str(got)) == want, res

    def test_guest_tracing_tools(self, session: Session) -> None:
        """tracefs with uprobe_events and the uprobe PMU are there in the guest."""
        res = session.result("kernel")
        assert "tracefs" in res and "uprobe_pmu_type" in res, res

    @pytest.mark.parametrize("form", [f for f in FORMS if f != "nop10"])
    def test_bpftrace_counts(self, session: Session, form: str) -> None:
        """bpftrace runs in the guest and counts every pass of each probe (at the note pc)."""
        res = session.result("bpftrace")
        counts = dict(re.findall(r"^@\[usdt:[^\]]*:guest:(\w+)\]: (\d+)$", res["stdout"], re.M))
        assert res["exit_code"] == 0 and int(counts.get(form, 0)) == KCHECK_ITERATIONS, res

    def test_bpftrace_bare_nop10(self, session: Session) -> None:
        """bpftrace on the bare nop10's probe: every pass counted on the nop10 generation;
        before it the kernel refuses the probe and bpftrace stops with an error."""
        res = session.result("bpftrace-nop10")
        counts = dict(re.findall(r"^@\[usdt:[^\]]*:guest:(\w+)\]: (\d+)$", res["stdout"], re.M))
        if EXPECTED[generation(self.KEY)]["nop10@pc"] == NEVER:
            assert res["exit_code"] != 0 and not counts and \
                "Error attaching probe" in res["stderr"] and ":guest:nop10" in res["stderr"], res
        else:
            assert res["exit_code"] == 0 and counts == {"nop10": str(KCHECK_ITERATIONS)}, res

    @pytest.mark.parametrize("name", SITE_NAMES)
    def test_hits_counted(self, session: Session, name: str) -> None:
        """Every pass counted; a site that never fires: refused (524) or 0 hits."""
        res = session.result(name)
        if _site_expectation(self.KEY, name) == NEVER:
            assert res.get("attach_errno") == ENOTSUPP or res.get("hits") == 0, res
        else:
            assert res.get("hits") == ITERATIONS, res

    @pytest.mark.parametrize("name", SITE_NAMES)
    def test_bytes_attached(self, session: Session, name: str) -> None:
        res = session.result(name)
        before = bytes.fromhex(res["before"])
        assert before == FORMS[_form(name)], res
        want = _expected_attached(before, _site_expectation(self.KEY, name), _delta(name))
        assert _state(res, "attached") == want, res

    @pytest.mark.parametrize("name", SITE_NAMES)
    def test_bytes_after_hits(self, session: Session, name: str) -> None:
        res = session.result(name)
        kind, delta = _site_expectation(self.KEY, name), _delta(name)
        before, after = bytes.fromhex(res["before"]), _state(res, "after_hits")
        if kind in (INT3, NEVER):
            assert after == _expected_attached(before, kind, delta), res
            return
        head = b"\xe8" if kind == NOP5 else bytes.fromhex("488d642480e8")
        end = delta + (5 if kind == NOP5 else 10)
        assert after[delta:delta + len(head)] == head and after[end:] == before[end:], res
        target = res["address"] + end + int.from_bytes(after[end - 4:end], "little", signed=True)
        assert any(lo <= target < hi for lo, hi in res["trampolines"]), (hex(target), res)

    @pytest.mark.parametrize("name", SITE_NAMES)
    def test_bytes_after_detach(self, session: Session, name: str) -> None:
        """Detach restores the site; on the nop10 path bytes 5..9 of the nop10 keep the
        call's `e8 rel32` (kernel-facts.md: unoptimize restores bytes 1..4 and byte 0)."""
        res = session.result(name)
        kind, delta = _site_expectation(self.KEY, name), _delta(name)
        before, detached = bytes.fromhex(res["before"]), _state(res, "detached")
        want = before
        if kind == NOP10:
            after = bytes.fromhex(res["after_hits"])
            want = before[:delta + 5] + after[delta + 5:delta + 10] + before[delta + 10:]
        assert detached == want, res

    @pytest.mark.parametrize("form", list(FORMS))
    def test_kcheck_site(self, session: Session, form: str) -> None:
        """kcheck attaches where the generation's fast path is (pc + 1 of a `90` + nop10 on
        nop10), counts every pass, finds the planned bytes and the site restored; a site the
        kernel cannot probe it reports as not attached."""
        res = session.result("kcheck")
        doc = res.get("document")
        assert doc is not None, res
        delta, kind = KCHECK_EXPECTED[generation(self.KEY)][form]
        pc = file_offsets_of(session)[form]
        sites = [s for p in doc["processes"] if p["kind"] == "command" for s in p["sites"]
                 if s["probe"] == f"guest:{form}"]
        assert len(sites) == 1, (form, doc)
        s = sites[0]
        if kind == NEVER:  # a site the generation cannot probe: kcheck says so, attaches none
            assert (s["file_offset"] - pc, s["hits"], s["optimized"]) == (delta, 0, False), s
            assert s["attach_error"].startswith("not probeable") and "524" in \
                s["attach_error"], s
            return
        got = {"file_offset": s["file_offset"] - pc, "hits": s["hits"],
               "optimized": s["optimized"], "matches_plan": s["matches_plan"],
               "restored": s["restored"], "attached": not s["attach_error"]}
        if kind == NEVER:  # kcheck knows the kernel cannot probe it and says so
            want = {"file_offset": delta, "hits": 0, "optimized": False, "matches_plan": None,
                    "restored": None, "attached": False}
        else:
            want = {"file_offset": delta, "hits": KCHECK_ITERATIONS,
                    "optimized": kind in (NOP5, NOP10), "matches_plan": True,
                    "restored": True, "attached": True}
        assert got == want, s


def file_offsets_of(session: Session) -> dict[str, int]:
    """form -> the site's file offset, as the session's spec named it."""
    sites = {name for name, _f, _d in SITE_CHECKS}  # the sites program's, not the rewrite's
    return {c["form"]: c["site_offset"] for c in session.spec.get("checks", [])
            if c["kind"] == "site" and c["name"] in sites}


    def test_rewritten_untraced_output(self, session: Session) -> None:
        """The combo10 rewrite of a stock 1-byte-nop program prints what the original does."""
        res = session.result("rewritten-untraced")
        assert res["exit_code"] == 0 and res["stdout"] == session.spec["original_output"], res

    def test_rewritten_traced_counts_and_arguments(self, session: Session) -> None:
        """bpftrace on the rewritten program: every pass, both arguments' exact sums."""
        res = session.result("rewritten-traced")
        got = dict(re.findall(r"^@(\w+): (\d+)$", res["stdout"], re.M))
        n = REWRITE_ITERATIONS
        want = {"hits": str(n), "arg0": str(n * (n - 1) // 2),
                "arg1": str(3 * n * (n - 1) // 2 + n)}
        assert res["exit_code"] == 0 and got == want, res

    def test_rewritten_traced_at_the_nop10(self, session: Session) -> None:
        """bpftrace attached at the rewritten site's nop10 (pc + 1): every pass and both
        arguments' exact sums, from the registers (on the nop10 generation: the optimized
        path); before it the kernel refuses the probe."""
        res = session.result("rewritten-traced-pc+1")
        got = dict(re.findall(r"^@(\w+): (\d+)$", res["stdout"], re.M))
        if EXPECTED[generation(self.KEY)][REWRITTEN_CHECK[0]] == NEVER:
            assert res["exit_code"] != 0 and not got, res
            return
        n = REWRITE_ITERATIONS
        want = {"hits": str(n), "arg0": str(n * (n - 1) // 2),
                "arg1": str(3 * n * (n - 1) // 2 + n)}
        assert res["exit_code"] == 0 and got == want, res

    def test_rewritten_traced_output(self, session: Session) -> None:
        """Traced, the rewritten program still prints the original's output."""
        res = session.result("rewritten-traced")
        assert session.spec["original_output"] in res["stdout"], res


class Nop10ProtocolChecks:
    """The nop10 generation's write protocol: the states of a nop10 site read in the guest
    (before attach, attached with no hit, optimized, after detach) are the ends of the
    sequences usdtpatch's emulator verifies (sequences.optimized_sequences of the nop10
    generation's row, what `plan`/`verify --kernel nop10` use), for the bare nop10, for the
    nop10 at pc + 1 of `90` + nop10 and for the one of a combo10 rewrite. Mixed into the tests
    of a nop10 guest, after GuestChecks."""

    @pytest.mark.parametrize("name", ["nop10@pc", "combo10@pc+1", "rewritten-combo10@pc+1"])
    def test_nop10_states_are_the_protocol_ends(self, session: Session, name: str) -> None:
        from usdtpatch.kernelfacts import generation
        from usdtpatch.sequences.sequences import optimized_sequences

        res = session.result(name)
        delta = _delta(name)
        address = res["address"] + delta
        states = {k: bytes.fromhex(res[k])[delta:delta + 10]
                  for k in ("before", "attached", "after_hits", "detached")}
        rel = int.from_bytes(states["after_hits"][6:10], "little", signed=True)
        seqs = optimized_sequences(generation("nop10"), address, states["before"],
                                   address + 10 + rel)
        assert seqs.optimize is not None and seqs.unoptimize is not None
        model = {"before": seqs.attach.start, "attached": seqs.attach.end,
                 "after_hits": seqs.optimize.end, "detached": seqs.unoptimize.end}
        assert {k: v.hex() for k, v in states.items()} == {k: v.hex() for k, v in model.items()}
