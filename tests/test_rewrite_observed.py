"""What a moved instruction's pc and a moved call's return address look like to whoever
observes them (issue 30, classes 6 and 7, and "a system call never runs from a detour"), on
the programs of tests/data/observed built with gcc and clang, -O0 and -O2, PIE and not, and
as a shared library:

- retaddr.c: a callee reads its return address (dladdr, backtrace_symbols, a caller-range
  check). Before, the default moved the call and the callee printed `dladdr ?; backtrace
  (+0x531a); outside the caller`; now the call is emulated and the callee sees the original.
  A call that still moves (`--calls move`, a SHSTK-marked file) says so
  (`moved-call-return-address`, naming the detour's return address).
- faultpc.c: SIGSEGV handlers recognise their expected faults by pc. Before, the range-checked
  load moved into the detour and its fault was "foreign" (exit 3); now the load keeps its pc
  (another window, or `window-fault-observed`).
- syscallpc.c: a seccomp filter allows getppid only from two syscall instructions' pcs.
  Before, both moved and were refused (EPERM); now one site takes a window without the
  syscall and the other is left alone with `window-syscall`.

Each program runs original and rewritten, untraced and (live) traced by bpftrace, with the
same output; check predicts what rewrite decides.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, build_programs, fixture, run_cli
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch import api
from usdtpatch.analysis.check import CheckOptions, check
from usdtpatch.x86.decode import sweep

DATA = ROOT / "tests" / "data" / "observed"
INCLUDE = ["-g0", "-I", str(ROOT / "fixtures" / "src")]
BUILDS = {f"{cc}-{o}-{pie}": (cc, [f"-{o}", *flags, *INCLUDE])
          for cc in ("gcc", "clang") for o in ("O0", "O2")
          for pie, flags in (("pie", ["-fPIE", "-pie"]), ("nopie", ["-fno-pie", "-no-pie"]))}

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


def _build(folder: Path, name: str, extra: list[str]) -> dict[str, Path]:
    builds = {k: (cc, [*flags, *extra]) for k, (cc, flags) in BUILDS.items()}
    out = build_programs(folder, (DATA / name).read_text(), builds, name=name)
    # the shared library and its main
    lib = folder / f"lib{name[:-2]}.so"
    subprocess.run(["gcc", "-O2", "-DLIB", "-fPIC", "-shared", *INCLUDE, "-o", str(lib),
                    str(folder / name)], check=True)
    main = folder / f"{name[:-2]}-main"
    subprocess.run(["gcc", "-O2", "-o", str(main), str(DATA / f"{name[:-2]}-main.c"),
                    f"-L{folder}", f"-l{name[:-2]}", "-Wl,-rpath,$ORIGIN"], check=True)
    out["shared"] = lib
    return out


@pytest.fixture(scope="module")
def retaddr(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _build(tmp_path_factory.mktemp("retaddr"), "retaddr.c", ["-rdynamic"])


@pytest.fixture(scope="module")
def faultpc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _build(tmp_path_factory.mktemp("faultpc"), "faultpc.c", [])


def _run(path: Path, *args: str) -> tuple[int, str]:
    """The program's exit status and output (a shared library: through its main)."""
    if path.suffix == ".so":
        exe = path.parent / f"{path.name[3:-3]}-main"
        done = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=30,
                              check=False, env={"LD_LIBRARY_PATH": str(path.parent)})
    else:
        done = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=30,
                              check=False)
    return done.returncode, done.stdout


def _rewritten_alike(program: Path, tmp: Path, *options: str) -> dict[str, Any]:
    """`program` rewritten (the library in place of the original, in a copy of its folder),
    run as the original: the same exit status and output. Returns the rewrite's JSON."""
    out_dir = tmp / "new"
    out_dir.mkdir()
    for f in program.parent.iterdir():
        if f.is_file():
            shutil.copy2(f, out_dir / f.name)
    out = out_dir / program.name
    res = run_cli("rewrite", *options, "--json", program, "-o", out)
    assert res.rc == 0, res.err
    doc: dict[str, Any] = json.loads(res.out)["files"][0]
    if any(s["action"] != "skipped" for s in doc["sites"]):
        assert out.read_bytes() != program.read_bytes()
    assert _run(out) == _run(program), program.name
    return doc


