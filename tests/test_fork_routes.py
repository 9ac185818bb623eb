"""Every route to a child process, and the guard's part in each (issue 31).

Class 3: a static executable's hooked clone system call (glibc's `__clone`, whose number is
fixed and whose flags come from its caller) must not touch the memory of a CLONE_VM child: a
thread, or `clone(fn, stack, CLONE_VM|SIGCHLD)` on a stack of 64, 128 or 256 bytes
(tests/data/clonevm-static.c: the 4 KiB below the stack are a canary). The hook decides in the
parent, before the system call, from the number and the flags, and a child that shares its
parent's memory runs nothing of the guard's. Before, the hook called the child stub in every
child whose %rax was 0, about 300 bytes below the child's stack pointer: the canary was
overwritten (untraced).

Class 2: tests/data/forkroutes.c creates a child by each route (fork, _Fork, clone without
CLONE_VM, syscall() of fork, clone and clone3, a pointer to syscall, vfork, posix_spawn, a
CLONE_VM clone), linked as PIE, non-PIE and without PLT, and with musl: rewritten under the
defaults and traced (counting uprobes), every child exits 0 with its 7 hits counted; with
`--fork-guard never` a child that copies the address space dies of SIGSEGV. Before, the
dynamically linked program was refused (its syscall() calls) or guarded by atfork only.
A shared library's own fork through syscall() (tests/data/forklib.c) is covered too.

Class 1: a Rust program with a probe (tests/data/rust/forkroutes.rs) is rewritten under the
defaults (before: refused, "the address of syscall() is taken") and its children survive
tracing (std::process::Command, libc's fork, clone3 through syscall()).

musl and other C libraries: a static musl program is guarded by its hooked system calls (every
route traced, under bpftrace too; before, it was refused naming musl), an executable whose
interpreter is neither glibc's nor musl's is refused naming it; check says so first.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

DATA = ROOT / "tests" / "data"

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]

STATIC = pytest.mark.skipif(not Path("/usr/lib/x86_64-linux-gnu/libc.a").exists(),
                            reason="needs glibc's static library (libc6-dev)")


def _gcc(src: Path, out: Path, *flags: str, cc: str = "gcc") -> Path:
    subprocess.run([cc, "-O2", *flags, "-I", str(ROOT / "fixtures" / "src"), str(src),
                    "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def clonevm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if not Path("/usr/lib/x86_64-linux-gnu/libc.a").exists():
        pytest.skip("needs glibc's static library (libc6-dev)")
    d = tmp_path_factory.mktemp("clonevm")
    exe = _gcc(DATA / "clonevm-static.c", d / "clonevm", "-static")
    out = d / "out"
    res = run_cli("rewrite", exe, "-o", out)
    assert res.rc == 0, res.err
    assert "hooked" in res.out, res.out  # the clone system call of __clone is hooked
    return exe, out


def _run(path: Path, size: int) -> str:
    done = subprocess.run([str(path), str(size)], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0, (done.returncode, done.stderr)
    return done.stdout


@STATIC
@pytest.mark.parametrize("size", [64, 128, 256])
def test_a_clone_vm_child_is_not_touched(clonevm: tuple[Path, Path], size: int) -> None:
    exe, out = clonevm
    want = _run(exe, size)
    assert "canary intact" in want and "fork child-status 0" in want
    assert _run(out, size) == want


@STATIC
@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
def test_traced_clone_vm_and_fork(clonevm: tuple[Path, Path]) -> None:
    """Traced (bpftrace -c: the parent's hit): the forked child survives, the CLONE_VM
    child's neighbours stay intact."""
    _exe, out = clonevm
    script = f"usdt:{out}:cvm:site {{ @[pid] = count(); }}"
    done = subprocess.run(["bpftrace", "-e", script, "-c", f"{out} 128"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fork child-status 0" in done.stdout, done.stdout
    assert "canary intact" in done.stdout, done.stdout
    assert re.search(r"@\[\d+\]: 1\b", done.stdout), done.stdout  # the parent's hit


# --- every route, traced (class 2 and the static hooks) --------------------------------------

# route -> whether its child gets a copy of the address space (the guard's business)
ROUTES = {"fork": True, "_Fork": True, "clone": True, "sysfork": True, "sysclone": True,
          "sysclone3": True, "pointer": True, "vfork": False, "spawn": False, "clonevm": False,
          "dlfork": True, "dlsyscall": True, "dlclone": True, "dldlsym": True, "dlvsym": True,
          "preinit": True}


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Path]]:
    """link -> {guard: the rewritten program}, built on first use."""
    d = tmp_path_factory.mktemp("routes")
    done: dict[str, dict[str, Path]] = {}

    def get(link: str) -> dict[str, Path]:
        if link in done:
            return done[link]
        if link == "static" and not Path("/usr/lib/x86_64-linux-gnu/libc.a").exists():
            pytest.skip("needs glibc's static library (libc6-dev)")
        cc = "musl-gcc" if link.startswith("musl") else "gcc"
        if shutil.which(cc) is None:
            pytest.skip(f"needs {cc} (Debian's musl-tools)")
        exe = _gcc(DATA / "forkroutes.c", d / link, *LINKS[link], cc=cc)
        out: dict[str, Path] = {}
        for guard in ("auto", "never"):
            res = run_cli("rewrite", exe, "-o", d / f"{link}-{guard}", "--fork-guard", guard)
            assert res.rc == 0, res.err
            out[guard] = d / f"{link}-{guard}"
        done[link] = out
        return out

    return get


def _site(path: Path) -> int:
    from usdtpatch.api import load

    probe = next(p for p in load(str(path)).probes if p.name == "site")
    assert probe.offset is not None
    return probe.offset


# the static executable's hooks covered fork, _Fork, clone, syscall() and clone3 before (its
# routes pass on the branch-start code too: tests/test_fork_static.py); its CLONE_VM child is
# the new case
# how the program is linked: PIE with lazy binding (Debian's default), non-PIE (the canonical
# PLT addresses), immediate binding with no PLT (`call *slot(%rip)`, Rust's way), static
LINKS = {"dynamic": (), "nopie": ("-no-pie",), "noplt": ("-fno-plt", "-Wl,-z,now"),
         "static": ("-static", "-DNO_DLSYM"), "musl": (), "musl-static": ("-static",)}
# musl has no _Fork before 1.2.4 (the program's route needs glibc's), nor dlvsym
# (nor does it run .preinit_array functions)
MUSL_ROUTES = [r for r in ROUTES if r not in ("_Fork", "dlvsym", "preinit")]
# a static musl program: its dlsym finds nothing (no route through it); every system call
# whose number is not proven to be no fork is hooked (musl's posix_spawn child, __clone,
# __syscall_cp_c, syscall()'s own)
MUSL_STATIC_ROUTES = [r for r in MUSL_ROUTES if not r.startswith("dl")]
CASES = [("dynamic", r) for r in ROUTES] + [("static", "clonevm")] + \
    [(link, r) for link in ("nopie", "noplt")
     for r in ("_Fork", "clone", "sysclone3", "pointer", "dlfork", "dlsyscall", "preinit")] + \
    [("musl", r) for r in MUSL_ROUTES] + [("musl-static", r) for r in MUSL_STATIC_ROUTES]


@pytest.mark.live
@pytest.mark.parametrize(("link", "route"), CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_every_route_traced(routes: Callable[[str], dict[str, Path]], link: str,
                            route: str) -> None:
    """Rewritten under the defaults, traced (counting uprobes on every CPU) while the program
    creates a child by `route`: every child exits 0 and its 7 hits are counted; a CLONE_VM
    child's neighbours are intact. Unguarded, a child that copies the address space dies of
    SIGSEGV at the optimized site (the guard is what saves it)."""
    from tests.test_fork_support import need_kernel, run_under_uprobes

    need_kernel()
    path = routes(link)["auto"]
    run = run_under_uprobes([str(path), route], [(path, _site(path), 0)])
    assert run.site[0] == 0xE8
    assert run.line == "child-status 0 canary intact", run
    if route not in ("vfork", "spawn"):
        assert run.after == 7, run
    if ROUTES[route]:
        bare = routes(link)["never"]
        run = run_under_uprobes([str(bare), route], [(bare, _site(bare), 0)])
        assert run.line.startswith("child-status 11 "), run  # SIGSEGV: the guard is the fix


# routes whose child hits the probe (7 times); a vfork child exits at once, a spawned one execs
HITTING = [r for r in ROUTES if r not in ("vfork", "spawn")]


@pytest.mark.live
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize("link", ["dynamic", "nopie", "noplt", "musl", "musl-static"])
def test_every_route_under_bpftrace(routes: Callable[[str], dict[str, Path]], link: str) -> None:
    """One system-wide bpftrace (a usdt probe on the rewritten file's path, no -p or -c: a
    forked child is traced as its parent is) counts the probe's hits per pid while the
    program runs once per route: every parent's 5, and for each route whose child hits it
    a pid of its own with exactly 7 (the child survived its hits, which bpftrace saw); every
    child exits 0. Before the dlsym and preinit routes were covered, their children died of
    SIGSEGV and no pid of theirs was counted."""
    from tests.conftest import runtime_address, started
    from tests.test_fork_support import need_kernel
    from usdtpatch.live.procfs import read_mem

    need_kernel()
    path = routes(link)["auto"]
    todo = MUSL_ROUTES if link == "musl" else MUSL_STATIC_ROUTES if link == "musl-static" \
        else [r for r in ROUTES if r != "clonevm"] if link != "dynamic" else list(ROUTES)
    site = _site(path)
    program = (f"usdt:{path}:routes:site {{ @[pid] = count(); }} "
               'BEGIN { printf("attached\\n"); }')
    parents: dict[int, str] = {}
    lines: dict[str, str] = {}
    with started(["bpftrace", "-e", program], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 text=True) as tracer:
        seen: list[str | None] = []
        while not seen or "attached" not in (seen[-1] or ""):  # warnings, "Attaching 1 probe"
            seen.append(tracer.line(60))
            assert seen[-1] is not None and len(seen) < 20, f"bpftrace did not attach: {seen}"
        for route in todo:
            with started([str(path), route], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True) as proc:
                assert proc.line(60) == "ready", route
                code = read_mem(proc.pid, runtime_address(proc.pid, path, site), 5)
                assert code[0] == 0xE8, (route, code.hex())  # optimized before the fork
                proc.say("go\n")
                lines[route] = proc.line(60) or ""
                proc.finish("", timeout=60)
                assert proc.proc.returncode == 0, (route, proc.proc.returncode)
                parents[proc.pid] = route
        tracer.signal(signal.SIGINT)
        out = tracer.finish(timeout=60)
    assert all(v == "child-status 0 canary intact" for v in lines.values()), lines
    counts = {int(m[0]): int(m[1]) for m in re.findall(r"@\[(\d+)\]: (\d+)", out)}
    assert {pid: counts.get(pid) for pid in parents} == dict.fromkeys(parents, 5), out
    children = [n for pid, n in counts.items() if pid not in parents]
    assert children == [7] * len([r for r in todo if r in HITTING]), (out, todo)


# --- a Rust program (class 1) ----------------------------------------------------------------

def _rustc() -> str | None:
    found = shutil.which("rustc")
    home = Path.home() / ".cargo" / "bin" / "rustc"
    return found or (str(home) if home.exists() else None)


@pytest.fixture(scope="module")
def rust(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    rustc = _rustc()
    if rustc is None:
        pytest.skip("needs rustc (rustup, or Debian's rustc)")
    d = tmp_path_factory.mktemp("rust")
    exe = d / "forkroutes-rs"
    subprocess.run([rustc, "-O", "--edition", "2021", str(DATA / "rust" / "forkroutes.rs"),
                    "-o", str(exe)], check=True, capture_output=True)
    out = {"original": exe}
    for guard in ("auto", "never"):
        res = run_cli("rewrite", exe, "-o", d / guard, "--fork-guard", guard, "--json")
        assert res.rc == 0, res.err  # the defaults: before, "the address of syscall() is taken"
        out[guard] = d / guard
    return out


def test_rust_is_rewritten_under_the_defaults(rust: dict[str, Path], tmp_path: Path) -> None:
    """Rust's std calls syscall() with numbers the code does not fix (and clone3 through it):
    the guard interposes the file's GOT slot of syscall(); check predicts no refusal."""
    from tests.test_check_equals_rewrite import refusal_mismatch
    from usdtpatch import api

    codes = {f.code: f.message for f in api.check(rust["original"]).findings}
    assert "fork-guard-unavailable" not in codes, codes
    assert refusal_mismatch(rust["original"]) is None
    res = run_cli("rewrite", rust["original"], "-o", tmp_path / "out", "--json")
    said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
    assert "syscall() interposed" in said["fork-guarded"], said


@pytest.mark.live
@pytest.mark.parametrize("route", ["command", "fork", "clone3"])
def test_rust_children_survive_tracing(rust: dict[str, Path], route: str) -> None:
    """Traced while forking through std::process::Command (its pre_exec closure runs this
    file's code in the child), libc's fork, and a raw clone3 through syscall(): every child
    exits 0 and its 7 hits are counted; unguarded, the child dies of SIGSEGV."""
    from tests.test_fork_support import need_kernel, run_under_uprobes

    need_kernel()
    path = rust["auto"]
    run = run_under_uprobes([str(path), route], [(path, _site(path), 0)])
    assert run.site[0] == 0xE8
    assert run.line == "child-status 0 canary intact", run
    assert run.after == 7, run
    bare = rust["never"]
    run = run_under_uprobes([str(bare), route], [(bare, _site(bare), 0)])
    assert run.line.startswith("child-status 11 "), run


@pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="needs musl-gcc (musl-tools)")
def test_musl_static_is_guarded(routes: Callable[[str], dict[str, Path]],
                                tmp_path: Path) -> None:
    """A static musl executable has no __register_atfork: every system call whose number is
    not proven to be no fork is hooked, among them musl's posix_spawn child (its jump table
    found past the `_exit` that never returns), `__syscall_cp_c`, `__stdio_read` (a window
    from the `syscall` on: a jump lands on it) and `__clone`; check predicts no refusal, and
    the output runs every route as the original does. Before, the file was refused, musl
    named. A musl program whose own fork system call has no window (rawfork -DWAY_IN) is
    refused, musl and the system call's address named, by check first."""
    from tests.test_check_equals_rewrite import refusal_mismatch
    from usdtpatch import api

    out = routes("musl-static")["auto"]
    exe = out.parent / "musl-static"
    assert refusal_mismatch(exe) is None
    codes = {f.code: f.message for f in api.check(out).findings}
    assert "hooked" in codes.get("fork-guarded", ""), codes
    for route in MUSL_STATIC_ROUTES:
        runs = [subprocess.run([str(p), route], input="go\n", capture_output=True, text=True,
                               timeout=30, check=False) for p in (exe, out)]
        assert [(r.returncode, r.stdout) for r in runs] == \
            [(0, "ready\nchild-status 0 canary intact\n")] * 2, (route, runs)
    res = run_cli("verify", out)  # the emulator runs the hooked guard's child stub
    assert res.rc == 0 and "re-armed" in res.out, res.out + res.err
    assert run_cli("restore", out, "-o", tmp_path / "back").rc == 0
    assert (tmp_path / "back").read_bytes() == exe.read_bytes()
    raw = _gcc(DATA / "rawfork-static.c", tmp_path / "rawfork", "-static", "-DWAY_IN",
               cc="musl-gcc")
    codes = {f.code: f.message for f in api.check(raw).findings}
    assert "static executable of musl" in codes["fork-guard-unavailable"], codes
    assert re.search(r"system call at 0x[0-9a-f]+", codes["fork-guard-unavailable"]), codes
    assert refusal_mismatch(raw) is None
    res = run_cli("rewrite", raw, "-o", tmp_path / "out")
    assert res.rc == 2 and "of musl" in res.err, (res.rc, res.err)
    assert run_cli("rewrite", raw, "-o", tmp_path / "out", "--fork-guard", "never").rc == 0


def test_another_c_library_is_refused_by_name(tmp_path: Path) -> None:
    """A dynamically linked executable whose interpreter is neither glibc's nor musl's (its
    PT_INTERP path edited in a copy): refused, the C library named, by check first."""
    from tests.test_check_equals_rewrite import refusal_mismatch
    from usdtpatch import api

    exe = _gcc(DATA / "forkroutes.c", tmp_path / "exe")
    data = bytearray(exe.read_bytes())
    at = data.index(b"/lib64/ld-linux-x86-64.so.2\0")
    data[at:at + 27] = b"/lib64/ld-uClibc-x86_64.so0"[:27]
    other = tmp_path / "other"
    other.write_bytes(bytes(data))
    codes = {f.code: f.message for f in api.check(other).findings}
    assert "ld-uClibc" in codes["fork-guard-unavailable"], codes
    assert refusal_mismatch(other) is None
    res = run_cli("rewrite", other, "-o", tmp_path / "out")
    assert res.rc == 2 and "ld-uClibc" in res.err, (res.rc, res.err)
    assert not (tmp_path / "out").exists()


# --- a shared object's own route (Ruby's Kernel#syscall) -------------------------------------

@pytest.fixture(scope="module")
def forklib(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """guard -> a folder with the rewritten libforklib.so and the program that loads it."""
    d = tmp_path_factory.mktemp("forklib")
    lib = d / "libforklib.so"
    _gcc(DATA / "forklib.c", lib, "-shared", "-fPIC")
    out: dict[str, Path] = {"original": lib}
    for guard in ("auto", "never"):
        folder = d / guard
        folder.mkdir()
        res = run_cli("rewrite", lib, "-o", folder / lib.name, "--fork-guard", guard, "--json")
        assert res.rc == 0, res.err
        said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
        if guard == "auto":
            assert "syscall() interposed" in said["fork-guarded"], said
            assert "fork-unknown" not in said, said  # the stub covers what it warned of
        subprocess.run(["gcc", "-O2", str(DATA / "forklib-main.c"), f"-L{folder}", "-lforklib",
                        "-Wl,-rpath,$ORIGIN", "-o", str(folder / "main")], check=True)
        out[guard] = folder
    return out


@pytest.mark.live
@pytest.mark.parametrize("route", ["fork", "clone"])
def test_a_librarys_syscall_fork_traced(forklib: dict[str, Path], route: str) -> None:
    """A shared library forks through syscall() with a number its caller gives: its GOT slot
    of syscall() is interposed, the traced child survives and its 7 hits are counted; before,
    the library was rewritten with `fork-unknown` and the child died (as unguarded here)."""
    from tests.test_fork_support import need_kernel, run_under_uprobes

    need_kernel()
    for guard, want in (("auto", "child-status 0 "), ("never", "child-status 11 ")):
        folder = forklib[guard]
        lib = folder / "libforklib.so"
        run = run_under_uprobes([str(folder / "main"), route], [(lib, _site(lib), 0)])
        assert run.site[0] == 0xE8
        assert run.line.startswith(want), (guard, run)
        if guard == "auto":
            assert run.after == 7, run


# --- two rewritten objects in one process -----------------------------------------------------

@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """guard -> a folder with the rewritten libforklib.so and the rewritten program with a
    probe of its own that loads it (tests/data/forklib-two.c)."""
    d = tmp_path_factory.mktemp("two")
    lib = _gcc(DATA / "forklib.c", d / "libforklib.so", "-shared", "-fPIC")
    exe = d / "two"
    subprocess.run(["gcc", "-O2", "-I", str(ROOT / "fixtures" / "src"),
                    str(DATA / "forklib-two.c"), f"-L{d}", "-lforklib", "-Wl,-rpath,$ORIGIN",
                    "-o", str(exe)], check=True)
    out: dict[str, Path] = {}
    for guard in ("auto", "never"):
        folder = d / guard
        folder.mkdir()
        for path in (lib, exe):
            res = run_cli("rewrite", path, "-o", folder / path.name, "--fork-guard", guard)
            assert res.rc == 0, res.err
        out[guard] = folder
    return out


@pytest.mark.live
@pytest.mark.parametrize("route", ["exe", "lib"])
def test_a_child_of_one_objects_stub_rearms_every_object(two: dict[str, Path],
                                                         route: str) -> None:
    """A rewritten program and a rewritten library, both with optimized sites, and a child
    made through one object's syscall() stub (a fork that runs no atfork handler): the child
    hits both objects' probes, 7 each, and survives (the stub re-arms every rewritten object
    the link map lists, each found by the mark before its init stub). Before, only the
    stub's own object was re-armed and the child died of SIGSEGV at the other's site."""
    from tests.test_fork_support import need_kernel, run_under_uprobes

    need_kernel()
    for guard, want in (("auto", "child-status 0 "), ("never", "child-status 11 ")):
        folder = two[guard]
        exe, lib = folder / "two", folder / "libforklib.so"
        run = run_under_uprobes([str(exe), route], [(exe, _site(exe), 0), (lib, _site(lib), 0)])
        assert run.line.startswith(want), (guard, run)
        if guard == "auto":
            assert run.after == 14, run


# --- a program whose only route to a child is dlsym --------------------------------------------

@pytest.mark.live
@pytest.mark.parametrize("name", ["_Fork", "syscall"])
def test_a_looked_up_fork_is_guarded(tmp_path: Path, name: str) -> None:
    """A program that imports no fork and loads no library but the C library, and forks
    through a function dlsym returns: rewrite under the defaults adds the guard with dlsym
    interposed (check predicts no refusal; the output's check says fork-guarded), and
    traced, the child survives with its 7 hits counted. Before, the file was taken as one
    that cannot fork: no guard, and the child died of SIGSEGV."""
    from tests.test_check_equals_rewrite import refusal_mismatch
    from tests.test_fork_support import need_kernel, run_under_uprobes
    from usdtpatch import api

    exe = _gcc(DATA / "lookupfork.c", tmp_path / "lookupfork")
    assert refusal_mismatch(exe) is None
    out = tmp_path / "out"
    res = run_cli("rewrite", exe, "-o", out, "--json")
    assert res.rc == 0, res.err
    said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
    assert "dlsym() interposed" in said.get("fork-guarded", ""), said
    assert "fork-guarded" in {f.code for f in api.check(out).findings}
    need_kernel()
    run = run_under_uprobes([str(out), name], [(out, _site(out), 0)])
    assert run.site[0] == 0xE8
    assert run.line == "child-status 0 canary intact", run
    assert run.after == 7, run


# --- a fork in another object's initializer that calls back into the program ---------------

@pytest.fixture(scope="module")
def libctor(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Path]]:
    """variant -> {guard: the rewritten forkroutes program (-DWITH_LIBCTOR) in a folder with
    the library whose constructor calls back into it (not rewritten: it has no probe),
    "original": the program}. Variants: "preinit" (the program has a preinit array),
    "pie" and "nopie" (-DNO_PREINIT: it has none, the rewrite adds one)."""
    d = tmp_path_factory.mktemp("libctor")
    _gcc(DATA / "forkctor-lib.c", d / "libforkctor.so", "-shared", "-fPIC")
    done: dict[str, dict[str, Path]] = {}

    def get(variant: str) -> dict[str, Path]:
        if variant in done:
            return done[variant]
        exe = d / variant
        flags = {"preinit": [], "pie": ["-DNO_PREINIT"], "nopie": ["-DNO_PREINIT", "-no-pie"]}
        subprocess.run(["gcc", "-O2", "-DWITH_LIBCTOR", *flags[variant], "-rdynamic", "-I",
                        str(ROOT / "fixtures" / "src"), str(DATA / "forkroutes.c"), f"-L{d}",
                        "-Wl,--no-as-needed", "-lforkctor", "-Wl,-rpath,$ORIGIN", "-o",
                        str(exe)], check=True)
        out: dict[str, Path] = {"original": exe}
        for guard in ("auto", "never"):
            out[guard] = d / f"{variant}-{guard}"
            res = run_cli("rewrite", exe, "-o", out[guard], "--fork-guard", guard)
            assert res.rc == 0, res.err
        done[variant] = out
        return out

    return get


@pytest.mark.live
@pytest.mark.parametrize("variant", ["preinit", "pie", "nopie"])
def test_a_fork_in_a_librarys_constructor_is_guarded(libctor: Callable[[str], dict[str, Path]],
                                                     variant: str) -> None:
    """A library's constructor (run before the program's own initializers) calls back into
    the rewritten program, which hits its probe and forks while traced: the guard, hooked at
    the program's first preinit function, is registered by then, and the child survives with
    its 7 hits counted. Before, it was hooked at DT_INIT_ARRAY[0], which glibc runs after the
    libraries' constructors: the child died of SIGSEGV (as unguarded here). A program without
    a preinit array (`pie`, `nopie`) is given one (its first init array word, two dynamic
    entries in spare DT_NULL slots); before, its child died."""
    from tests.test_fork_support import need_kernel, run_under_uprobes

    need_kernel()
    path = libctor(variant)["auto"]
    run = run_under_uprobes([str(path), "libctor"], [(path, _site(path), 0)])
    assert run.line == "child-status 0 canary intact", run
    assert run.after == 7, run
    bare = libctor(variant)["never"]
    run = run_under_uprobes([str(bare), "libctor"], [(bare, _site(bare), 0)])
    assert run.line.startswith("child-status 11 "), run


@pytest.mark.parametrize("variant", ["pie", "nopie"])
def test_an_added_preinit_array_keeps_every_initializer(
        libctor: Callable[[str], dict[str, Path]], variant: str) -> None:
    """The rewritten program has a DT_PREINIT_ARRAY (its one word the init stub), and its
    original initializers all still run, in order: every route's output equals the
    original's (untraced)."""
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.elf.model import DT_PREINIT_ARRAY, dynamic_entries

    got = libctor(variant)
    tags = {t for t, _v, _o in dynamic_entries(parse_elf(got["auto"].read_bytes()))}
    assert DT_PREINIT_ARRAY in tags
    for route in ("libctor", "fork", "clone"):
        runs = [subprocess.run([str(got[k]), route], input="go\n", capture_output=True,
                               text=True, timeout=30, check=False) for k in ("original", "auto")]
        assert [(r.returncode, r.stdout) for r in runs] == \
            [(0, "ready\nchild-status 0 canary intact\n")] * 2, (route, runs)
    back = got["auto"].parent / f"{variant}-back"
    assert run_cli("restore", got["auto"], "-o", back).rc == 0  # the dynamic edits undone
    assert back.read_bytes() == got["original"].read_bytes()


def test_no_room_for_a_preinit_array_is_refused(libctor: Callable[[str], dict[str, Path]],
                                                tmp_path: Path) -> None:
    """The same program with its spare DT_NULL slots taken (given DT_CHECKSUM tags in a
    copy): no preinit array can be added, so a library's constructor could fork before the
    guard registers: check says fork-guard-unavailable naming the route, rewrite
    --fork-guard auto refuses the file, --fork-guard never accepts it. A program with its own
    preinit array needs no slot. Before, the file was rewritten with the guard in its first
    init array entry and the child of such a fork died."""
    import struct

    from tests.test_check_equals_rewrite import refusal_mismatch
    from usdtpatch import api
    from usdtpatch.elf.image import PT_DYNAMIC, parse_elf
    from usdtpatch.elf.model import dynamic_entries

    exe = libctor("pie")["original"]
    data = bytearray(exe.read_bytes())
    image = parse_elf(bytes(data))
    seg = next(s for s in image.segments if s.type == PT_DYNAMIC)
    first = seg.offset + 16 * len(dynamic_entries(image))  # the first DT_NULL
    spare = (seg.offset + seg.filesz - first) // 16 - 1  # one must end the section
    assert spare >= 2
    for k in range(spare - 1):  # one slot left: too few for two entries
        struct.pack_into("<qQ", data, first + 16 * k, 0x6FFFFDF8, 0)
    full = tmp_path / "full"
    full.write_bytes(bytes(data))
    full.chmod(0o755)
    codes = {f.code: f.message for f in api.check(full).findings}
    assert "constructor of a library it loads (libforkctor.so)" in \
        codes.get("fork-guard-unavailable", ""), codes
    assert "spare DT_NULL slot" in codes["fork-guard-unavailable"]
    assert refusal_mismatch(full) is None
    res = run_cli("rewrite", full, "-o", tmp_path / "out")
    assert res.rc == 2 and "constructor of a library" in res.err, (res.rc, res.err)
    assert not (tmp_path / "out").exists()
    assert run_cli("rewrite", full, "-o", tmp_path / "out", "--fork-guard", "never").rc == 0
    assert "fork-guard-unavailable" not in {
        f.code for f in api.check(libctor("preinit")["original"]).findings}
