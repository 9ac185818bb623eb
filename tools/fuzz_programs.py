"""Differential fuzzing of whole programs (issue 32): `python -m tools.fuzz_programs`.

Each pair `(seed, index)` is one random program built one random way: a csmith program with
USDT probes (systemtap's sys/sdt.h: 1-byte NOP sites) put at random statement boundaries, or
one of the project's templates (tests/data/fuzz_programs/templates: jump-table switches,
computed goto, C++ exceptions, exceptions thrown from signal handlers, setjmp/longjmp, signal
handlers, threads, fork, vfork and clone children, TLS, a shared library called through the
PLT) with a random choice of its PROBE markers made probes. The
build is drawn from the same random stream: gcc or clang, -O0..-O3/-Os, PIE, non-PIE, static,
static-pie or a shared object with its driver, and any of -z pack-relative-relocs,
-fcf-protection, -mno-red-zone, -fno-omit-frame-pointer, no unwind tables, -g, stripped.

Every file with probes is rewritten with `usdtpatch rewrite` under the defaults; the original
and the rewritten program run side by side (a timeout each) and must print the same (csmith's
checksum), exit with the same code or die of the same signal. A seeded fraction also runs
traced with every probe attached (bpftrace: hits per probe and the sum of every argument it
can read): the counts and the sums must be equal. A difference is kept in the work folder and,
with `--reduce`, reduced by cvise to a small reproducer (the interestingness test is the same
class of difference, `--interesting`), kept in tests/data/fuzz_programs/found/ for the tests.
FUZZ_PROGRAMS_DAMAGE=trap breaks every detour on purpose (the tests of the oracle).

Results go to a JSON-lines file, one line per pair keyed by (seed, index), so several runs add
up: a run with a seed goes on after the last index that seed has in the file. `--summary`
prints the totals of the file. A run ends with one line of counts.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tests" / "data" / "fuzz_programs" / "templates"
RESULTS = ROOT / "build" / "fuzz-programs" / "results.jsonl"
WORK = ROOT / "build" / "fuzz-programs" / "work"
FOUND = ROOT / "tests" / "data" / "fuzz_programs" / "found"  # the reduced reproducers
CSMITH_INCLUDE = Path("/usr/include/csmith")
# the lock of the tests that attach the kernel's uprobes (tests/conftest.py uprobe_lock): the
# traced runs take it too, so that they never overlap a test that counts uprobes
UPROBE_LOCK = Path(tempfile.gettempdir()) / "usdtpatch-tests-uprobes.lock"

TRACED_PERCENT = 15  # of the pairs, also run traced
TEMPLATE_PERCENT = 25  # of the programs, a template rather than csmith
RUN_TIMEOUT = 5.0  # seconds per run of a program
LOCK_WAIT = 30.0  # seconds a traced pair waits for the uprobe tests' lock, else untraced
PROVIDER = "fz"

# names of the templates (files in TEMPLATES), with the library the program needs
TEMPLATE_LIBS = {"plt.c": "plt-lib.c"}
TEMPLATE_NAMES = sorted(p.name for p in TEMPLATES.glob("*.c*") if p.name != "plt-lib.c") \
    if TEMPLATES.is_dir() else []


# --- programs --------------------------------------------------------------------------------


@dataclass
class Program:
    kind: str  # "csmith" or the template's file name
    source: str  # C or C++ text with probes
    cxx: bool
    probes: int  # probes put in the source
    library: str | None = None  # a shared library's source (the PLT template)
    threads: bool = False


_INT_TYPES = ["int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t",
              "uint64_t"]
_CONSTANTS = [0, 1, -1, 7, 127, -128, 255, 0x7FFF, -0x8000, 0xFFFF, 0x12345678, -0x7FFFFFFF,
              0x7FFFFFFFFFFF, -0x123456789A]


def _constant(rng: random.Random) -> str:
    value = rng.choice(_CONSTANTS)
    return f"({rng.choice(_INT_TYPES)}){value}LL"


def _argument(rng: random.Random, names: Sequence[str]) -> str:
    """One probe argument: a variable (cast to a random size or not), an expression of
    variables in unsigned arithmetic (no undefined behaviour), or a constant."""
    roll = rng.random()
    if not names or roll < 0.15:
        return _constant(rng)
    a = rng.choice(names)
    if roll < 0.55:
        return a
    if roll < 0.75:
        return f"({rng.choice(_INT_TYPES)}){a}"
    b = rng.choice(names)
    op = rng.choice(["+", "^", "*", "-", "|"])
    return f"(({rng.choice(_INT_TYPES)})((uint64_t){a} {op} (uint64_t){b}))"


def _probe(rng: random.Random, number: int, names: Sequence[str]) -> str:
    count = rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5, 6])
    args = [_argument(rng, names) for _ in range(count)]
    if not args:
        return f"STAP_PROBE({PROVIDER}, p{number});"
    return f"STAP_PROBE{count}({PROVIDER}, p{number}, {', '.join(args)});"


_FUNC_RE = re.compile(r"^(?:static\s+)?[\w\s\*]*?\b(func_\d+|main)\s*\((.*)\)\s*$")
_PARAM_RE = re.compile(r"(?:const\s+)?(?:volatile\s+)?u?int(?:8|16|32|64)_t\s+(p_\d+)")
_LOCAL_RE = re.compile(r"^\s*(?:static\s+)?(?:const\s+)?(?:volatile\s+)?u?int(?:8|16|32|64)_t"
                       r"\s+(l_\d+)\s*=")
_GLOBAL_RE = re.compile(r"^static\s+(?:const\s+)?(?:volatile\s+)?u?int(?:8|16|32|64)_t"
                        r"\s+(g_\d+)\s*=")


def insert_probes(source: str, rng: random.Random) -> tuple[str, int]:
    """csmith's program with probes after random statements of its functions: each probe's
    arguments are scalars in scope (locals of the enclosing blocks, parameters, globals),
    expressions of them and constants. Returns the new text and the number of probes."""
    lines = source.splitlines()
    globals_ = [m[1] for ln in lines if (m := _GLOBAL_RE.match(ln))]
    spots: list[tuple[int, list[str]]] = []  # (line index to insert after, names in scope)
    scopes: list[list[str]] = []
    params: list[str] = []
    in_function = False
    for i, ln in enumerate(lines):
        if not in_function:
            m = _FUNC_RE.match(ln)
            if m and i + 1 < len(lines) and lines[i + 1].strip() == "{":
                in_function, params, scopes = True, _PARAM_RE.findall(m[2]), []
            continue
        if (m := _LOCAL_RE.match(ln)) and scopes:
            scopes[-1].append(m[1])
        for ch in ln:
            if ch == "{":
                scopes.append([])
            elif ch == "}" and scopes:
                scopes.pop()
        if not scopes:
            in_function = False
            continue
        stripped = ln.strip()
        if stripped.endswith(";") and not stripped.startswith(("return", "break", "continue",
                                                               "goto")):
            spots.append((i, [*params, *(n for s in scopes for n in s), *globals_]))
    if not spots:
        return source, 0
    chosen = sorted(rng.sample(range(len(spots)), min(len(spots), rng.randint(3, 14))))
    inserted: dict[int, str] = {}
    for number, k in enumerate(chosen):
        at, names = spots[k]
        inserted[at] = _probe(rng, number, names)
    out = []
    for i, ln in enumerate(lines):
        out.append(ln)
        if i in inserted:
            out.append("    " + inserted[i])
    text = "\n".join(out) + "\n"
    return text.replace('#include "csmith.h"', '#include "csmith.h"\n#include <sys/sdt.h>'), \
        len(inserted)


_MARKER_RE = re.compile(r"/\*@PROBE ?(.*?)\*/")


def fill_markers(text: str, rng: random.Random, first: int = 0) -> tuple[str, int]:
    """A template's `/*@PROBE names*/` markers: about two in three become probes with
    arguments drawn from the names (and expressions and constants), the rest stay comments."""
    count = 0

    def one(m: re.Match[str]) -> str:
        nonlocal count
        if rng.random() < 0.35:
            return m[0]
        names = [n.strip() for n in m[1].split(",") if n.strip()]
        count += 1
        return _probe(rng, first + count - 1, names)

    return _MARKER_RE.sub(one, text), count


def make_program(seed: int, index: int, rng: random.Random, workdir: Path,
                 kind: str | None = None) -> Program:
    """Pair `index`'s program (csmith's or a template's), from its own random stream; `kind`
    names the template (or "csmith") instead of drawing it."""
    template = TEMPLATE_NAMES and rng.randrange(100) < TEMPLATE_PERCENT
    name = rng.choice(TEMPLATE_NAMES) if TEMPLATE_NAMES else "csmith"
    if kind is not None:
        template, name = kind != "csmith", kind
    if template:
        text, n = fill_markers((TEMPLATES / name).read_text(), rng)
        lib = None
        if name in TEMPLATE_LIBS:
            lib, m = fill_markers((TEMPLATES / TEMPLATE_LIBS[name]).read_text(), rng, first=100)
            n += m
        return Program(name, text, name.endswith(".cc"), n, lib,
                       threads=name in ("threads.c", "tls.c"))
    csmith_seed = (seed * 1_000_003 + index) % (1 << 31)
    args = ["csmith", "--seed", str(csmith_seed), "--max-funcs", str(rng.randint(2, 6)),
            "--max-block-depth", str(rng.randint(2, 4)), "--no-packed-struct",
            "--no-bitfields", "-o", str(workdir / "csmith.c")]
    subprocess.run(args, check=True, capture_output=True, timeout=60, cwd=workdir)
    text, n = insert_probes((workdir / "csmith.c").read_text(), rng)
    return Program("csmith", text, False, n)


# --- builds ----------------------------------------------------------------------------------


@dataclass
class Build:
    compiler: str  # gcc or clang (g++/clang++ for C++)
    opt: str
    link: str  # pie, nopie, static, static-pie, shared
    flags: list[str] = field(default_factory=list)  # the extra ones drawn
    strip: bool = False

    def describe(self) -> str:
        return " ".join([self.compiler, self.opt, self.link, *self.flags,
                         *(["strip"] if self.strip else [])])


_LINK_FLAGS = {"pie": ["-fPIE", "-pie"], "nopie": ["-fno-pie", "-no-pie"],
               "static": ["-static"], "static-pie": ["-fPIE", "-static-pie"],
               "shared": ["-fPIC"]}
_EXTRA = ["-Wl,-z,pack-relative-relocs", "-fcf-protection=full", "-mno-red-zone",
          "-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables -fno-unwind-tables", "-g"]


def choose_build(rng: random.Random, program: Program) -> Build:
    compiler = rng.choice(["gcc", "clang"])
    opt = rng.choice(["-O0", "-O1", "-O2", "-O3", "-Os"])
    links = ["pie", "nopie", "static", "static-pie", "shared"]
    if program.library is not None:  # linked with its shared library
        links = ["pie", "nopie"]
    link = rng.choice(links)
    flags = [f for f in _EXTRA if rng.random() < 0.3]
    if program.cxx:
        flags = [f for f in flags if "unwind" not in f]  # exceptions need unwind tables
        # sigthrow.cc throws out of signal handlers, which only this flag makes defined
        if rng.random() < 0.5 or program.kind == "sigthrow.cc":
            flags.append("-fnon-call-exceptions")
    return Build(compiler, opt, link, flags, strip=rng.random() < 0.3)


def _compiler(build: Build, cxx: bool) -> str:
    if not cxx:
        return build.compiler
    return "g++" if build.compiler == "gcc" else "clang++"


class BuildFailed(Exception):
    pass


def _cc(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        raise BuildFailed(f"{shlex.join(argv)}: {done.stderr[-1500:]}")


def build_program(program: Program, build: Build, folder: Path) -> tuple[Path, list[Path]]:
    """Compile into folder: (the program to run, the files with probes to rewrite)."""
    src = folder / ("prog.cc" if program.cxx else "prog.c")
    src.write_text(program.source)
    cc = _compiler(build, program.cxx)
    common = [cc, "-w", build.opt, *" ".join(build.flags).split(), f"-I{CSMITH_INCLUDE}"]
    if program.threads:
        common.append("-pthread")
    exe = folder / "prog"
    probed: list[Path] = []
    if program.library is not None:
        (folder / "lib.c").write_text(program.library)
        _cc([build.compiler, *common[1:], "-fPIC", "-shared", "-o", "libfzplt.so", "lib.c"],
            folder)
        probed.append(folder / "libfzplt.so")
    if build.link == "shared":
        _cc([*common, "-fPIC", "-shared", "-Dmain=fz_main", "-o", "libfz.so", src.name], folder)
        driver = folder / ("driver.cc" if program.cxx else "driver.c")
        driver.write_text("int fz_main();\nint main() { return fz_main(); }\n" if program.cxx
                          else "int fz_main(int, char **);\n"
                          "int main(int argc, char **argv) { return fz_main(argc, argv); }\n")
        _cc([cc, "-O2", "-o", "prog", driver.name, "-L.", "-lfz", "-Wl,-rpath,$ORIGIN"],
            folder)
        probed.append(folder / "libfz.so")
    else:
        libs = ["-L.", "-lfzplt", "-Wl,-rpath,$ORIGIN"] if program.library is not None else []
        _cc([*common, *_LINK_FLAGS[build.link], "-o", "prog", src.name, *libs], folder)
        probed.append(exe)
    if build.strip:
        for p in probed:
            _cc(["strip", "--strip-unneeded" if p.suffix == ".so" else "--strip-all", p.name],
                folder)
    return exe, probed


# --- rewrite, run, trace ---------------------------------------------------------------------


@dataclass
class Rewrite:
    sites: int = 0
    rewritten: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    error: str | None = None  # the rewrite itself failed (exit 3, a traceback, a hang)


USDTPATCH = [sys.executable, "-m", "usdtpatch"]
# FUZZ_PROGRAMS_DAMAGE=trap: every detour's first byte becomes int3 after the rewrite, a
# broken rewrite on purpose (the tests' check that a difference is seen, kept and reduced)
DAMAGE = "FUZZ_PROGRAMS_DAMAGE"


def _poke(path: Path, vaddr: int, data: bytes) -> None:
    from usdtpatch.elf.image import parse_elf

    blob = bytearray(path.read_bytes())
    offset = parse_elf(bytes(blob)).vaddr_to_offset(vaddr)
    if offset is not None:
        blob[offset:offset + len(data)] = data
        path.write_bytes(bytes(blob))


def rewrite_files(files: Sequence[Path], out: Path, usdtpatch: Sequence[str] = USDTPATCH
                  ) -> Rewrite:
    """`usdtpatch rewrite --json -o out/` of the files, under the defaults; the counts."""
    out.mkdir(exist_ok=True)
    argv = [*usdtpatch, "rewrite", "--json", "-o",
            str(out if len(files) > 1 else out / files[0].name), *map(str, files)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT,
                              check=False, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    except subprocess.TimeoutExpired:
        return Rewrite(error="rewrite timed out (600 s)")
    result = Rewrite()
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        return Rewrite(error=f"exit {done.returncode}: {done.stderr[-1500:]}")
    # exit 2 with errors and one line each is a file refused as a whole (e.g. a fork guard
    # that cannot be added): its sites count as refused, by the refusal's words; anything
    # else (exit 3, a traceback) is the rewrite failing
    refusal = done.returncode == 2 and bool(doc.get("errors")) and \
        all(ln.startswith("usdtpatch: ") for ln in done.stderr.splitlines())
    if (done.returncode not in (0, 1) and not refusal) or "Traceback" in done.stderr:
        result.error = f"exit {done.returncode}: {done.stderr[-1500:]}"
    refused: Counter[str] = Counter()
    for f in doc.get("files", []):
        for s in f["sites"]:
            result.sites += 1
            if s["action"] == "skipped":
                refused[s["code"] or "skipped"] += 1
            else:
                result.rewritten += 1
    for e in doc.get("errors", []):
        try:
            n = len(_notes(Path(e["path"])))
        except Exception:  # not an ELF file usdtpatch reads: no sites
            n = 0
        result.sites += n
        refused["file: " + re.split(r" \(|:", e.get("error", "error"), maxsplit=1)[0]] += n
    result.refused = dict(refused)
    if os.environ.get(DAMAGE) == "trap":  # the oracle's own test: every detour traps
        for f in doc.get("files", []):
            output = Path(f["output"]) if f.get("output") else None
            for s in f["sites"]:
                if s.get("detour") and output is not None and output.is_file():
                    _poke(output, s["detour"]["address"], b"\xcc")
    for f in files:  # a file rewrite refused as a whole is run as it was
        if not (out / f.name).exists():
            shutil.copy2(f, out / f.name)
    return result


@dataclass(frozen=True)
class Outcome:
    stdout: str
    code: int | None  # exit code, None when it died of a signal or hung
    signal: int | None
    timeout: bool

    def describe(self) -> str:
        if self.timeout:
            return "timeout"
        return f"signal {self.signal}" if self.signal is not None else f"exit {self.code}"


def run(exe: Path, timeout: float = RUN_TIMEOUT) -> Outcome:
    """Run a program in its folder (its libraries found by rpath); its process group is
    killed at the timeout."""
    proc = subprocess.Popen([str(exe)], cwd=exe.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return Outcome(out.decode(errors="replace"), None, None, True)
    rc = proc.returncode
    text = out.decode(errors="replace")
    return Outcome(text, None, -rc, False) if rc < 0 else Outcome(text, rc, None, False)


def compare_runs(a: Outcome, b: Outcome) -> str | None:
    """None when the rewritten run (b) is the original's (a); else what differs."""
    if a.timeout != b.timeout or a.signal != b.signal or a.code != b.code:
        return f"original {a.describe()}, rewritten {b.describe()}"
    if a.stdout != b.stdout:
        return f"output: original {a.stdout[-200:]!r}, rewritten {b.stdout[-200:]!r}"
    return None