# A position-independent build forms `fn + 8` or `fn + 256` (the pcs and ranges these programs
# compare) with a `lea fn(%rip)` and an `add`: arithmetic on a code address, which makes the
# function all-targets (analysis/computed.py): its sites are left alone by that rule before
# the pc rules are asked. The fixed-address builds fold the sums into immediates (a word the
# ways-in scan reads) and test the pc rules.
def _arith(site: dict[str, Any]) -> bool:
    return site["action"] == "skipped" and site["code"] == "window-all-targets" and \
        "arithmetic on the address of code" in site["reason"]


@pytest.mark.parametrize("build", [*BUILDS, "shared"])
def test_callee_sees_the_original_return_address(retaddr: dict[str, Path], build: str,
                                                 tmp_path: Path) -> None:
    rc, text = _run(retaddr[build])
    assert rc == 0 and "dladdr caller;" in text and "inside the caller" in text, text
    doc = _rewritten_alike(retaddr[build], tmp_path)
    (site,) = doc["sites"]
    if site["calls"] is not None:  # the window holds the call (every build but clang -O0)
        assert site["calls"] == "emulated"
        assert [r["seen"] == r["original"] for r in site["returns"]] == [True]
        assert "(original)" in site["reason"]


def test_a_moved_call_says_what_its_callee_sees(retaddr: dict[str, Path],
                                                tmp_path: Path) -> None:
    program = retaddr["gcc-O2-pie"]
    out = tmp_path / "moved"
    res = run_cli("rewrite", "--calls", "move", "--json", program, "-o", out)
    assert res.rc == 0, res.err
    doc = json.loads(res.out)["files"][0]
    (site,) = doc["sites"]
    assert site["calls"] == "moved"
    ((ret,),) = [[r for r in site["returns"]]]
    assert ret["seen"] != ret["original"] and \
        site["detour"]["address"] <= ret["seen"] < site["detour"]["address"] + \
        site["detour"]["size"]
    said = [f for f in doc["findings"] if f["code"] == "moved-call-return-address"]
    assert said and f"{ret['seen']:#x}" in said[0]["message"]
    # what the finding says is what the callee sees
    _rc, text = _run(out)
    assert "dladdr ?;" in text and "outside the caller" in text, text
    # and check says it too, before the rewrite
    rep = check(api.load(program), options=CheckOptions(calls="move"))
    assert [f.code for f in rep.sites[0].findings] == ["moved-call-return-address"]


def _pinned_moved(path: Path, doc: dict[str, Any]) -> list[str]:
    """The moved instructions of every rewritten site that fault or make system calls."""
    from usdtpatch.analysis.observed import may_fault, system_call

    image = api.load(path).image
    out = []
    for s in doc["sites"]:
        w = s["window"]
        if s["action"] not in ("detour", "moved") or w is None:
            continue
        code = image.read_vaddr(w["start"], w["end"] - w["start"])
        for ins in sweep(code, w["start"]).insns:
            if ins.address != s["address"] and (may_fault(ins) or system_call(ins)):
                out.append(f"{s['name']}: {ins.text} at {ins.address:#x}")
    return out


@pytest.mark.parametrize("build", [*BUILDS, "shared"])
def test_a_fault_recognised_by_its_pc_keeps_its_pc(faultpc: dict[str, Path], build: str,
                                                   tmp_path: Path) -> None:
    rc, text = _run(faultpc[build])
    assert rc == 0 and "expected faults 6" in text, text
    doc = _rewritten_alike(faultpc[build], tmp_path)
    sites = {s["name"]: s for s in doc["sites"]}
    got = {n: "arith" if _arith(s) else s["action"] for n, s in sites.items()}
    assert got["label"] == "detour" and got["range"] in ("detour", "arith") and \
        got["first"] in ("skipped", "arith"), got
    if not _arith(sites["first"]):
        assert sites["first"]["code"] == "window-fault-observed"
        assert "(movq (%rdi), %rax) can fault" in sites["first"]["reason"]
    for s in doc["sites"]:
        assert not s["faults"], s  # no moved instruction faults: none is reported elsewhere
    assert _pinned_moved(faultpc[build], doc) == []


