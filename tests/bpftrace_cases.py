"""A runner of our own for bpftrace's runtime test format (tests/runtime/* of bpftrace's
sources), used by tests/test_bpftrace_usdt.py on the usdt cases of Debian's bpftrace source
package. Written from the format's description (bpftrace 0.17's tests/README.md and
runtime/engine): nothing of bpftrace's code is copied here.

The format: cases separated by blank lines, `#` lines ignored, one `FIELD value` per line.
    NAME "text"            the case's name
    RUN command            a shell command; {{BPFTRACE}} is the bpftrace binary,
                           {{BEFORE_PID}} the pid of the BEFORE program
    PROG program           same as RUN {{BPFTRACE}} -e 'program'
    EXPECT regex           what the output must contain (bpftrace 0.17: a regular expression,
                           searched line-wise); EXPECT_REGEX is the same in later versions
    TIMEOUT seconds        how long bpftrace may run once its probes are attached
    BEFORE command         started before bpftrace; bpftrace starts once a process named as
                           the command's last word's base name runs
    AFTER command          started once bpftrace's probes are attached
    REQUIRES command       the case is skipped unless the command exits 0 (repeatable)
    REQUIRES_FEATURE f...  features of `bpftrace --info` (!f: must be missing)
    MIN_KERNEL, MAX_KERNEL, ARCH, ENV k=v..., WILL_FAIL (bpftrace may exit non-zero)
The commands run in the test directory (./testprogs, ./testlibs, runtime/scripts) with the
environment bpftrace's runner gives them: `__BPFTRACE_NOTIFY_PROBES_ATTACHED=1` makes
bpftrace print a line once attached, which starts the TIMEOUT. A case passes when EXPECT
matches the output and bpftrace exited 0 (or was stopped at its timeout, or WILL_FAIL).
One difference from bpftrace's runner, for speed: once EXPECT matches after the probes are
attached, bpftrace gets 2 s to exit by itself and is then stopped as at its timeout (the
cases that end by their timeout, such as "Attaching 48 probes...", pass as soon as they
can).

Every process a case starts runs in its own session and is killed by its process group id
when the case ends. `pidof` in the commands is replaced by one that only sees processes whose
working directory is the test directory, so that concurrent runs cannot see each other's.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ATTACH_TIMEOUT = 30.0  # bpftrace's runner allows 5 s; this machine is shared and slower
GRACE = 2.0  # once EXPECT matches, how long bpftrace may still run before it is stopped
NOTIFY = "__BPFTRACE_NOTIFY_PROBES_ATTACHED"
FEATURES = {  # REQUIRES_FEATURE name -> what `bpftrace --info` prints when it is there
    "loop": "Loop support: yes", "probe_read_kernel": "probe_read_kernel: yes",
    "btf": "btf: yes", "kfunc": "kfunc: yes", "dpath": "dpath: yes",
    "uprobe_refcount": "uprobe refcount (depends on Build:bcc bpf_attach_uprobe refcount): yes",
    "signal": "send_signal: yes", "iter:task": "iter:task: yes",
    "iter:task_file": "iter:task_file: yes",
    "libpath_resolv": "bcc library path resolution: yes",
    "dwarf": "libdw (DWARF support): yes", "kprobe_multi": "kprobe_multi: yes",
    "skboutput": "skboutput: yes", "aot": "\0never",  # no AOT runtime in Debian's package
}


class FormatError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Case:
    suite: str
    name: str
    line: int  # where the case starts in its file
    run: str = ""
    prog: str = ""
    expect: str = ""
    timeout: float = 0.0
    before: str = ""
    after: str = ""
    requires: tuple[str, ...] = ()
    features: frozenset[str] = frozenset()
    missing_features: frozenset[str] = frozenset()
    min_kernel: str = ""
    max_kernel: str = ""
    arch: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    will_fail: bool = False

    @property
    def id(self) -> str:
        return f"{self.suite}.{self.name}"


_SIMPLE = {"RUN": "run", "PROG": "prog", "EXPECT": "expect", "EXPECT_REGEX": "expect",
           "BEFORE": "before", "AFTER": "after", "MIN_KERNEL": "min_kernel",
           "MAX_KERNEL": "max_kernel"}


def parse_cases(text: str, suite: str) -> list[Case]:
    """The cases of one runtime test file; FormatError names the line of a bad field."""
    cases: list[Case] = []
    block: list[tuple[int, str]] = []
    for no, raw in enumerate([*text.splitlines(), ""], 1):
        line = raw.rstrip("\n")
        if line.startswith("#"):
            continue
        if line.strip():
            block.append((no, line))
            continue
        if block:
            cases.append(_case(block, suite))
            block = []
    return cases


def _case(block: list[tuple[int, str]], suite: str) -> Case:
    values: dict[str, object] = {}
    requires: list[str] = []
    features: set[str] = set()
    missing: set[str] = set()
    for no, line in block:
        key, _, value = line.strip().partition(" ")
        value = " ".join(value.split())
        if key in _SIMPLE:
            values[_SIMPLE[key]] = value
        elif key == "NAME":
            values["name"] = value
        elif key == "TIMEOUT":
            try:
                values["timeout"] = float(value)
            except ValueError:
                raise FormatError(f"{suite}:{no}: TIMEOUT {value!r} is not a number") from None
        elif key == "REQUIRES":
            requires.append(value)
        elif key == "REQUIRES_FEATURE":
            for f in value.split():
                (missing if f.startswith("!") else features).add(f.lstrip("!"))
        elif key == "ARCH":
            values["arch"] = tuple(a.strip() for a in value.split("|"))
        elif key == "ENV":
            pairs = [e.partition("=") for e in value.split()]
            values["env"] = tuple((k, v) for k, _, v in pairs)
        elif key == "WILL_FAIL":
            values["will_fail"] = True
        else:
            raise FormatError(f"{suite}:{no}: unknown field {key!r}")
    first = block[0][0]
    unknown = (features | missing) - set(FEATURES)
    if unknown:
        raise FormatError(f"{suite}:{first}: unknown REQUIRES_FEATURE {sorted(unknown)}")
    name = values.pop("name", None)
    if not isinstance(name, str) or not name:
        raise FormatError(f"{suite}:{first}: a case without NAME")
    if bool(values.get("run")) == bool(values.get("prog")):
        raise FormatError(f"{suite}:{first}: {name}: exactly one of RUN and PROG")
    if not values.get("expect"):
        raise FormatError(f"{suite}:{first}: {name}: no EXPECT")
    if not values.get("timeout"):
        raise FormatError(f"{suite}:{first}: {name}: no TIMEOUT")
    return Case(suite=suite, name=name, line=first, requires=tuple(requires),
                features=frozenset(features), missing_features=frozenset(missing),
                **values)  # type: ignore[arg-type]


@dataclass(slots=True)
class Outcome:
    status: str  # "pass", "fail", "skip"
    reason: str = ""
    output: str = ""
    command: str = ""
    seconds: float = 0.0
    attempts: int = 1


@dataclass
class Runner:
    """Runs cases in `workdir` with `bpftrace`; `timeout_scale` multiplies each TIMEOUT."""

    workdir: Path
    bpftrace: str = "bpftrace"
    timeout_scale: float = 3.0
    _info: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        real = shutil.which("pidof")
        if real is None:
            raise FileNotFoundError("pidof")
        bindir = self.workdir / ".bin"
        bindir.mkdir(exist_ok=True)
        wrapper = bindir / "pidof"
        wrapper.write_text(
            "#!/bin/sh\n# pidof, limited to the processes working in this test directory\n"
            f"found=1\nfor pid in $({real} \"$@\"); do\n"
            f"  if [ \"$(readlink /proc/$pid/cwd)\" = '{self.workdir}' ]; then\n"
            "    printf '%s\\n' \"$pid\"; found=0\n  fi\ndone\nexit $found\n")
        wrapper.chmod(0o755)
        self.path = f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def features(self) -> str:
        if self._info is None:
            proc = subprocess.run([self.bpftrace, "--info"], capture_output=True, text=True,
                                  timeout=60, check=False)
            self._info = proc.stdout + proc.stderr
        return self._info

    def skip_reason(self, case: Case) -> str | None:
        if case.arch and platform.machine().lower() not in case.arch:
            return f"ARCH {'|'.join(case.arch)}"
        kernel = _version(platform.release())
        if case.min_kernel and _version(case.min_kernel) > kernel:
            return f"MIN_KERNEL {case.min_kernel}"
        if case.max_kernel and _version(case.max_kernel) < kernel:
            return f"MAX_KERNEL {case.max_kernel}"
        info = self.features()
        for f in sorted(case.features):
            if FEATURES[f] not in info:
                return f"REQUIRES_FEATURE {f}: bpftrace --info does not have it"
        for f in sorted(case.missing_features):
            if FEATURES[f] in info:
                return f"REQUIRES_FEATURE !{f}: bpftrace --info has it"
        for req in case.requires:
            rc = subprocess.run(req, shell=True, cwd=self.workdir, env=self._env({}),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=60, check=False).returncode
            if rc != 0:
                return f"REQUIRES {req} (exit {rc})"
        return None

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {"PATH": self.path, "HOME": os.environ.get("HOME", "/root"), NOTIFY: "1",
               "__BPFTRACE_NOTIFY_AOT_PORTABILITY_DISABLED": "1", "LANG": "C"}
        env.update(extra)
        return env

    def pids_named(self, name: str) -> list[int]:
        """The processes called `name` (as pidof matches: the command name, or the base
        name of argv[0], which survives an exec that passes argv on) that work in this test
        directory."""
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
                argv0 = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0]
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            named = comm == name[:15] or os.path.basename(argv0.decode(errors="replace")) == name
            if named and cwd == str(self.workdir):
                out.append(int(entry))
        return sorted(out)

    def run(self, case: Case, attempts: int = 1) -> Outcome:
        """Run `case`; a failure to match EXPECT is retried up to `attempts` times in all
        (some cases race by construction: which of several probes fires first)."""
        start = time.monotonic()
        reason = self.skip_reason(case)
        if reason is not None:
            return Outcome("skip", reason)
        for attempt in range(1, attempts + 1):
            with _group() as started:
                outcome = self._run(case, started)
            outcome.attempts = attempt
            if outcome.status == "pass" or "without a match" not in outcome.reason:
                break
        outcome.seconds = time.monotonic() - start
        return outcome

    def _run(self, case: Case, started: list[subprocess.Popen[bytes]]) -> Outcome:
        limit = case.timeout * self.timeout_scale
        command = case.run.replace("{{BPFTRACE}}", self.bpftrace) if case.run else \
            f"{self.bpftrace} -e '{case.prog}'"
        if case.before:
            started.append(self._spawn(case.before, {}))
            child = os.path.basename(case.before.split()[-1])
            deadline = time.monotonic() + max(limit, 10.0)
            while not self.pids_named(child):
                if time.monotonic() > deadline:
                    return Outcome("fail", f"BEFORE {case.before}: no process {child} "
                                           f"within {max(limit, 10.0):.0f} s", "", command)
                time.sleep(0.05)
            if "{{BEFORE_PID}}" in command:
                command = command.replace("{{BEFORE_PID}}", str(self.pids_named(child)[0]))
        tracer = self._spawn(command, dict(case.env), capture=True)
        started.append(tracer)
        assert tracer.stdout is not None
        fd = tracer.stdout.fileno()
        output = b""
        deadline = time.monotonic() + ATTACH_TIMEOUT
        attached = False
        matched_early = False
        timed_out = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready = select.select([fd], [], [], min(left, 0.5))[0]
            if not ready:
                if tracer.poll() is not None:
                    break
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            output += chunk
            if not attached and f"{NOTIFY}\n".encode() in output:
                attached = True
                deadline = time.monotonic() + limit
                if case.after:
                    started.append(self._spawn(case.after, {}))
            if attached and not matched_early and re.search(
                    case.expect, output.decode(errors="replace"), re.M):
                # matched: bpftrace gets GRACE seconds to exit by itself (its exit status
                # still counts), then it is stopped as at its timeout (a match passes)
                matched_early = True
                deadline = min(deadline, time.monotonic() + GRACE)
        if timed_out and tracer.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(tracer.pid, signal.SIGTERM)
        try:
            rest, _ = tracer.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(tracer.pid, signal.SIGKILL)
            # (a bpftrace killed while the kernel registers its uprobes dies when that ends)
            rest, _ = tracer.communicate(timeout=120)
        text = (output + (rest or b"")).decode(errors="replace")
        matched = re.search(case.expect, text, re.M) is not None
        if not timed_out and tracer.returncode != 0 and not case.will_fail:
            return Outcome("fail", f"bpftrace exited {tracer.returncode}", text, command)
        if matched:
            return Outcome("pass", "", text, command)
        what = "timed out" if timed_out else "ended"
        return Outcome("fail", f"{what} without a match for {case.expect!r}", text, command)

    def _spawn(self, command: str, env: dict[str, str],
               capture: bool = False) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command, shell=True, cwd=self.workdir, env=self._env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if capture else subprocess.DEVNULL,
            start_new_session=True)


@contextlib.contextmanager
def _group() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a case started (each the leader of its own session): killed by their
    process group ids, and reaped, when the case ends."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
            _gone(proc.pid)


def _gone(pgid: int, seconds: float = 5.0) -> None:
    """Wait until no live process of group `pgid` is left: SIGKILL reaches the leader's
    children too (a shell's child between fork and exec still bears the shell's name), but
    only the leader is ours to reap, and a killed process runs on until it exits. The
    zombies left are their new parent's to reap (this machine's init does it every second
    or so): not waited for."""
    deadline = time.monotonic() + seconds
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _live_members(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after the command name
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("-", maxsplit=1)[0])[:3])