@contextmanager
def uprobe_lock(wait: float) -> Iterator[bool]:
    """Hold the uprobe tests' lock if it can be had within `wait` seconds (True), else go on
    without it (False): the campaign then leaves that pair untraced rather than wait behind
    a test run for minutes."""
    with open(UPROBE_LOCK, "a+") as fd:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.5)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _notes(path: Path) -> list[tuple[str, str, str]]:
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.elf.notes import SdtNote, parse_notes

    image = parse_elf(path.read_bytes())
    sec = image.section(".note.stapsdt")
    if sec is None:
        return []
    notes = parse_notes(image.section_data(sec), image.word_size, image.byteorder).notes
    return [(n.provider, n.name, n.args) for n in notes if isinstance(n, SdtNote)]


def trace_script(files: Sequence[Path]) -> str:
    """bpftrace: hits per probe, and the sum of each argument bpftrace can read (not the
    rip-relative ones: bpftrace 0.17 cannot). The same script for a file and its rewrite
    but for the paths."""
    parts = []
    for path in files:
        seen: set[tuple[str, str]] = set()
        for provider, name, args in _notes(path):
            if (provider, name) in seen:
                continue
            seen.add((provider, name))
            body = [f'@hits["{path.name}:{name}"] = count();']
            for k, arg in enumerate(args.split()[:6]):
                # the arguments of the probes we put in; the libraries' probes (libgcc's,
                # libstdc++'s, ld.so's in a static program) pass addresses that ASLR moves
                if provider == PROVIDER and "(%rip)" not in arg and "%fs" not in arg:
                    body.append(f'@args["{path.name}:{name}", {k}] = sum(arg{k});')
            parts.append(f"usdt:{path}:{provider}:{name} {{ {' '.join(body)} }}")
    return "\n".join(parts)