def test_a_moved_fault_is_reported_per_site() -> None:
    """Where nothing compares the function's address, a load moves and the report says
    where its fault is now reported (the args-O2 fixture's `f_sib` probe)."""
    plan = api.rewrite_plan(fixture("args-O2"), verify=False)
    mem = next(s for s in plan.sites if s.probe.name == "f_sib")
    assert mem.faults and mem.detour is not None
    ((at, seen),) = mem.faults
    assert dict(mem.detour.insn_map)[at] == seen
    assert f"a fault at {at:#x} is reported at {seen:#x}" in mem.reason


@pytest.mark.parametrize("build", ["gcc-O2-pie", "clang-O0-nopie", "gcc-O0-pie"])
def test_a_system_call_never_moves(build: str, tmp_path: Path) -> None:
    cc, flags = BUILDS[build]
    if shutil.which(cc) is None:
        pytest.skip(f"needs {cc}")
    (program,) = build_programs(tmp_path, (DATA / "syscallpc.c").read_text(),
                                {build: (cc, flags)}, name="syscallpc.c").values()
    assert _run(program) == (0, "fixed ok, bare ok\n" * 2)
    # the file may fork through a syscall of unknown number (ppid_bare): no guard for it
    doc = _rewritten_alike(program, tmp_path, "--fork-guard", "never")
    sites = {s["name"]: s for s in doc["sites"]}
    if "nopie" not in build and all(_arith(s) for s in sites.values()):
        return  # the pie builds' `fn + 8`: every site left alone by the computed-flow rule
    assert sites["fixed"]["action"] == "detour"
    bare = sites["bare"]
    if bare["action"] == "skipped":
        assert bare["code"] == "window-syscall"
        assert re.search(r"0x[0-9a-f]+ \(syscall\) is a system call", bare["reason"])
    else:  # a short window [nop, mov] where a stub place is in reach: the syscall stays
        assert "entered by a jmp rel8 through the stub" in bare["reason"]
        assert bare["window"]["end"] - bare["window"]["start"] == 3
    assert _pinned_moved(program, doc) == []
    assert _mismatches(program) == []


@pytest.mark.parametrize("name", ["retaddr", "faultpc"])
def test_check_predicts_rewrite(retaddr: dict[str, Path], faultpc: dict[str, Path],
                                name: str) -> None:
    programs = retaddr if name == "retaddr" else faultpc
    assert [m for p in programs.values() for m in _mismatches(p)] == []


def _traced(path: Path) -> tuple[list[str], int]:
    """The program's lines and the probe hits while bpftrace traces every probe."""
    script = f"usdt:{path}:*:* {{ @n = count(); }}"
    done = subprocess.run(["bpftrace", "-e", script, "-c", f"{path} 3"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    m = re.search(r"@n: (\d+)", done.stdout)
    lines = [ln for ln in done.stdout.splitlines()
             if ln.startswith(("callee", "seen", "sum", "fixed"))]
    return lines, int(m.group(1)) if m else 0


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bpftrace") is None, reason="needs bpftrace")
@pytest.mark.parametrize("name", ["retaddr", "faultpc"])
def test_traced_alike(retaddr: dict[str, Path], faultpc: dict[str, Path], name: str,
                      tmp_path: Path) -> None:
    program = (retaddr if name == "retaddr" else faultpc)["gcc-O2-pie"]
    out = tmp_path / program.name
    assert run_cli("rewrite", program, "-o", out).rc == 0
    want, want_hits = _traced(program)
    assert want and want_hits > 0
    assert _traced(out) == (want, want_hits)
