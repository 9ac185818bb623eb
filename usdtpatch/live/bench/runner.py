"""The runner of `usdtpatch bench`: build the variants, run them interleaved and repeated,
report medians and ratios against the reference measured in the same run.

(a) The trigger program (trigger.c) in several builds, one site each:
    - stap-nop1: systemtap's sys/sdt.h (the 1-byte `nop` every distribution ships): the
      reference;
    - hdr-nop5 / hdr-combo5 / hdr-combo10 / hdr-nop1: usdtpatch's sys/sdt.h with
      -DUSDTPATCH_SITE_FORM=<form>;
    - rewritten: stap-nop1 rewritten by `usdtpatch rewrite` (the site becomes a nop5).
    Per run: the loop's time with a counting uprobe attached (perf_event_open on the uprobe
    PMU for the process, at the instruction `plan` says the kernel probes: combo5 -> the nop5
    at pc + 1), giving hits/s, and the loop's time with nothing attached, giving ns per pass.
(b) The JVM workload: OpenJDK 17 running Bench.java with -XX:+ExtendedDTraceProbes, every
    hotspot:method__entry and hotspot:method__return site of libjvm counted (one uprobe per
    site and CPU on the copy's libjvm, so no other process is touched), in a copy of the JDK
    (symlinks resolved) and in a second copy whose libjvm.so is rewritten. The system JDK is
    never modified. Per run: wall time traced and untraced, hits/s traced.

Every variant runs once per round, rounds repeat; the figures are medians over rounds.

Deferred imports: live/kcheck.py and sequences/plan.py (the sites to attach to), live/perf.py
(the uprobe PMU), platform, only when the bench builds or runs.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Protocol

from usdtpatch.errors import InputError, UnsupportedError
from usdtpatch.kernelfacts import (
    DEFAULT,
    Generation,
    generation_of_errno,
    uprobe_syscall_errno,
)
from usdtpatch.live.perf import Uprobe, open_uprobe

SYSTEM_JDK = Path("/usr/lib/jvm/java-17-openjdk-amd64")
HEADER_FORMS = ("nop5", "combo5", "combo10", "nop1")
REFERENCE = "stap-nop1"
JVM_REFERENCE = "jvm-original"
JVM_PROBES = ("method__entry", "method__return")

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    what: str
    program: Path  # trigger binary, or the JDK's bin/java
    probed: Path  # the file the uprobes go on
    sites: tuple[tuple[str, int], ...]  # (probe, file offset of the probed instruction)
    site_bytes: str  # the site's bytes (first site), for the table


@dataclass
class Measure:
    traced_ns: list[float] = field(default_factory=list)
    traced_hits: list[int] = field(default_factory=list)
    untraced_ns: list[float] = field(default_factory=list)

    def hits_per_s(self) -> list[float]:
        return [h / (ns / 1e9) for h, ns in zip(self.traced_hits, self.traced_ns, strict=True)
                if ns > 0]


@dataclass(frozen=True)
class Row:
    name: str
    what: str
    site: str
    runs: int
    hits: int  # median hits per traced run
    traced_hits_per_s: float  # median
    ratio_traced: float  # median over rounds of hits/s over the reference's in that round
    traced_ns_per_hit: float
    untraced_ns_per_pass: float  # trigger: loop ns / iterations; jvm: wall ms
    ratio_untraced: float  # median over rounds of this one's untraced time / the reference's
    ratio_traced_range: tuple[float, float] = (0.0, 0.0)  # lowest, highest round
    traced_wall_s: float | None = None  # jvm only
    untraced_wall_s: float | None = None


@dataclass(frozen=True)
class BenchReport:
    kernel: str
    cpu: str
    iterations: int
    jvm_calls: int
    repeats: int
    trigger: list[Row]
    jvm: list[Row]
    seconds: float
    notes: list[str]
    generation: str = ""  # the running kernel's (kernelfacts.GENERATIONS)
    # the rewritten site against a native build of its own form, traced: the median over
    # rounds of the rewritten variant's ns per hit over the native's in the same round, and
    # the lowest and highest round (empty when the run had no trigger program)
    same_form: str = ""  # the native variant compared with ("hdr-nop5", ...)
    same_form_ratio: tuple[float, float, float] = (0.0, 0.0, 0.0)


# ------------------------------------------------------------------------- machine facts


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def online_cpus() -> list[int]:
    try:
        text = Path("/sys/devices/system/cpu/online").read_text().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


# ------------------------------------------------------------------------------ building


def _data(name: str) -> str:
    return resources.files("usdtpatch.live.bench").joinpath(name).read_text()


class Rewritten(Protocol):
    """What the bench asks of a rewrite's outcome (usdtpatch.api.RewriteOutcome)."""

    @property
    def changed(self) -> bool: ...

    @property
    def failed(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Tools:
    """What the bench takes from above live/, passed in by the bench command (nothing below
    the library imports it): the library's rewrite (`usdtpatch.api.rewrite`), and the folder
    of usdtpatch's own sys/sdt.h (`usdtpatch.integrate.include_dir()`)."""

    rewrite: Callable[..., Rewritten]
    sdt_include: Path


def _run_cc(cc: str, args: list[str]) -> None:
    try:
        proc = subprocess.run([cc, *args], capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise UnsupportedError(f"bench: no C compiler {cc!r} (give --cc)") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        raise UnsupportedError(f"bench: {cc} {' '.join(args[-3:])}: {last}")


def _sites(path: Path, gen: Generation, names: Iterable[str] | None = None
           ) -> tuple[tuple[str, int], ...]:
    from usdtpatch.live.kcheck import load_probes, site_specs

    wanted = set(names) if names is not None else None
    specs = site_specs(load_probes(str(path)), str(path), gen=gen)
    out = tuple((s.probe, s.file_offset) for s in specs
                if not s.unprobeable and (wanted is None or s.probe.split(":")[-1] in wanted))
    if not out:
        raise InputError(f"{path}: no probe site to attach to")
    return out


def _site_bytes(path: Path, offset: int, gen: Generation) -> str:
    from usdtpatch.live.kcheck import NO_RED_ZONE, load_probes
    from usdtpatch.sequences.plan import plan_for

    for s in plan_for(load_probes(str(path)), str(path), gen.name, red_zone=NO_RED_ZONE).sites:
        if s.file_offset == offset and s.sequences is not None:
            return s.sequences.original.hex(" ")
    return "?"


def rewrite_form(gen: Generation) -> str:
    """The form bench rewrites the trigger program to on a kernel of `gen`: the one that
    generation optimizes, or the default generation's where it optimizes nothing (measured
    there as the int3 path it is)."""
    return gen.auto_form or DEFAULT.auto_form or "nop5"


def build_trigger(work: Path, tools: Tools, cc: str = "cc",
                  gen: Generation = DEFAULT) -> list[Variant]:
    """The trigger program's builds (see the module docstring), attached where the consumers
    of `gen` attach, the rewritten one in `gen`'s form (rewrite_form)."""
    from usdtpatch.live.kcheck import load_probes

    src = work / "trigger.c"
    src.write_text(_data("trigger.c"))
    out: list[Variant] = []

    def add(name: str, what: str, binary: Path) -> None:
        sites = _sites(binary, gen)
        out.append(Variant(name=name, what=what, program=binary, probed=binary, sites=sites,
                           site_bytes=_site_bytes(binary, sites[0][1], gen)))

    stap = work / REFERENCE
    _run_cc(cc, ["-O2", str(src), "-o", str(stap)])
    probes = load_probes(str(stap)).probes
    if not probes or probes[0].code[:1] != b"\x90":
        raise UnsupportedError("bench: the system's sys/sdt.h is not systemtap's 1-byte nop "
                               "(install systemtap-sdt-dev)")
    add(REFERENCE, "systemtap sys/sdt.h (1-byte nop)", stap)
    inc = tools.sdt_include
    for form in HEADER_FORMS:
        binary = work / f"hdr-{form}"
        _run_cc(cc, ["-O2", f"-I{inc}", f"-DUSDTPATCH_SITE_FORM={form}", str(src), "-o",
                     str(binary)])
        add(f"hdr-{form}", f"usdtpatch sys/sdt.h, {form}", binary)
    rw = work / "rewritten"
    form = rewrite_form(gen)
    outcome = tools.rewrite(stap, rw, form=form)
    if outcome.failed or not outcome.changed:
        raise UnsupportedError("bench: usdtpatch rewrite did not rewrite the trigger program")
    add("rewritten", f"stap-nop1 rewritten by usdtpatch (--form {form})", rw)
    return out


def build_jvm(work: Path, tools: Tools, jdk: Path = SYSTEM_JDK,
              progress: Progress | None = None, gen: Generation = DEFAULT) -> list[Variant]:
    """Two copies of `jdk` (the second hard-links the first's files), the second's libjvm
    rewritten; Bench.java compiled into work/classes."""

    if not (jdk / "lib" / "server" / "libjvm.so").exists():
        raise UnsupportedError(f"bench: no OpenJDK at {jdk} (give --jdk or --only trigger)")
    orig, rw = work / "jdk-original", work / "jdk-rewritten"
    if progress:
        progress(f"copying {jdk} (symlinks resolved)")
    if not orig.exists():
        try:  # symlinks resolved; a dangling one (lib/src.zip without the sources) is left
            shutil.copytree(jdk, orig, symlinks=False, ignore_dangling_symlinks=True)
        except (shutil.Error, OSError) as exc:
            shutil.rmtree(orig, ignore_errors=True)
            raise UnsupportedError(f"bench: cannot copy {jdk}: {exc}") from exc
    if not rw.exists():
        shutil.copytree(orig, rw, symlinks=False, copy_function=os.link)
        lib = rw / "lib" / "server" / "libjvm.so"
        tmp = lib.with_name("libjvm.so.orig")
        os.replace(lib, tmp)
        shutil.copy2(tmp, lib)  # its own inode: the uprobes of the two copies are apart
        tmp.unlink()
        if progress:
            progress("rewriting the copy's libjvm.so (verified; this takes a while)")
        outcome = tools.rewrite(lib, None, in_place=True, form=rewrite_form(gen))
        if outcome.failed:
            raise UnsupportedError("bench: usdtpatch rewrite failed on libjvm.so")
    classes = work / "classes"
    if not (classes / "Bench.class").exists():
        classes.mkdir(exist_ok=True)
        (work / "Bench.java").write_text(_data("Bench.java"))
        javac = orig / "bin" / "javac"
        exe = str(javac) if javac.exists() else shutil.which("javac")
        if exe is None:
            raise UnsupportedError("bench: no javac (install openjdk-17-jdk-headless)")
        proc = subprocess.run([exe, "-d", str(classes), str(work / "Bench.java")],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise UnsupportedError(f"bench: javac failed: {proc.stderr.strip()[-300:]}")
    out = []
    for name, home, what in [(JVM_REFERENCE, orig, "OpenJDK 17 copy, libjvm as shipped"),
                             ("jvm-rewritten", rw, "the copy with libjvm rewritten")]:
        lib = home / "lib" / "server" / "libjvm.so"
        sites = _sites(lib, gen, JVM_PROBES)
        out.append(Variant(name=name, what=what, program=home / "bin" / "java", probed=lib,
                           sites=sites, site_bytes=_site_bytes(lib, sites[0][1], gen)))
    return out


# ------------------------------------------------------------------------------- running


def _close(uprobes: list[Uprobe]) -> None:
    for u in uprobes:
        u.close()


def run_trigger(v: Variant, iterations: int, traced: bool) -> tuple[float, int]:
    """(loop ns, hits counted) of one run of a trigger build."""
    proc = subprocess.Popen([str(v.program), str(iterations)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    uprobes: list[Uprobe] = []
    try:
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise UnsupportedError(f"bench: {v.program} did not start")
        if traced:
            uprobes = [open_uprobe(str(v.probed), off, pid=proc.pid) for _, off in v.sites]
        out, _ = proc.communicate("go\n", timeout=600)
        hits = sum(u.count() for u in uprobes)
    finally:
        _close(uprobes)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ns = next((float(w[3:]) for w in out.split() if w.startswith("ns=")), None)
    if proc.returncode != 0 or ns is None:
        raise UnsupportedError(f"bench: {v.name} failed: {out.strip()[-200:]}")
    return ns, hits


def run_jvm(v: Variant, calls: int, classes: Path, traced: bool) -> tuple[float, int]:
    """(wall ns, hits counted) of one JVM run."""
    uprobes: list[Uprobe] = []
    try:
        if traced:
            for _, off in v.sites:
                for cpu in online_cpus():
                    uprobes.append(open_uprobe(str(v.probed), off, pid=-1, cpu=cpu))
        t0 = time.perf_counter_ns()
        proc = subprocess.run([str(v.program), "-XX:+ExtendedDTraceProbes", "-Xshare:auto",
                               "-cp", str(classes), "Bench", str(calls)],
                              capture_output=True, text=True, check=False, timeout=1800)
        wall = time.perf_counter_ns() - t0
        hits = sum(u.count() for u in uprobes)
    finally:
        _close(uprobes)
    if proc.returncode != 0 or "sum=" not in proc.stdout:
        raise UnsupportedError(f"bench: {v.name} failed: {proc.stderr.strip()[-300:]}")
    return float(wall), hits


def _paired(values: list[float], ref: list[float], invert: bool = False) -> list[float]:
    """Per-round ratios against the reference's run of the same round (a drifting load hits
    both alike)."""
    out = []
    for v, r in zip(values, ref, strict=True):
        if v > 0 and r > 0:
            out.append(r / v if invert else v / r)
    return out


def median_rows(variants: list[Variant], data: dict[str, Measure], per: int, reference: str,
                jvm: bool) -> list[Row]:
    """Each variant's row: its medians, and its ratios to `reference` per round."""
    ref = data[reference]
    rows = []
    for v in variants:
        m = data[v.name]
        hps = statistics.median(m.hits_per_s()) if m.hits_per_s() else 0.0
        hits = int(statistics.median(m.traced_hits)) if m.traced_hits else 0
        un = statistics.median(m.untraced_ns)
        tr = statistics.median(m.traced_ns)
        rt = _paired(m.hits_per_s(), ref.hits_per_s())
        ru = _paired(m.untraced_ns, ref.untraced_ns)
        rows.append(Row(name=v.name, what=v.what, site=v.site_bytes, runs=len(m.untraced_ns),
                        hits=hits, traced_hits_per_s=hps,
                        ratio_traced=statistics.median(rt) if rt else 0.0,
                        traced_ns_per_hit=tr / hits if hits else 0.0,
                        untraced_ns_per_pass=un / 1e6 if jvm else un / per,
                        ratio_untraced=statistics.median(ru) if ru else 0.0,
                        ratio_traced_range=(min(rt), max(rt)) if rt else (0.0, 0.0),
                        traced_wall_s=tr / 1e9 if jvm else None,
                        untraced_wall_s=un / 1e9 if jvm else None))
    return rows


def bench(tools: Tools, *, iterations: int = 2_000_000, repeats: int = 5,
          jvm_calls: int = 2_000_000, trigger: bool = True, jvm: bool = True, cc: str = "cc",
          jdk: Path = SYSTEM_JDK, workdir: Path | None = None,
          progress: Progress | None = None) -> BenchReport:
    """Build (with `tools`), run interleaved `repeats` rounds, and report medians and
    ratios."""
    import platform

    from usdtpatch.live.perf import uprobe_pmu_type

    if os.geteuid() != 0:
        raise UnsupportedError("bench needs root (perf_event_open uprobes)")
    uprobe_pmu_type()
    if iterations < 1 or repeats < 1 or jvm_calls < 1:
        raise InputError("bench: counts must be positive")
    found, how = generation_of_errno(uprobe_syscall_errno())
    gen = found if found is not None else DEFAULT
    notes = [f"this kernel: {how}" + ("" if found is not None else
                                      f"; measured as the {gen.name} generation's sites")]
    if not gen.optimizes:
        notes.append("this kernel optimizes no uprobe: every site takes the int3 path")
    t0 = time.monotonic()
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="usdtpatch-bench-")
        work = Path(tmp.name)
    else:
        work = workdir
        work.mkdir(parents=True, exist_ok=True)
    try:
        tv = build_trigger(work, tools, cc, gen) if trigger else []
        jv = build_jvm(work, tools, jdk, progress, gen) if jvm else []
        data = {v.name: Measure() for v in [*tv, *jv]}
        for r in range(repeats):
            if progress:
                progress(f"round {r + 1} of {repeats}")
            for v in tv:  # interleaved: every variant once per round, traced then not
                ns, hits = run_trigger(v, iterations, True)
                if hits != iterations:
                    raise UnsupportedError(f"bench: {v.name}: {hits} hits counted for "
                                           f"{iterations} passes")
                data[v.name].traced_ns.append(ns)
                data[v.name].traced_hits.append(hits)
                data[v.name].untraced_ns.append(run_trigger(v, iterations, False)[0])
            for v in jv:
                ns, hits = run_jvm(v, jvm_calls, work / "classes", True)
                data[v.name].traced_ns.append(ns)
                data[v.name].traced_hits.append(hits)
                data[v.name].untraced_ns.append(run_jvm(v, jvm_calls, work / "classes",
                                                        False)[0])
        rows_t = median_rows(tv, data, iterations, REFERENCE, False) if tv else []
        native = f"hdr-{rewrite_form(gen)}"
        same = _same_form(data, "rewritten", native) if tv else (0.0, 0.0, 0.0)
        rows_j = median_rows(jv, data, 1, JVM_REFERENCE, True) if jv else []
    finally:
        if tmp is not None:
            tmp.cleanup()
    return BenchReport(kernel=platform.release(), cpu=cpu_model(), iterations=iterations,
                       jvm_calls=jvm_calls, repeats=repeats, trigger=rows_t, jvm=rows_j,
                       seconds=time.monotonic() - t0, notes=notes, generation=gen.name,
                       same_form=native if trigger else "", same_form_ratio=same)


def _same_form(data: dict[str, Measure], rewritten: str, native: str
               ) -> tuple[float, float, float]:
    """(median, lowest, highest) over rounds of `rewritten`'s traced ns per hit over
    `native`'s in the same round: the rewritten site's traced cost against a native build of
    its own form (0s when either did not run)."""
    a, b = data.get(rewritten), data.get(native)
    if a is None or b is None:
        return (0.0, 0.0, 0.0)
    per = [(ta / ha) / (tb / hb) for ta, ha, tb, hb in
           zip(a.traced_ns, a.traced_hits, b.traced_ns, b.traced_hits, strict=True)
           if ha and hb and tb]
    if not per:
        return (0.0, 0.0, 0.0)
    return (statistics.median(per), min(per), max(per))