TRACER_LOST = "bpftrace ended without its maps"
STOP_WAIT = 20.0  # seconds bpftrace gets to print its maps and stop after SIGTERM


def trace(exe: Path, files: Sequence[Path], timeout: float = 180) -> dict[str, int] | str:
    """trace_once, again when bpftrace lost its maps (at most three times)."""
    result = trace_once(exe, files, timeout)
    for _ in range(2):
        if not (isinstance(result, str) and result.startswith(TRACER_LOST)):
            break
        result = trace_once(exe, files, timeout)
    return result


def trace_once(exe: Path, files: Sequence[Path], timeout: float = 180
               ) -> dict[str, int] | str:
    """The maps bpftrace prints ({"@hits[...]": n, ...}) with every probe of the files
    attached while the program runs (started by us once bpftrace's BEGIN says the probes are
    attached: its children are counted too), or why there are none (a string). The caller
    holds the uprobe tests' lock."""
    script = trace_script(files)
    if not script:
        return {}
    # READY: the probes are attached; @started: the maps were printed at the end (a map is
    # printed at exit whatever happened to the perf buffer an END printf would go through)
    script = 'BEGIN { @started = count(); printf("READY\\n"); }\n' + script
    tracer = subprocess.Popen(["bpftrace", "-e", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, BPFTRACE_MAX_PROBES="2048"))
    watchdog = threading.Timer(timeout, tracer.kill)
    watchdog.start()
    ran: Outcome | None = None
    try:
        assert tracer.stdout is not None
        ready = any(ln.strip() == "READY" for ln in iter(tracer.stdout.readline, ""))
        if ready:
            ran = run(exe)
        tracer.send_signal(signal.SIGTERM)  # bpftrace 0.17 prints its maps at SIGTERM
        try:
            out, err = tracer.communicate(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:  # now and then it never stops here: lost
            tracer.kill()
            out, err = tracer.communicate()
    finally:
        watchdog.cancel()
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
    if not ready:
        return f"bpftrace did not start: {err[-600:]}"
    if ran is None or ran.timeout:
        return "timeout while traced"
    if "@started: 1" not in out.splitlines():
        return f"{TRACER_LOST} (exit {tracer.returncode}): {out[-300:]!r} {err[-300:]!r}"
    maps: dict[str, int] = {}
    for ln in out.splitlines():
        m = re.match(r"^(@\w+\[.*\]): (-?\d+)$", ln)
        if m:
            maps[m[1]] = int(m[2])
    return maps


def compare_traces(a: dict[str, int] | str, b: dict[str, int] | str) -> str | None:
    """None when the rewritten program's trace (b) is the original's (a)."""
    if isinstance(a, str) or isinstance(b, str):
        if isinstance(a, str) and isinstance(b, str):
            return None  # neither could be traced: not a difference of the rewrite
        return f"traced: original {a if isinstance(a, str) else 'ran'}, " \
               f"rewritten {b if isinstance(b, str) else 'ran'}"
    diffs = [f"{k}: {a.get(k)} vs {b.get(k)}" for k in sorted(set(a) | set(b))
             if a.get(k) != b.get(k)]
    if diffs:
        kind = "counts" if any(d.startswith("@hits") for d in diffs) else "arguments"
        return f"traced {kind}: " + "; ".join(diffs[:6])
    return None


# --- one pair --------------------------------------------------------------------------------


@dataclass
class Pair:
    seed: int
    index: int
    program: str = ""
    build: str = ""
    probes: int = 0
    sites: int = 0
    rewritten: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    traced: bool = False
    skipped: str | None = None  # not compared, and why (a build error, the original hangs)
    trace_hits: int | None = None  # traced: the probe hits counted in the original (or None)
    difference: str | None = None
    seconds: float = 0.0


def pair_random(seed: int, index: int) -> random.Random:
    return random.Random(f"fuzz-programs {seed} {index}")


def run_pair(seed: int, index: int, folder: Path, traced_percent: int = TRACED_PERCENT,
             kind: str | None = None) -> Pair:
    """Make, build, rewrite, run (and maybe trace) pair (seed, index) in folder; `kind`
    names its program's template (or "csmith") instead of drawing it."""
    started = time.monotonic()
    folder = folder.absolute()  # its programs run with their own folder as working directory
    rng = pair_random(seed, index)
    pair = Pair(seed, index)
    folder.mkdir(parents=True, exist_ok=True)
    program = make_program(seed, index, rng, folder, kind)
    build = choose_build(rng, program)
    pair.traced = rng.randrange(100) < traced_percent
    pair.program, pair.build, pair.probes = program.kind, build.describe(), program.probes
    orig = folder / "orig"
    orig.mkdir(exist_ok=True)
    try:
        exe, probed = build_program(program, build, orig)
    except (BuildFailed, subprocess.TimeoutExpired) as e:
        pair.skipped = f"build: {str(e)[:300]}"
        pair.seconds = time.monotonic() - started
        return pair
    new = folder / "new"
    probed = [p for p in probed if _notes(p)]
    if not probed:
        pair.skipped = "no probes"
        pair.seconds = round(time.monotonic() - started, 2)
        return pair
    rw = rewrite_files(probed, new)
    pair.sites, pair.rewritten, pair.refused = rw.sites, rw.rewritten, rw.refused
    if rw.error is not None:
        pair.difference = f"rewrite failed: {rw.error}"
    else:
        for p in orig.iterdir():  # the driver and the libraries without probes, as they are
            if p.is_file() and os.access(p, os.X_OK) and not (new / p.name).exists():
                shutil.copy2(p, new / p.name)
        verdict = oracle(exe, new / exe.name, probed, [new / p.name for p in probed],
                         pair.traced)
        pair.difference, pair.skipped, pair.trace_hits = verdict
    pair.seconds = round(time.monotonic() - started, 2)
    return pair


def oracle(exe: Path, new_exe: Path, files: Sequence[Path], new_files: Sequence[Path],
           traced: bool) -> tuple[str | None, str | None, int | None]:
    """(the difference, why not compared, the hits traced in the original) of the original
    program and its rewrite: the same output, exit code and signal, and with `traced`, the
    same hits and argument sums."""
    diff = None
    for _ in range(2):  # a difference must show twice: not a timeout of a loaded machine
        a = run(exe)
        if a.timeout:
            return None, "the original hangs", None
        diff = compare_runs(a, run(new_exe))
        if diff is None:
            break
    if diff is not None or not traced:
        return diff, None, None
    with uprobe_lock(LOCK_WAIT) as locked:
        if not locked:
            return None, None, None  # not traced: the uprobe tests' lock is busy
        for _ in range(2):  # and a tracer's, twice
            ta, tb = trace(exe, files), trace(new_exe, new_files)
            diff = compare_traces(ta, tb)
            if diff is None:
                break
    if diff is not None and any(isinstance(t, str) and t.startswith(TRACER_LOST)
                                for t in (ta, tb)):
        # bpftrace stopped without its maps (twice): the tracer's failure, not the rewrite's
        return None, f"tracer: {diff}", None
    hits = None if isinstance(ta, str) else \
        sum(v for k, v in ta.items() if k.startswith("@hits"))
    return diff, None, hits


# --- reduction -------------------------------------------------------------------------------


def difference_class(difference: str) -> str:
    """The kind of a difference, what the reduction keeps: "rewrite failed", "signal 11",
    "exit", "timeout", "output", "traced counts", "traced arguments"."""
    if difference.startswith("rewrite failed"):
        return "rewrite failed"
    if difference.startswith("traced"):
        return difference.split(":", maxsplit=1)[0]
    if difference.startswith("output"):
        return "output"
    m = re.search(r"rewritten (signal \d+|timeout|exit)", difference)
    return m[1] if m else difference


def interesting(source: Path, build: Build, want: str, traced: bool) -> bool:
    """cvise's test: the reduced source still builds, its original runs to an end, and its
    rewrite still shows the same class of difference."""
    folder = Path(tempfile.mkdtemp(prefix="fzr-", dir=source.parent))
    try:
        cxx = source.suffix == ".cc"
        text = source.read_text()
        program = Program("reduced", text, cxx, 0, threads="pthread" in text)
        (folder / "orig").mkdir()
        exe, probed = build_program(program, build, folder / "orig")
        probed = [p for p in probed if _notes(p)]
        if not probed:
            return False
        rw = rewrite_files(probed, folder / "new")
        if rw.error is not None:
            return want == "rewrite failed"
        for p in (folder / "orig").iterdir():
            if p.is_file() and not (folder / "new" / p.name).exists():
                shutil.copy2(p, folder / "new" / p.name)
        diff, skipped, _ = oracle(exe, folder / "new" / exe.name, probed,
                                  [folder / "new" / p.name for p in probed], traced)
        return skipped is None and diff is not None and difference_class(diff) == want
    except (BuildFailed, subprocess.TimeoutExpired):
        return False
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def reduce(pair: Pair, folder: Path, seconds: int) -> Path | None:
    """Reduce the pair's program with cvise (at most `seconds`) to the smallest source that
    keeps its class of difference; the reduced file, or None."""
    if shutil.which("cvise") is None or pair.difference is None:
        return None
    src = next((folder / "orig").glob("prog.c*"))
    work = folder / "reduce"
    work.mkdir(exist_ok=True)
    target = work / src.name
    shutil.copy2(src, target)
    spec = json.dumps({"build": pair.build, "want": difference_class(pair.difference),
                       "traced": pair.traced})
    test = work / "interesting.sh"
    test.write_text("#!/bin/sh\n"
                    f"cd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} -m "
                    f"tools.fuzz_programs --interesting \"$OLDPWD/{src.name}\" "
                    f"{shlex.quote(spec)}\n")
    test.chmod(0o755)
    with (work / "cvise.log").open("w") as log:
        proc = subprocess.Popen(["cvise", "--n", "1", "--timeout", "120", str(test),
                                 target.name], cwd=work, stdout=log, stderr=log,
                                start_new_session=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:  # cvise and its tests: one process group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return target


def keep_reproducer(pair: Pair, reduced: Path, into: Path = FOUND) -> Path:
    """The reduced program as tests/data/fuzz_programs/found/SEED-INDEX.c(c), headed by how
    it is built and what it showed; tests/test_fuzz_programs.py runs each one."""
    assert pair.difference is not None
    spec = {"build": pair.build, "want": difference_class(pair.difference),
            "traced": pair.traced}
    into.mkdir(parents=True, exist_ok=True)
    out = into / f"{pair.seed}-{pair.index}{reduced.suffix}"
    b = parse_build(pair.build)
    recipe = " ".join([_compiler(b, reduced.suffix == ".cc"), "-w", b.opt, *b.flags,
                       *_LINK_FLAGS.get(b.link, []), f"-I{CSMITH_INCLUDE}", "-o prog",
                       out.name, *(["(as libfz.so with a driver)"] if b.link == "shared"
                                   else []), *(["&& strip prog"] if b.strip else [])])
    out.write_text(f"/* Build: {recipe}, then usdtpatch rewrite (tools/fuzz_programs.py "
                   f"--interesting); pair {pair.seed}-{pair.index} showed: "
                   f"{pair.difference[:300].replace('*/', '* /')} */\n"
                   f"/* fuzz-programs: {json.dumps(spec)} */\n" + reduced.read_text())
    return out


def reproducer_spec(path: Path) -> tuple[Build, str, bool]:
    """(build, class of difference, traced) from a kept reproducer's second line."""
    line = path.read_text().splitlines()[1]
    spec = json.loads(line.removeprefix("/* fuzz-programs: ").removesuffix(" */"))
    return parse_build(spec["build"]), spec["want"], spec["traced"]


def parse_build(text: str) -> Build:
    words = text.split()
    strip = words[-1] == "strip"
    if strip:
        words = words[:-1]
    flags = words[3:]
    return Build(words[0], words[1], words[2], flags, strip)


# --- the campaign ----------------------------------------------------------------------------


def load_results(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """Every pair in the file (gzip-compressed when its name ends in .gz), the last line of
    a (seed, index) winning."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    if path.is_file():
        data = path.read_bytes()
        if path.suffix == ".gz":  # a campaign's record as kept in docs/campaigns/
            data = gzip.decompress(data)
        for ln in data.decode().splitlines():
            if ln.strip():
                d = json.loads(ln)
                out[(d["seed"], d["index"])] = d
    return out


def totals(pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    refused: Counter[str] = Counter()
    for p in pairs:
        refused.update(p["refused"])
    built = [p for p in pairs if not (p["skipped"] or "").startswith("build")]
    compared = [p for p in built if p["skipped"] is None]
    return {
        "programs": len(pairs),
        "builds": len(built),
        "compared": len(compared),
        "traced": sum(1 for p in compared if p.get("trace_hits") is not None),
        "sites": sum(p["sites"] for p in pairs),
        "rewritten": sum(p["rewritten"] for p in pairs),
        "refused": dict(refused.most_common()),
        "differences": sum(1 for p in pairs if p["difference"]),
        "kinds": dict(Counter(p["program"] for p in built).most_common()),
        "builds by": {what: dict(Counter(p["build"].split()[k] for p in built).most_common())
                      for k, what in enumerate(["compiler", "optimization", "link"])},
        "flags": dict(Counter(f for p in built for f in p["build"].split()[3:]
                              if f != "-fno-unwind-tables").most_common()),
        "skipped": dict(Counter((p["skipped"] or "").split(":")[0] for p in pairs
                                if p["skipped"]).most_common()),
        "difference classes": dict(Counter(difference_class(p["difference"]) for p in pairs
                                           if p["difference"]).most_common()),
    }


def counts_line(t: dict[str, Any]) -> str:
    refused = sum(t["refused"].values())
    by = ", ".join(f"{k} {v}" for k, v in t["refused"].items())
    return (f"{t['programs']} programs, {t['builds']} builds ({t['compared']} compared, "
            f"{t['traced']} traced), {t['sites']} sites tried, {t['rewritten']} rewritten, "
            f"{refused} refused" + (f" ({by})" if by else "") +
            f", {t['differences']} differences")


def campaign(seed: int, count: int | None, seconds: float | None, results: Path, work: Path,
             start: int | None = None, traced_percent: int = TRACED_PERCENT,
             reduce_seconds: int = 0, quiet: bool = False) -> list[Pair]:
    """Run pairs of `seed` from `start` (default: after the last index of the seed in the
    results file) until `count` pairs or `seconds` have passed; append each to the file."""
    if start is None:
        known = [i for (s, i) in load_results(results) if s == seed]
        start = max(known) + 1 if known else 0
    results.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + seconds if seconds is not None else None
    done: list[Pair] = []
    index = start
    while (count is None or len(done) < count) and \
            (deadline is None or time.monotonic() < deadline):
        folder = work / f"{seed}-{index}"
        shutil.rmtree(folder, ignore_errors=True)
        pair = run_pair(seed, index, folder, traced_percent)
        if pair.difference is not None:
            if not quiet:
                print(f"DIFFERENCE {seed}-{index} [{pair.program}; {pair.build}]: "
                      f"{pair.difference}", file=sys.stderr, flush=True)
            reduced = reduce(pair, folder, reduce_seconds) if reduce_seconds else None
            if reduced is not None and interesting(reduced, parse_build(pair.build),
                                                   difference_class(pair.difference),
                                                   pair.traced):
                kept = keep_reproducer(pair, reduced)
                if not quiet:
                    print(f"  reduced to {kept}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        with results.open("a") as fh:
            fh.write(json.dumps(asdict(pair)) + "\n")
        done.append(pair)
        index += 1
    return done


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.fuzz_programs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--start", type=int, help="first index (default: after the seed's last)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--work", type=Path, default=WORK, help="where differences are kept")
    ap.add_argument("--traced-percent", type=int, default=TRACED_PERCENT)
    ap.add_argument("--reduce", type=int, default=0, metavar="SECONDS",
                    help="reduce each difference with cvise, at most SECONDS each")
    ap.add_argument("--summary", action="store_true", help="the totals of the results file")
    ap.add_argument("--json", action="store_true", help="the totals as JSON")
    ap.add_argument("--interesting", nargs=2, metavar=("SOURCE", "SPEC"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.interesting:
        spec = json.loads(a.interesting[1])
        ok = interesting(Path(a.interesting[0]), parse_build(spec["build"]), spec["want"],
                         spec["traced"])
        return 0 if ok else 1
    if a.summary:
        t = totals(list(load_results(a.results).values()))
        print(json.dumps(t, indent=1) if a.json else counts_line(t))
        return 0
    if shutil.which("csmith") is None:
        print("fuzz_programs: csmith is not installed (apt-get install csmith libcsmith-dev)",
              file=sys.stderr)
        return 2
    if a.count is None and a.seconds is None:
        a.count = 20
    # `kill PID` ends the campaign through its finally blocks: a tracer it started is stopped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    pairs = campaign(a.seed, a.count, a.seconds, a.results, a.work, a.start,
                     a.traced_percent, a.reduce)
    t = totals([asdict(p) for p in pairs])
    print(json.dumps(t) if a.json else counts_line(t))
    return 1 if t["differences"] else 0


if __name__ == "__main__":
    sys.exit(main())
