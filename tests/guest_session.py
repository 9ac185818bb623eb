"""The guest side of a guest session: `python -m tests.guest_session SPEC.json OUT.json`, run
inside a guest kernel booted by tests/guests.py (the host's root over 9p: the same venv, the
programs compiled on the host into the shared directory).

SPEC (written by tests/guests.py): {"checks": [...]}, each check a dict with "kind":
- "kernel": uname, the uprobe syscall's errno, tracefs and the uprobe PMU, where bpftrace is;
- "site": {"name", "program", "form", "offset" (the file offset to attach at), "length" (bytes
  to read at the site, from `site_offset`), "site_offset", "iterations", optionally "args"
  (default FORM N)}: start PROGRAM FORM N (it prints "ready PID" and waits for a line),
  read the site's bytes before attaching, attach a counting uprobe (perf_event_open, every
  online CPU, pid -1: usdtpatch.live.perf), read them again (attached, no hit), let the program
  run its N passes, read the hit count and the bytes (after hits) and the process's
  [uprobes-trampoline] mappings, detach, read the bytes (after detach), let the program exit;
- "kcheck": {"name", "program", "args", "timeout"}: `usdtpatch kcheck --json PROGRAM -- PROGRAM
  ARGS` and its document;
- "bpftrace": {"name", "program", "args", "script", "timeout"}: bpftrace -e SCRIPT -c PROGRAM;
- "run": {"name", "program", "args", "timeout"}: the program's exit code and output.

OUT.json is rewritten after every check ({"results": {name: result}, "seconds": {name: s}}), so
that a session stopped by the host's time limit still leaves what it measured. A check that
raises records {"error": "..."}; every program a check starts is stopped by its pid, and every
probe it attached is closed, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from usdtpatch.kernelfacts import uprobe_syscall_errno
from usdtpatch.live.perf import Uprobe, online_cpus, open_uprobe, tracefs, uprobe_pmu_type
from usdtpatch.live.procfs import read_maps, read_mem
from usdtpatch.sequences.trampoline import TRAMPOLINE_NAME

Result = dict[str, Any]


class Program:
    """A started site program, stopped by its pid on close()."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self._buf = b""

    def line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no line from pid {self.pid} within {timeout} s")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise EOFError(f"pid {self.pid} closed its output")
            self._buf += chunk
        out, self._buf = self._buf.split(b"\n", 1)
        return out.decode(errors="replace")

    def say(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def close(self) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return self.proc.returncode


def site_address(pid: int, path: str, offset: int) -> int:
    real = os.path.realpath(path)
    for m in read_maps(pid):
        if m.path == real and m.offset <= offset < m.offset + (m.end - m.start):
            return int(m.start + offset - m.offset)
    raise RuntimeError(f"file offset {offset:#x} of {path} is not mapped in {pid}")


def trampolines(pid: int) -> list[list[int]]:
    return [[m.start, m.end] for m in read_maps(pid) if m.path == TRAMPOLINE_NAME]


def open_probes(path: str, offset: int) -> list[Uprobe]:
    """A counting uprobe at `offset` of `path` on every online CPU, every process (all closed
    again when one cannot be opened)."""
    opened: list[Uprobe] = []
    try:
        for cpu in online_cpus():
            opened.append(open_uprobe(path, offset, pid=-1, cpu=cpu))
    except BaseException:
        for p in opened:
            p.close()
        raise
    return opened


def check_kernel(_spec: Result) -> Result:
    out: Result = {"release": platform.release(), "uprobe_syscall_errno": uprobe_syscall_errno()}
    try:
        out["tracefs"] = tracefs()
    except Exception as exc:
        out["tracefs_error"] = str(exc)
    try:
        out["uprobe_pmu_type"] = uprobe_pmu_type()
    except Exception as exc:
        out["uprobe_pmu_error"] = str(exc)
    out["bpftrace"] = shutil.which("bpftrace")
    return out


def check_site(spec: Result) -> Result:
    path, form, n = spec["program"], spec["form"], int(spec["iterations"])
    length, site_offset, offset = int(spec["length"]), int(spec["site_offset"]), \
        int(spec["offset"])
    out: Result = {"attach_offset": offset, "site_offset": site_offset, "iterations": n}
    prog = Program([path, *spec.get("args", [form, str(n)])])
    try:
        ready = prog.line(60)
        assert ready == f"ready {prog.pid}", ready
        address = site_address(prog.pid, path, site_offset)
        out["address"] = address
        out["before"] = read_mem(prog.pid, address, length).hex()
        try:
            opened = open_probes(path, offset)
        except OSError as exc:
            out["attach_errno"] = exc.errno
            out["attach_error"] = str(exc)
            prog.say("go\n")
            prog.line(120)
            out["unprobed_after_run"] = read_mem(prog.pid, address, length).hex()
            prog.say("exit\n")
            return out
        try:
            out["attached"] = read_mem(prog.pid, address, length).hex()
            t0 = time.monotonic()
            prog.say("go\n")
            assert prog.line(180) == "done"
            out["run_seconds"] = round(time.monotonic() - t0, 3)
            per_cpu = [p.count() for p in opened]
            out["hits"] = sum(per_cpu)
            out["hits_per_cpu"] = per_cpu  # to tell a count off by a few where it came from
            out["after_hits"] = read_mem(prog.pid, address, length).hex()
            out["trampolines"] = trampolines(prog.pid)
        finally:
            for p in opened:
                p.close()
        out["detached"] = read_mem(prog.pid, address, length).hex()
        out["trampolines_after_detach"] = trampolines(prog.pid)
        prog.say("exit\n")
        with contextlib.suppress(subprocess.TimeoutExpired):
            prog.proc.wait(timeout=30)
    finally:
        out["exit_code"] = prog.close()
    return out


def check_kcheck(spec: Result) -> Result:
    path = spec["program"]
    argv = [sys.executable, "-m", "usdtpatch", "kcheck", "--json", path, "--", path,
            *spec["args"]]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=float(spec["timeout"]))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # kcheck detaches and stops its command on SIGTERM
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
    out: Result = {"exit_code": proc.returncode, "stderr": stderr[-4000:]}
    try:
        out["document"] = json.loads(stdout)
    except ValueError:
        out["stdout"] = stdout[-4000:]
    return out


def check_bpftrace(spec: Result) -> Result:
    argv = ["bpftrace", "-e", spec["script"], "-c", " ".join([spec["program"], *spec["args"]])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=float(spec["timeout"]))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # bpftrace detaches its probes on SIGINT
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
    return {"exit_code": proc.returncode, "stdout": stdout[-8000:], "stderr": stderr[-4000:]}


def check_run(spec: Result) -> Result:
    proc = subprocess.run([spec["program"], *spec["args"]], capture_output=True, text=True,
                          timeout=float(spec["timeout"]), check=False)
    return {"exit_code": proc.returncode, "stdout": proc.stdout[-8000:],
            "stderr": proc.stderr[-4000:]}


CHECKS = {"kernel": check_kernel, "site": check_site, "kcheck": check_kcheck,
          "bpftrace": check_bpftrace, "run": check_run}


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    doc: Result = {"results": {}, "seconds": {}}
    started = time.monotonic()
    for check in spec["checks"]:
        name = check["name"]
        t0 = time.monotonic()
        try:
            result = CHECKS[check["kind"]](check)
        except Exception as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        doc["results"][name] = result
        doc["seconds"][name] = round(time.monotonic() - t0, 3)
        doc["session_seconds"] = round(time.monotonic() - started, 3)
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
