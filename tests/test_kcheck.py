"""`usdtpatch kcheck` on the running kernel: every nop5 site of a header-built program and of a
rewritten one is optimized as `plan` predicts and restored by detach; a program that forks
while its site is optimized loses its child to SIGSEGV at the site unless the fork guard is
in (header -DUSDTPATCH_FORK_GUARD=0 / rewrite --fork-guard never vs the defaults); --pid
watches a running process and leaves it running and unprobed, also when kcheck is
interrupted; the one-line refusals where kcheck cannot run (these need no kernel); and the
library function usdtpatch.kcheck the command is built on (its report, its refusals).

Every program started here is stopped by pid; kcheck closes its perf events itself, and the
tests check the site bytes afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StartProcess, default_sigint, runtime_address
from tests.helpers import NOP5_GEN
from usdtpatch import api
from usdtpatch.cli import main
from usdtpatch.errors import InputError, UnsupportedError
from usdtpatch.live import kcheck as kmod
from usdtpatch.live import perf
from usdtpatch.live.procfs import read_mem
from usdtpatch.report.kcheck import kcheck_json
from usdtpatch.x86.nops import NOP5

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "fixtures" / "src"
SDT_INCLUDE = ROOT / "sdt_headers"
SYSTEMTAP_SDT = Path("/usr/include/x86_64-linux-gnu/sys/sdt.h")  # Debian multiarch path

LOOP_C = r"""
#include <stdio.h>
#include <unistd.h>
#include <sys/sdt.h>
__attribute__((noipa)) long work(long x) { DTRACE_PROBE1(loop, tick, x); return x * 3 + 1; }
int main(void) {
    long s = 0;
    for (long i = 0; i < 10; i++) s += work(i);
    printf("ready %ld\n", s);
    fflush(stdout);
    for (;;) { s += work(s); usleep(1000); }
}
"""

THREADS_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <sys/sdt.h>
#define THREADS 4
#define HITS 1000
static long total[THREADS];
__attribute__((noipa)) long work(long x) { DTRACE_PROBE1(mt, tick, x); return x + 1; }
static void *run(void *arg) {
    long *t = arg;
    for (long i = 0; i < HITS; i++) *t += work(i);
    return NULL;
}
int main(void) {
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, run, &total[i]);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    work(0);
    printf("threads done\n");
    return 0;
}
"""


