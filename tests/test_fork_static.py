"""Static executables that fork, with and without symbols (issue 19, item 3).

tests/data/forkstatic.c is linked statically; a stripped copy has no symbol naming fork (its
C library's `_Fork` makes the clone system call inline). The code itself is the evidence:

- check reports `process-can-fork` with the system call's address (inside `_Fork`, as the
  unstripped copy's symbols say);
- with no `__register_atfork` symbol to register the guard with, rewrite hooks that system
  call (`mov $56,%eax; syscall` jumps to a copy that re-arms the sites in the child), and
  (live) traced by bpftrace every child survives, unstripped or stripped; with
  `--fork-guard never` every traced child dies of SIGSEGV (the guard is the fix);
- tests/data/rawfork-static.c forks by its own system call with another instruction between
  the number and the `syscall`: hooked from the `syscall` on (issue 31; before, refused), and
  traced its children survive; built -DWAY_IN, a jump lands right after the `syscall` and
  no window can be made: rewrite --fork-guard auto refuses it
  (exit 2, one line saying why and that `--fork-guard never` accepts it), and so does
  `--dry-run`: the plan decides it; nothing is written; `--fork-guard never` accepts it;
- tests/data/nofork-static.c, stripped, never forks, but its C library makes a system call
  whose number the code does not fix: check says `fork-unknown`, never nothing, and rewrite
  hooks that system call (the hook compares the number with the fork ones at run time) and
  says so in `fork-guarded` instead (before, its report kept `fork-unknown` beside it);
  `--fork-guard never` keeps `fork-unknown`;
- tests/data/sysfork-static.c forks through syscall(SYS_fork + n), n not fixed in the code:
  static, rewrite hooks syscall()'s own system call (unstripped: the one its symbol names;
  stripped: the system call whose number is not fixed), and traced every child survives;
  linked dynamically, syscall() is the C library's: the guard interposes the file's GOT slot
  of it (issue 31); its own system call, linked dynamically (rawfork), is still refused and
  check says so (`fork-guard-unavailable`).
check's `fork-guard-unavailable` is there exactly when rewrite --fork-guard auto refuses.
Before, check said nothing about forking for the stripped files and rewrite exited 0 with
an unguarded output whose traced children died; a fork through syscall() was `fork-unknown`
and left unguarded.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli
from usdtpatch import api
from usdtpatch.api import load

DATA = ROOT / "tests" / "data"

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc"),
              pytest.mark.skipif(not Path("/usr/lib/x86_64-linux-gnu/libc.a").exists(),
                                 reason="needs glibc's static library (libc6-dev)")]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("forkstatic")
    paths: dict[str, Path] = {}
    for name, src in (("fork", "forkstatic.c"), ("nofork", "nofork-static.c"),
                      ("rawfork", "rawfork-static.c"), ("sysfork", "sysfork-static.c")):
        exe = out / name
        subprocess.run(["gcc", "-O2", "-static", "-I", str(ROOT / "fixtures" / "src"),
                        str(DATA / src), "-o", str(exe)], check=True)
        stripped = out / f"{name}-stripped"
        subprocess.run(["strip", "-o", str(stripped), str(exe)], check=True)
        paths[name], paths[f"{name}-stripped"] = exe, stripped
    for flag, name in (("-DWAY_IN", "rawfork-wayin-stripped"),  # no window for its fork
                       ("-DJMP_AFTER", "rawfork-jmp-stripped")):  # a window ending in a jmp
        subprocess.run(["gcc", "-O2", "-static", flag, "-s", "-I",
                        str(ROOT / "fixtures" / "src"), str(DATA / "rawfork-static.c"), "-o",
                        str(out / name)], check=True)
        paths[name] = out / name
    for name in ("sysfork", "rawfork"):
        dyn = out / f"{name}-dynamic"
        subprocess.run(["gcc", "-O2", "-I", str(ROOT / "fixtures" / "src"),
                        str(DATA / f"{name}-static.c"), "-o", str(dyn)], check=True)
        paths[f"{name}-dynamic"] = dyn
    return paths


def _nm(path: Path, name: str) -> tuple[int, int]:
    text = subprocess.run(["nm", "-S", str(path)], capture_output=True, text=True,
                          check=True).stdout
    for line in text.splitlines():
        f = line.split()
        if len(f) == 4 and f[3] == name:
            return int(f[0], 16), int(f[0], 16) + int(f[1], 16)
    raise AssertionError(name)


def test_check_finds_the_fork_in_code(built: dict[str, Path]) -> None:
    rep = api.check(built["fork-stripped"])
    codes = {f.code: f for f in rep.findings}
    assert "process-can-fork" in codes, [f.code for f in rep.findings]
    m = re.search(r"system call at (0x[0-9a-f]+)", codes["process-can-fork"].message)
    assert m is not None
    lo, hi = _nm(built["fork"], "_Fork")
    assert lo <= int(m.group(1), 16) < hi
    assert "fork-guard-unavailable" not in codes  # the system call can be hooked
    raw = {f.code: f for f in api.check(built["rawfork-wayin-stripped"]).findings}
    assert "process-can-fork" in raw and "fork-guard-unavailable" in raw
    raw = {f.code: f for f in api.check(built["rawfork-stripped"]).findings}
    assert "process-can-fork" in raw and "fork-guard-unavailable" not in raw


@pytest.mark.parametrize("name", ["rawfork-stripped", "rawfork-jmp-stripped"])
def test_a_window_from_the_syscall_on(built: dict[str, Path], tmp_path: Path,
                                      name: str) -> None:
    """rawfork's fork system call has another instruction between `mov $57,%eax` and the
    `syscall`: no window before it, so the hook's window starts at the `syscall` and takes the
    instructions after it (the number compared at run time); built -DJMP_AFTER, a jump lands
    on the `syscall` and a 5-byte `jmp` follows it, which the hook makes to its target.
    Before, both files were refused. The output runs as the original (its children exit 0);
    restore gives the original back."""
    out = tmp_path / "out"
    res = run_cli("rewrite", built[name], "-o", out, "--json")
    assert res.rc == 0, res.err
    said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
    assert "hooked" in said["fork-guarded"], said
    run = [subprocess.run([str(p), "2"], capture_output=True, text=True, timeout=30,
                          check=True).stdout for p in (built[name], out)]
    assert run[0] == run[1] and run[0].count("child-status 0") == 2
    assert run_cli("restore", out, "-o", tmp_path / "back").rc == 0
    assert (tmp_path / "back").read_bytes() == built[name].read_bytes()


def test_rewrite_hooks_the_fork_system_call(built: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_cli("rewrite", built["fork-stripped"], "-o", out, "--json")
    assert res.rc == 0, res.err
    said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
    assert "hooked" in said["fork-guarded"], said
    lo, hi = _nm(built["fork"], "_Fork")
    image = load(out).image
    jumps = [a for a in range(lo, hi) if image.read_vaddr(a, 1) == b"\xe9"
             and image.read_vaddr(a + 5, 2) == b"\xcc\xcc"]
    assert jumps, "no jmp over the fork system call in _Fork"
    run = [subprocess.run([str(p), "2"], capture_output=True, text=True, timeout=30,
                          check=True).stdout for p in (built["fork-stripped"], out)]
    assert run[0] == run[1]


@pytest.mark.parametrize("dry", [False, True])
def test_rewrite_auto_refuses_a_fork_it_cannot_hook(built: dict[str, Path], tmp_path: Path,
                                                    dry: bool) -> None:
    out = tmp_path / "out"
    args = ["--dry-run"] if dry else ["-o", out]
    res = run_cli("rewrite", built["rawfork-wayin-stripped"], *args)
    assert res.rc == 2, (res.rc, res.out, res.err)
    assert "--fork-guard never" in res.err and "system call at" in res.err
    assert len(res.err.strip().splitlines()) == 1 and "Traceback" not in res.err
    assert not out.exists()
    accepted = run_cli("rewrite", built["rawfork-wayin-stripped"], "-o", out, "--fork-guard",
                       "never")
    assert accepted.rc == 0, accepted.err


def test_no_fork_found_is_said_not_silence(built: dict[str, Path], tmp_path: Path) -> None:
    rep = api.check(built["nofork-stripped"])
    codes = [f.code for f in rep.findings]
    assert "fork-unknown" in codes and "process-can-fork" not in codes
    for args in (["-o", tmp_path / "out"], ["--dry-run"]):
        res = run_cli("rewrite", built["nofork-stripped"], *args, "--json")
        assert res.rc == 0, res.err
        said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
        # the hook covers what fork-unknown warned of: said once, as fork-guarded
        assert "fork-unknown" not in said, said
        assert "compare their number with the fork ones at run time" in said["fork-guarded"]
    res = run_cli("rewrite", built["nofork-stripped"], "-o", tmp_path / "never", "--json",
                  "--fork-guard", "never")
    assert res.rc == 0, res.err
    said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
    assert "fork-unknown" in said and "fork-guarded" not in said  # unguarded: still true


def test_check_predicts_the_refusal(built: dict[str, Path]) -> None:
    from tests.test_check_equals_rewrite import refusal_mismatch

    assert [m for p in built.values() if (m := refusal_mismatch(p))] == []


@pytest.mark.parametrize("name", ["sysfork", "sysfork-stripped", "nofork-stripped"])
def test_rewrite_hooks_a_system_call_of_unknown_number(built: dict[str, Path], tmp_path: Path,
                                                       name: str) -> None:
    out = tmp_path / "out"
    res = run_cli("rewrite", built[name], "-o", out, "--json")
    assert res.rc == 0, res.err
    said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
    assert "compare their number with the fork ones at run time" in said["fork-guarded"]
    if name.startswith("sysfork"):
        lo, hi = _nm(built["sysfork"], "syscall")
        m = re.findall(r"0x[0-9a-f]+", said["fork-guarded"].split("system call")[-1])
        assert any(lo <= int(a, 16) < hi for a in m), said["fork-guarded"]
    run = [subprocess.run([str(p), "2"], capture_output=True, text=True, timeout=30,
                          check=True).stdout for p in (built[name], out)]
    assert run[0] == run[1]


def test_a_fork_through_the_libraries_syscall_is_interposed(built: dict[str, Path],
                                                           tmp_path: Path) -> None:
    """Linked dynamically, syscall() is the C library's: the guard interposes the file's GOT
    slot of it (issue 31; tests/test_fork_routes.py runs the child traced), and check says
    nothing is unavailable. The program's own fork system call (rawfork, dynamically linked)
    is still refused, by check first."""
    path = built["sysfork-dynamic"]
    codes = {f.code: f.message for f in api.check(path).findings}
    assert "fork-guard-unavailable" not in codes, codes
    res = run_cli("rewrite", path, "-o", tmp_path / "out", "--json")
    assert res.rc == 0, res.err
    said = {f["code"]: f["message"] for f in json.loads(res.out)["files"][0]["findings"]}
    assert "syscall() interposed" in said["fork-guarded"], said
    raw = built["rawfork-dynamic"]
    codes = {f.code: f.message for f in api.check(raw).findings}
    assert "system call at" in codes["fork-guard-unavailable"], codes
    res = run_cli("rewrite", raw, "-o", tmp_path / "raw")
    assert res.rc == 2 and "--fork-guard never" in res.err, (res.rc, res.err)
    assert not (tmp_path / "raw").exists()
    assert run_cli("rewrite", raw, "-o", tmp_path / "raw", "--fork-guard", "never").rc == 0


def _traced(path: Path, provider: str = "sfork") -> str:
    script = f"usdt:{path}:{provider}:site {{ @n = count(); }}"
    done = subprocess.run(["bpftrace", "-e", script, "-c", f"{path} 3"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return "\n".join(sorted(ln for ln in done.stdout.splitlines()
                            if ln.startswith(("child", "parent"))))


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize("name", ["fork", "fork-stripped", "sysfork", "sysfork-stripped",
                                  "rawfork-stripped", "rawfork-jmp-stripped"])
def test_guarded_static_children_survive_tracing(built: dict[str, Path], tmp_path: Path,
                                                 name: str) -> None:
    out = tmp_path / "out"
    res = run_cli("rewrite", built[name], "-o", out, "--json")
    assert res.rc == 0, res.err
    doc = json.loads(res.out)["files"][0]
    assert any(f["code"] == "fork-guarded" for f in doc["findings"]), doc["findings"]
    provider = "rawfork" if name.startswith("rawfork") else "sfork"
    want = _traced(built[name], provider)
    assert want.count("child-status 0") == 3
    assert _traced(out, provider) == want
    bare = tmp_path / "bare"
    assert run_cli("rewrite", built[name], "-o", bare, "--fork-guard", "never").rc == 0
    assert "child-status 0" not in _traced(bare, provider)  # unguarded, every traced child dies


def test_hooked_guard_verifies_and_restores(built: dict[str, Path], tmp_path: Path) -> None:
    """The emulator runs the hooked guard's child stub (`verify`: the child's sites are back
    on the int3 path), and `restore` gives the original file back, byte for byte."""
    out, back = tmp_path / "out", tmp_path / "back"
    assert run_cli("rewrite", built["fork-stripped"], "-o", out).rc == 0
    res = run_cli("verify", out)
    assert res.rc == 0, res.out + res.err
    assert "fork-guarded" in res.out and "re-armed" in res.out
    assert run_cli("restore", out, "-o", back).rc == 0
    assert back.read_bytes() == built["fork-stripped"].read_bytes()