def _cc(args: list[str]) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    proc = subprocess.run(["gcc", *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """forms.c (3 probes) and fork.c (1 probe, forks): header-built with usdtpatch's sys/sdt.h
    (guard on / off) and rewritten from the systemtap 1-byte build (guard auto / never)."""
    if not SYSTEMTAP_SDT.exists():
        pytest.skip(f"{SYSTEMTAP_SDT} (systemtap-sdt-dev) is not installed")
    d = tmp_path_factory.mktemp("kcheck")
    out: dict[str, Path] = {}
    hdr = ["-O2", f"-I{SDT_INCLUDE}"]
    _cc([*hdr, str(SRC / "forms.c"), "-o", str(d / "forms-hdr")])
    _cc(["-O2", str(SRC / "forms.c"), "-o", str(d / "forms-stap")])
    _cc([*hdr, "-DUSE_FORK", str(SRC / "fork.c"), "-o", str(d / "fork-hdr")])
    _cc([*hdr, "-DUSE_FORK", "-DUSDTPATCH_FORK_GUARD=0", str(SRC / "fork.c"), "-o",
         str(d / "fork-hdr-noguard")])
    _cc(["-O2", "-DUSE_FORK", str(SRC / "fork.c"), "-o", str(d / "fork-stap")])
    for name, src, guard in [("forms-rw", "forms-stap", "auto"), ("fork-rw", "fork-stap", "auto"),
                             ("fork-rw-noguard", "fork-stap", "never")]:
        outcome = api.rewrite(d / src, d / name, fork_guard=guard)
        assert outcome.changed and not outcome.failed
        out[name] = d / name
    for name in ("forms-hdr", "forms-stap", "fork-hdr", "fork-hdr-noguard", "fork-stap"):
        out[name] = d / name
    return out


def _kcheck_json(args: list[str]) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(["kcheck", "--json", "--settle", "0.5", *args], out, err)
    doc = json.loads(out.getvalue()) if out.getvalue() else {}
    return rc, doc, err.getvalue()


# --- live: sites optimized as planned, restored ---------------------------------------------


@pytest.mark.live
@pytest.mark.needs_cc
@pytest.mark.parametrize("name", ["forms-hdr", "forms-rw"])
def test_every_nop5_site_optimized_as_planned_and_restored(built: dict[str, Path],
                                                           name: str) -> None:
    binary = built[name]
    rc, doc, err = _kcheck_json([str(binary), "--", str(binary)])
    assert rc == 0, (err, doc.get("problems"))
    assert doc["schema"] == "usdtpatch/kcheck" and doc["ok"] and doc["problems"] == []
    (proc,) = doc["processes"]
    assert proc["kind"] == "command" and proc["exit_code"] == 0 and proc["inspected"]
    assert len(proc["trampolines"]) == 1
    probes = {s["probe"] for s in proc["sites"]}
    assert probes == {"forms:entry", "forms:mid", "forms:loop"}
    for s in proc["sites"]:
        assert s["hits"] == 25, s
        assert s["original"] == NOP5.hex()
        assert s["optimized"] and s["attached"][:2] == "e8", s
        assert s["call_target"] == proc["trampolines"][0]
        assert s["planned_protocol"] == "nop5" and s["planned_trampoline"] == s["call_target"]
        assert s["matches_plan"] is True and s["attached"] == s["planned"]
        assert s["restored"] is True and s["detached"] == NOP5.hex()


@pytest.mark.live
@pytest.mark.needs_cc
def test_probe_filter_and_options_after_file(built: dict[str, Path]) -> None:
    binary = built["forms-hdr"]
    out, err = io.StringIO(), io.StringIO()
    rc = main(["kcheck", str(binary), "--probe", "forms:l*", "--settle", "0.2", "--json",
               "--", str(binary)], out, err)
    assert rc == 0, err.getvalue()
    (proc,) = json.loads(out.getvalue())["processes"]
    assert [s["probe"] for s in proc["sites"]] == ["forms:loop"]
    assert proc["sites"][0]["optimized"] and proc["sites"][0]["restored"]
    text = _refusal([str(binary), "--probe", "nothing:*", "--", str(binary)])
    assert "no probe matches nothing:*" in text


@pytest.mark.live
@pytest.mark.needs_cc
def test_a_1_byte_site_stays_on_the_int3_path_as_planned(built: dict[str, Path]) -> None:
    binary = built["forms-stap"]
    rc, doc, err = _kcheck_json([str(binary), "--", str(binary)])
    assert rc == 0, err
    for s in doc["processes"][0]["sites"]:
        assert s["hits"] == 25 and not s["optimized"]
        assert s["planned_protocol"] == "int3" and s["attached"] == "cc"
        assert s["matches_plan"] is True and s["restored"] is True and s["detached"] == "90"


@pytest.mark.live
@pytest.mark.needs_cc
def test_threads_are_followed(tmp_path: Path) -> None:
    (tmp_path / "mt.c").write_text(THREADS_C)
    binary = tmp_path / "mt"
    _cc(["-O2", "-pthread", f"-I{SDT_INCLUDE}", str(tmp_path / "mt.c"), "-o", str(binary)])
    rc, doc, err = _kcheck_json([str(binary), "--", str(binary)])
    assert rc == 0, (err, doc.get("problems"))
    (proc,) = doc["processes"]
    assert proc["threads"] == 5
    (s,) = proc["sites"]
    assert s["hits"] == 4 * 1000 + 1  # every thread's hits, the threads' own events
    assert s["optimized"] and s["matches_plan"] and s["restored"]


@pytest.mark.live
@pytest.mark.needs_cc
def test_a_rewritten_library_in_the_process(tmp_path: Path) -> None:
    """FILE is a library the command maps: fixtures/bin/uses-shared loads libprobes.so from
    its own directory ($ORIGIN): both are copied next to a rewritten libprobes.so."""
    bindir = ROOT / "fixtures" / "bin"
    shutil.copy2(bindir / "uses-shared", tmp_path / "uses-shared")
    lib = tmp_path / "libprobes.so"
    outcome = api.rewrite(bindir / "libprobes.so", lib)
    assert outcome.changed and not outcome.failed
    rc, doc, err = _kcheck_json([str(lib), "--", str(tmp_path / "uses-shared")])
    assert rc == 0, (err, doc.get("problems"))
    (proc,) = doc["processes"]
    assert proc["exit_code"] == 0
    hit = [s for s in proc["sites"] if s["hits"]]
    assert hit, proc["sites"]
    for s in hit:
        assert s["optimized"] and s["matches_plan"] and s["restored"], s


# --- live: the fork hazard, observed ---------------------------------------------------------


@pytest.mark.live
@pytest.mark.needs_cc
@pytest.mark.parametrize(("name", "survives"), [
    ("fork-hdr", True), ("fork-hdr-noguard", False), ("fork-rw", True),
    ("fork-rw-noguard", False)])
def test_fork_while_optimized(built: dict[str, Path], name: str, survives: bool) -> None:
    binary = built[name]
    rc, doc, err = _kcheck_json([str(binary), "--", str(binary)])
    procs = {p["kind"]: p for p in doc["processes"]}
    parent, child = procs["command"], procs["fork"]
    assert child["parent"] == parent["pid"]
    assert child["optimized_at_fork"] == 1  # the site was the call when the parent forked
    (site,) = parent["sites"]
    assert site["optimized"] and site["matches_plan"] and site["restored"]
    if survives:
        assert rc == 0, (err, doc["problems"])
        assert child["exit_code"] == 0 and doc["faults"] == []
        assert parent["exit_code"] == 0
    else:
        assert rc == 1
        assert child["exit_signal_name"] == "SIGSEGV"
        (fault,) = doc["faults"]
        assert fault["pid"] == child["pid"] and fault["signal_name"] == "SIGSEGV"
        assert fault["site"] == "fork:tick" and fault["in_trampoline"]
        assert fault["rip"] == parent["trampolines"][0]
        assert fault["return_address"] == site["address"] + 5
        assert any("SIGSEGV" in p and "fork:tick" in p for p in doc["problems"])
        assert parent["exit_code"] == 1  # fork.c reports its child's death


# --- live: --pid, and interrupted --------------------------------------------------------------


@pytest.fixture(scope="module")
def loop_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("kcheck-loop")
    (d / "loop.c").write_text(LOOP_C)
    _cc(["-O2", f"-I{SDT_INCLUDE}", str(d / "loop.c"), "-o", str(d / "loop")])
    return d / "loop"


def _start_loop(start_process: StartProcess, binary: Path) -> tuple[int, int]:
    proc = start_process([binary], stdout=subprocess.PIPE)
    line = proc.line(10)
    assert line is not None and line.startswith("ready"), line
    probe = api.load(binary).probes[0]
    assert probe.offset is not None
    return proc.pid, runtime_address(proc.pid, binary, probe.offset)


def _running(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    return state in ("R", "S")


@pytest.mark.live
@pytest.mark.needs_cc
def test_pid_mode_leaves_the_process_running_and_unprobed(
        loop_binary: Path, start_process: StartProcess) -> None:
    pid, site = _start_loop(start_process, loop_binary)
    rc, doc, err = _kcheck_json([str(loop_binary), "--pid", str(pid), "--duration", "0.5"])
    assert rc == 0, (err, doc.get("problems"))
    (proc,) = doc["processes"]
    assert proc["kind"] == "pid" and proc["pid"] == pid
    (s,) = proc["sites"]
    assert s["hits"] > 10 and s["optimized"] and s["matches_plan"] and s["restored"]
    assert read_mem(pid, site, 5) == NOP5
    time.sleep(0.05)
    assert _running(pid)  # detached: not stopped, not traced
    with open(f"/proc/{pid}/status") as f:
        assert "TracerPid:\t0" in f.read()


# Ctrl-C, and `timeout`'s or a closed terminal's signal: the same cleanup, 128 + the signal
STOPS = [pytest.param(signal.SIGINT, 130, id="SIGINT"),
         pytest.param(signal.SIGTERM, 143, id="SIGTERM"),
         pytest.param(signal.SIGHUP, 129, id="SIGHUP")]


@pytest.mark.live
@pytest.mark.needs_cc
@pytest.mark.parametrize(("stop", "status"), STOPS)
def test_interrupted_kcheck_leaves_no_probe(loop_binary: Path, start_process: StartProcess,
                                            stop: signal.Signals, status: int) -> None:
    pid, site = _start_loop(start_process, loop_binary)
    kc = start_process([sys.executable, "-m", "usdtpatch", "kcheck", str(loop_binary),
                        "--pid", str(pid), "--duration", "60"], stderr=subprocess.PIPE,
                       cwd=ROOT, preexec_fn=default_sigint)
    deadline = time.monotonic() + 20
    while read_mem(pid, site, 1) != b"\xe8":  # attached and hit: the site is the call
        assert time.monotonic() < deadline, "the site was never optimized under kcheck"
        time.sleep(0.02)
    kc.signal(stop)
    assert kc.proc.wait(timeout=30) == status
    assert read_mem(pid, site, 5) == NOP5
    with open(f"/proc/{pid}/status") as f:
        assert "TracerPid:\t0" in f.read()
    assert _running(pid)


@pytest.mark.live
@pytest.mark.needs_cc
@pytest.mark.parametrize(("stop", "status"), STOPS)
def test_interrupted_kcheck_stops_its_command(loop_binary: Path, start_process: StartProcess,
                                              stop: signal.Signals, status: int) -> None:
    kc = start_process([sys.executable, "-m", "usdtpatch", "kcheck", str(loop_binary), "--",
                        str(loop_binary)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       cwd=ROOT, preexec_fn=default_sigint)
    line = kc.line(20)  # the command's "ready", through kcheck's stdout
    assert line is not None and line.startswith("ready"), line
    with open(f"/proc/{kc.pid}/task/{kc.pid}/children") as f:
        (command,) = (int(w) for w in f.read().split())
    kc.signal(stop)
    assert kc.proc.wait(timeout=30) == status
    assert not os.path.exists(f"/proc/{command}")  # killed and reaped by kcheck


@pytest.mark.live
def test_descendants_left_running_are_detached_not_killed() -> None:
    fixture = ROOT / "fixtures" / "bin" / "nop5"  # not mapped by sh: nothing to inspect
    rc, doc, err = _kcheck_json([str(fixture), "--", "/bin/sh", "-c", "sleep 30 &"])
    left = [p["pid"] for p in doc["processes"] if p["exit_code"] is None
            and p["exit_signal"] is None]
    try:
        assert rc == 0, err
        (command,) = [p for p in doc["processes"] if p["kind"] == "command"]
        assert command["exit_code"] == 0
        assert len(left) == 1  # the sleep, still running after --settle
        with open(f"/proc/{left[0]}/status") as f:
            assert "TracerPid:\t0" in f.read()
        assert all(s["address"] is None for s in command["sites"])
    finally:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.live
def test_a_command_that_cannot_run_is_one_line(tmp_path: Path) -> None:
    fixture = ROOT / "fixtures" / "bin" / "nop5"
    out, err = io.StringIO(), io.StringIO()
    rc = main(["kcheck", str(fixture), "--", str(tmp_path / "missing")], out, err)
    assert rc == 2 and out.getvalue() == ""
    assert err.getvalue().count("\n") == 1 and "cannot run" in err.getvalue()


# --- refusals (no kernel needed) ---------------------------------------------------------------


def _refusal(args: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    rc = main(["kcheck", *args], out, err)
    assert rc == 2 and out.getvalue() == ""
    text = err.getvalue()
    assert text.count("\n") == 1 and "Traceback" not in text, text
    return text


FIXTURE = str(ROOT / "fixtures" / "bin" / "nop5")


def test_refuses_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in _refusal([FIXTURE, "--", "/bin/true"])


def test_refuses_without_the_uprobe_pmu(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(perf, "UPROBE_TYPE_PATH", str(tmp_path / "no-such-pmu"))
    assert "no uprobe PMU" in _refusal([FIXTURE, "--", "/bin/true"])


def test_refuses_an_answer_no_generation_gives(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """A kernel without the uprobe syscall is the generation that optimizes nothing (kcheck
    runs there: tests/test_live_guest_none.py); an answer no generation gives (a seccomp
    filter's EPERM) leaves kcheck nothing to plan with."""
    pmu = tmp_path / "type"
    pmu.write_text("9\n")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(perf, "UPROBE_TYPE_PATH", str(pmu))
    monkeypatch.setattr(kmod, "uprobe_syscall_errno", lambda: errno.EPERM)
    text = _refusal([FIXTURE, "--", "/bin/true"])
    assert "EPERM" in text and "no known kernel generation" in text
    monkeypatch.setattr(kmod, "uprobe_syscall_errno", lambda: errno.ENOSYS)
    assert kmod.kernel_support().name == "none"


def test_usage_needs_exactly_one_of_command_and_pid() -> None:
    assert "give a command" in _refusal([FIXTURE])
    err = io.StringIO()
    rc = main(["kcheck", FIXTURE, "--pid", str(os.getpid()), "--", "/bin/true"], io.StringIO(),
              err)
    assert rc == 2 and "Traceback" not in err.getvalue()


def test_a_file_without_probes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kmod, "kernel_support", lambda: NOP5_GEN)
    text = _refusal([str(ROOT / "fixtures" / "bin" / "noprobes"), "--", "/bin/true"])
    assert "noprobes" in text and "no USDT probe sites" in text


def test_a_pid_that_does_not_map_the_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("reading another process's maps needs root")
    monkeypatch.setattr(kmod, "kernel_support", lambda: NOP5_GEN)
    text = _refusal([FIXTURE, "--pid", str(os.getpid())])
    assert "not mapped in pid" in text


@pytest.mark.live
@pytest.mark.slow
def test_rewritten_libjvm_in_a_java_run(tmp_path: Path) -> None:
    """A real workload: a copy of OpenJDK 17 with its libjvm rewritten (usdtpatch bench's
    preparation; the system JDK is never modified) runs Bench.java with its method probes."""
    from usdtpatch.live.bench import runner

    if not (runner.SYSTEM_JDK / "lib" / "server" / "libjvm.so").exists():
        pytest.skip(f"no OpenJDK 17 at {runner.SYSTEM_JDK}")
    from usdtpatch import integrate

    _orig, rw = runner.build_jvm(tmp_path, runner.Tools(api.rewrite, integrate.include_dir()))
    java = [str(rw.program), "-XX:+ExtendedDTraceProbes", "-cp", str(tmp_path / "classes"),
            "Bench", "20000"]
    rc, doc, err = _kcheck_json([str(rw.probed), "--probe", "hotspot:method__*", "--",
                                 *java])
    assert rc == 0, (err, doc.get("problems"))
    (proc,) = [p for p in doc["processes"] if p["kind"] == "command"]
    assert proc["exit_code"] == 0 and proc["threads"] > 5
    sites = {s["probe"]: s for s in proc["sites"]}
    for name in ("hotspot:method__entry", "hotspot:method__return"):
        s = sites[name]
        assert s["hits"] >= 20000 and s["optimized"] and s["matches_plan"] and s["restored"]


# --- the checker shown bad runs -------------------------------------------------------------


@pytest.mark.live
@pytest.mark.needs_cc
def test_bytes_unlike_the_plan_fail_the_run(built: dict[str, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that predicts other bytes than the kernel writes (its rel32 off by one page),
    with a placement rule that does not explain the kernel's page either, makes every
    optimized site a problem and kcheck exit 1."""
    real = kmod.process_plan

    def wrong(ps: Any, path: str, maps: Any, gen: Any) -> Any:
        plan = real(ps, path, maps, gen)
        assert plan is not None
        (t,) = {s.sequences.trampoline for s in plan.sites
                if s.sequences is not None and s.sequences.trampoline is not None}
        return api.plan(path, load_base=plan.load_base, trampoline=t - 0x1000)

    monkeypatch.setattr(kmod, "process_plan", wrong)
    # and the placement rule kcheck explains a moved trampoline with, wrong the same way
    import usdtpatch.sequences.trampoline as tmod

    rule = tmod.place_trampoline

    def wrong_rule(*args: Any, **kw: Any) -> Any:
        got = rule(*args, **kw)
        return tmod.Placement(None if got.address is None else got.address - 0x1000,
                              got.reused, got.reason)

    monkeypatch.setattr(tmod, "place_trampoline", wrong_rule)
    binary = built["forms-hdr"]
    rc, doc, err = _kcheck_json([str(binary), "--", str(binary)])
    assert rc == 1 and not doc["ok"], err
    (proc,) = doc["processes"]
    assert all(s["optimized"] and s["matches_plan"] is False for s in proc["sites"])
    assert len(doc["problems"]) == len(proc["sites"])
    assert all("are not the plan's" in p for p in doc["problems"])


def test_a_detach_that_left_bytes_is_a_problem() -> None:
    site = kmod.SiteResult(probe="p:n", index=0, file_offset=0x1000, address=0x401000,
                           original=NOP5, attached=b"\xcc" + NOP5[1:],
                           planned=b"\xcc" + NOP5[1:], matches_plan=True,
                           detached=b"\xcc" + NOP5[1:], restored=False)
    proc = kmod.ProcessResult(pid=7, kind="command", sites=[site])
    rep = kmod.KcheckReport(path="x", command=["x"], pid=None, kernel="6.18", processes=[proc],
                            faults=[], seconds=0.0)
    assert rep.problems == ["pid 7 p:n: detach left cc 1f 44 00 00, not 0f 1f 44 00 00"]
    assert not kcheck_json(rep)["ok"]
    site.restored = True
    assert rep.problems == [] and kcheck_json(rep)["ok"]


# --- the library function: usdtpatch.kcheck ---------------------------------------------------


def test_the_package_exports_kcheck() -> None:
    import usdtpatch

    assert "kcheck" in usdtpatch.__all__ and usdtpatch.kcheck is api.kcheck


@pytest.mark.live
def test_api_kcheck_runs_a_command_and_returns_the_report() -> None:
    told: list[str] = []
    rep = api.kcheck(Path(FIXTURE), command=[FIXTURE], settle=0.2, progress=told.append)
    assert isinstance(rep, kmod.KcheckReport)
    assert rep.path == FIXTURE and rep.command == [FIXTURE] and rep.pid is None
    assert rep.problems == [] and kcheck_json(rep)["ok"]
    (proc,) = rep.processes
    assert proc.kind == "command" and proc.exit_code == 0 and proc.inspected
    assert {s.probe for s in proc.sites} == {"forms:entry", "forms:mid", "forms:loop"}
    for s in proc.sites:
        assert s.hits == 25 and s.optimized and s.matches_plan and s.restored, s
    assert any("site(s) optimized, detached" in line for line in told), told


@pytest.mark.live
@pytest.mark.needs_cc
def test_api_kcheck_watches_a_running_process_and_leaves_it_running(
        loop_binary: Path, start_process: StartProcess) -> None:
    pid, site = _start_loop(start_process, loop_binary)
    rep = api.kcheck(loop_binary, pid=pid, duration=0.3, probes=["loop:*"])
    assert rep.pid == pid and rep.command is None and rep.problems == []
    (proc,) = rep.processes
    (s,) = proc.sites
    assert proc.kind == "pid" and s.probe == "loop:tick"
    assert s.hits > 0 and s.optimized and s.matches_plan and s.restored
    assert read_mem(pid, site, 5) == NOP5
    time.sleep(0.05)
    assert _running(pid)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({}, "give `command` or `pid`"),
    ({"command": ["/bin/true"], "pid": 1}, "give `command` or `pid`"),
    ({"command": []}, "`command` is empty"),
    ({"command": "/bin/true"}, "not a string"),
    ({"command": ["/bin/true"], "probes": "forms:*"}, "not a string"),
    ({"pid": 1, "duration": 0}, r"duration=0: expected seconds > 0"),
    ({"pid": 1, "duration": float("nan")}, r"duration=nan"),
    ({"command": ["/bin/true"], "settle": -1}, r"settle=-1: expected seconds >= 0"),
])
def test_api_kcheck_refuses_arguments_that_do_not_fit(
        monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], says: str) -> None:
    asked: list[bool] = []
    monkeypatch.setattr(kmod, "kernel_support", lambda: asked.append(True))
    with pytest.raises(ValueError, match=says):
        api.kcheck(FIXTURE, **kwargs)
    assert asked == []  # refused before the kernel or any process is touched


def test_api_kcheck_refuses_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    # the library's errors name the file they arise over (issue 47, item 9)
    with pytest.raises(UnsupportedError, match=rf"^{FIXTURE}: kcheck needs root"):
        api.kcheck(FIXTURE, command=["/bin/true"])


def test_api_kcheck_refuses_a_file_without_sites_or_no_file(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.setattr(kmod, "kernel_support", lambda: NOP5_GEN)
    noprobes = str(ROOT / "fixtures" / "bin" / "noprobes")
    with pytest.raises(InputError, match=r"noprobes: no USDT probe sites to attach to$"):
        api.kcheck(noprobes, command=["/bin/true"])
    with pytest.raises(InputError, match="missing"):
        api.kcheck(tmp_path / "missing", pid=os.getpid())


def _report(restored: bool) -> kmod.KcheckReport:
    site = kmod.SiteResult(probe="forms:loop", index=0, file_offset=0x107D, address=0x401000,
                           original=NOP5, hits=3, attached=b"\xe8" + bytes(4), optimized=True,
                           planned_protocol="nop5", planned=b"\xe8" + bytes(4),
                           matches_plan=True, detached=NOP5 if restored else b"\xcc" + NOP5[1:],
                           restored=restored)
    proc = kmod.ProcessResult(pid=7, kind="command", sites=[site], exit_code=0, inspected=True)
    return kmod.KcheckReport(path=FIXTURE, command=["prog", "-x"], pid=None, kernel="6.18",
                             processes=[proc], faults=[], seconds=0.25)


def test_the_command_parses_calls_the_library_and_renders(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from usdtpatch.report.kcheck import kcheck_text

    calls: list[dict[str, Any]] = []
    reports = [_report(restored=True), _report(restored=False)]

    def library(path: str, **options: Any) -> kmod.KcheckReport:
        calls.append({"path": path, **options})
        return reports[len(calls) - 1]

    monkeypatch.setattr(api, "kcheck", library)
    out, err = io.StringIO(), io.StringIO()
    rc = main(["kcheck", FIXTURE, "--probe", "forms:*", "--settle", "0.3", "--", "prog", "-x"],
              out, err)
    assert (rc, err.getvalue()) == (0, "")
    assert calls[0] == {"path": FIXTURE, "command": ["prog", "-x"], "pid": None,
                        "probes": ["forms:*"], "duration": 5.0, "settle": 0.3,
                        "command_stdout": None}
    assert out.getvalue() == kcheck_text(reports[0])
    out = io.StringIO()
    rc = main(["kcheck", "--json", FIXTURE, "--pid", "42", "--duration", "1.5"], out, err)
    assert rc == 1  # the second report's detach left a byte
    assert calls[1] == {"path": FIXTURE, "command": None, "pid": 42, "probes": [],
                        "duration": 1.5, "settle": 2.0, "command_stdout": None}
    assert json.loads(out.getvalue()) == kcheck_json(reports[1])


@pytest.mark.parametrize(("option", "says"), [
    (["--duration", "0"], "'0': expected seconds > 0"),
    (["--duration", "soon"], "'soon' is not a number of seconds"),
    (["--settle", "-1"], "'-1': expected seconds >= 0"),
])
def test_the_command_refuses_bad_seconds(option: list[str], says: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Before FILE (the main parser) and after it (kcheck's own parsing of the options
    between FILE and --): argparse's usage error on stderr, exit 2."""
    for args in ([*option, FIXTURE, "--pid", "1"], [FIXTURE, *option, "--pid", "1"]):
        out = io.StringIO()
        assert main(["kcheck", *args], out, io.StringIO()) == 2
        printed = capsys.readouterr()
        assert out.getvalue() == "" and printed.out == ""
        assert f"argument --{option[0][2:]}: {says}" in printed.err, printed.err


# --- issue 24: the document apart from the command's output; sites x CPUs events ----------

PRINTS_C = r"""
#include <stdio.h>
#include <sys/sdt.h>
__attribute__((noipa)) long work(long x) { DTRACE_PROBE1(out, tick, x); return x + 1; }
int main(void) { long s = 0; for (long i = 0; i < 50; i++) s += work(i);
                 printf("the command's own output %ld\n", s); return 0; }
"""


@pytest.fixture(scope="module")
def prints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("kcheck_prints")
    (d / "prints.c").write_text(PRINTS_C)
    _cc(["-O2", f"-I{SDT_INCLUDE}", str(d / "prints.c"), "-o", str(d / "prints")])
    return d / "prints"


def _kcheck_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "usdtpatch", "kcheck", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.live
@pytest.mark.needs_cc
def test_json_on_stdout_holds_the_document_only(prints: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The traced command writes to kcheck's stderr under --json: stdout parses as JSON, on
    a narrow page too (the document is never laid out on the page: it was wrapped at
    $COLUMNS, a newline inside a string)."""
    monkeypatch.setenv("COLUMNS", "20")
    done = _kcheck_process([str(prints), "--json", "--", str(prints)])
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert done.stdout == json.dumps(doc, indent=2) + "\n"  # as made, not reflowed
    assert doc["schema"] == "usdtpatch/kcheck" and doc["ok"]
    assert "the command's own output" in done.stderr
    (proc,) = doc["processes"]
    (site,) = proc["sites"]
    assert site["hits"] == 50 and site["optimized"] and site["restored"]


@pytest.mark.live
@pytest.mark.needs_cc
@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_output_file_gets_the_report_and_stdout_the_command(prints: Path, tmp_path: Path,
                                                            as_json: bool) -> None:
    report = tmp_path / "kcheck.out"
    done = _kcheck_process([str(prints), "-o", str(report), *(["--json"] if as_json else []),
                            "--", str(prints)])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the command's own output 1275\n"
    text = report.read_text()
    if as_json:
        assert json.loads(text)["ok"]
    else:
        assert "0 problem(s)" in text and "the command's own output" not in text


def test_output_option_refuses_a_directory_before_running(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    rc = main(["kcheck", FIXTURE, "-o", str(tmp_path), "--json", "--", "/bin/true"], out=out,
              err=err)
    assert rc == 2 and out.getvalue() == ""
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "is a directory" in lines[0], err.getvalue()


MANY_THREADS_C = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void *idle(void *arg) { (void)arg; sleep(2); return NULL; }
int main(int argc, char **argv) {
    if (argc < 3 || !dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) return 1;
    int n = atoi(argv[2]);
    pthread_t *t = calloc(n, sizeof *t);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, idle, NULL);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    return 0;
}
"""
LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.needs_cc
def test_every_libjvm_site_in_a_200_thread_process_in_seconds(tmp_path: Path) -> None:
    """A copy of libjvm.so (531 sites; the original is never modified) dlopen()ed by a
    process that starts 200 threads: the events are one per CPU (not per site and thread),
    attach and detach take seconds, every site is restored. With one uprobe event per site
    and thread (the old way) this was 531 x 201 events, each closed in ~0.25 s here."""
    if not LIBJVM.exists():
        pytest.skip(f"needs {LIBJVM}")
    lib = tmp_path / "libjvm.so"
    shutil.copy2(LIBJVM, lib)
    (tmp_path / "threads.c").write_text(MANY_THREADS_C)
    prog = tmp_path / "threads"
    _cc(["-O2", "-pthread", str(tmp_path / "threads.c"), "-o", str(prog), "-ldl"])
    t0 = time.monotonic()
    rep = api.kcheck(lib, command=[str(prog), str(lib), "200"], settle=0.2)
    took = time.monotonic() - t0
    (proc,) = rep.processes
    assert proc.exit_code == 0 and proc.threads == 201
    probed = [s for s in proc.sites if not s.attach_error]
    assert len(probed) > 500
    assert all(s.restored for s in probed), [s.probe for s in probed if not s.restored][:5]
    assert rep.attach_seconds < 10 and rep.detach_seconds < 10, (rep.attach_seconds,
                                                                 rep.detach_seconds)
    assert took < 60, took


def test_a_path_with_white_space_is_refused_before_anything_is_defined() -> None:
    with pytest.raises(UnsupportedError, match="white space"):
        perf.SiteSampler("/tmp/a b/lib.so", [(0x1000, 0)])


@pytest.mark.live
def test_an_event_left_by_a_killed_kcheck_is_removed() -> None:
    """A kcheck killed before its cleanup leaves its trace event defined (never enabled: its
    perf events closed with the process); the next kcheck removes it."""
    root = perf.tracefs()
    dead = 2**22 + 12345  # above pid_max's default: no such process
    group = f"{perf.GROUP_PREFIX}{dead}_0"
    perf._write_event(root, f"p:{group}/sites {FIXTURE}:0x1000")
    try:
        assert group in Path(root, "uprobe_events").read_text()
        perf.remove_stale_events()
        assert group not in Path(root, "uprobe_events").read_text()
    finally:
        with contextlib.suppress(OSError):
            perf._write_event(root, f"-:{group}/sites")


@pytest.mark.live
def test_a_site_past_the_end_of_the_file_is_not_attached_and_the_rest_is() -> None:
    """The kernel refuses such a probe only when the event is enabled, and then refuses the
    whole event: the sampler leaves it out and says why."""
    sampler = perf.SiteSampler(FIXTURE, [(0x1000, 0), (10**9, 0)])
    try:
        assert sampler.errors == {1: "file offset 0x3b9aca00 past the end of the file"}
        assert sampler.event_count == len(perf.online_cpus())
    finally:
        sampler.close()
    assert f"{sampler.group}/" not in Path(perf.tracefs(), "uprobe_events").read_text()
