"""Computed jumps into a probed function from another one (issue 30, class 4), on
tests/data/computed.c built by gcc and clang, PIE and not:

- fnbase: a relative table in .rodata whose entries are relative to the probed function's
  symbol (`lea fnbase(%rip)` is the base the entry is added to);
- arith: a table whose base is built by arithmetic (`lea T-64(%rip); add $64`);
- far: the entry lies 4200 entries (more than 16 KiB) after its table's base;
- cut: another function takes the address of an entry of the table (a `lea` target inside
  it, which the data scan took for the start of another table);
- leaadd: `lea leaadd(%rip)` plus the offset of the instruction after the probe;
- unbound: a relative table without a bounds check lands after the probe: the functions
  its entries land in are all-targets (before, the site was refused for the entry the data
  scan found, as a way in: the principle now refuses it whatever the scan finds);
- otherreg: the dispatcher compares another register than its index: no bounds (all-targets,
  as unbound), the check must not take it for the table's bounds;
- taken: the bounds check is a `jbe` taken to the table's block (PostgreSQL's switches):
  bounded, its entry is a way in; fellbe: a `jbe` fallen through into the table bounds
  nothing (all-targets);
- padjmp_other (libruby's shape): alignment NOPs after a jump are reached by no one, so the
  tail call after them is not computed by the arithmetic before the jump (before: every
  function of the file was all-targets, libruby's 40 sites refused);
- distance: another function takes its address less a register (a reach check): a distance,
  not an address (the assumption code-differences): not poisoned, rewritten; subconst: the
  address less a register set to a constant in the line is an address: poisoned;
- plain, and leaplain (its address is taken and stored as it is, no arithmetic): no way in
  from elsewhere (rewritten: the detour is used).

And tests/data/computed-unknown.c: a jump to a pointer loaded from data plus 16 lands after
a probe; the base is not known, so every function is all-targets and no site is rewritten.

Before, the file-wide scans missed each of these ways in: every site was rewritten and
"proved", and the output died with SIGSEGV or looped. Now a bounded table's entry is a way
in (`window-branch-target`, naming the entry's address) and a computed target whose base
is the probed function, or arithmetic on its address, makes it all-targets
(`window-all-targets`, naming the instruction).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, build_programs, run_cli
from tests.test_analysis_waysin import _site, _sources, _symbol
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.analysis.computed import computed_flow
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "computed.c"
_INCLUDE = ["-O2", "-g0", "-I", str(ROOT / "fixtures" / "src"), "-I", str(SOURCE.parent)]
BUILDS = {f"{cc}-{kind}": (cc, [*flags, *_INCLUDE]) for cc in ("gcc", "clang")
          for kind, flags in (("pie", ["-fPIE", "-pie"]), ("nopie", ["-fno-pie", "-no-pie"]))}
TABLES = ("arith", "far", "cut", "taken")  # a bounded table's entry: window-branch-target
POISONED = {"fnbase": "arithmetic on the address of code", "leaadd": "computes the target",
            "unbound": "has no bounds check", "otherreg": "has no bounds check",
            "fellbe": "has no bounds check", "subconst": "arithmetic on the address of code"}

pytestmark = [pytest.mark.needs_cc,
              pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_programs(tmp_path_factory.mktemp("computed"), SOURCE.read_text(), BUILDS,
                          name=SOURCE.name)


def _each(programs: dict[str, Path], build: str) -> Path:
    if build not in programs:
        pytest.skip(f"{BUILDS[build][0]} is not installed")
    return programs[build]


@pytest.mark.parametrize("build", BUILDS)
def test_each_computed_way_in_is_refused_by_name(programs: dict[str, Path], build: str) -> None:
    path = _each(programs, build)
    rep = check(load(path))
    assert _site(rep, "plain").outcome == "forward"
    assert _site(rep, "leaplain").outcome == "forward"
    for name in TABLES:
        s = _site(rep, name)
        assert s.blocked == "window-branch-target", (name, s.outcome)
        assert s.window is not None
        entry, _end = _symbol(path, f"{name}_entry")
        assert entry in _sources(s.window.reason), (name, s.window.reason)
        assert "relative-table-entry" in s.window.reason
    for name, why in POISONED.items():
        s = _site(rep, name)
        assert s.blocked == "window-all-targets", (name, s.outcome)
        assert s.window is not None and why in s.window.reason, (name, s.window)
        lo, hi = _symbol(path, f"{name}_other")
        named = [int(a, 16) for a in re.findall(r"0x[0-9a-f]+", s.window.reason)]
        assert any(lo <= a < hi for a in named), (name, s.window.reason)


@pytest.mark.parametrize("build", BUILDS)
def test_what_the_file_wide_pass_finds(programs: dict[str, Path], build: str) -> None:
    """The pass itself: the three bounded tables' entries (each from its jump), the two
    poisoned functions, and nothing else: plain and the dispatchers are not poisoned."""
    path = _each(programs, build)
    rep = check(load(path))
    ctx = rep.context
    assert ctx is not None
    sites = []
    for s in rep.sites:
        assert s.function is not None
        sites.append((s.probe.address, s.function.start, s.function.end))
    got = computed_flow(ctx, sites)
    entries = {w.source: w.target for w in got.ways}
    for name in TABLES:
        entry, _end = _symbol(path, f"{name}_entry")
        assert entries.get(entry) == _site(rep, name).probe.address + 1, name
    assert sorted(got.poisoned) == sorted(_symbol(path, n)[0] for n in POISONED)
    assert got.everywhere is None


@pytest.mark.parametrize("build", BUILDS)
def test_check_predicts_rewrite(programs: dict[str, Path], build: str) -> None:
    assert _mismatches(_each(programs, build)) == []


def _run(path: Path) -> tuple[int, str]:
    try:
        done = subprocess.run([str(path), "3"], capture_output=True, text=True, timeout=20,
                              check=False)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    return done.returncode, done.stdout


@pytest.mark.parametrize("build", BUILDS)
def test_rewritten_programs_run_as_the_original(programs: dict[str, Path], build: str,
                                                tmp_path: Path) -> None:
    path = _each(programs, build)
    out = tmp_path / "out"
    res = run_cli("rewrite", path, "-o", out)
    assert res.rc == 0, res.err
    assert out.read_bytes() != path.read_bytes()  # plain is rewritten
    want = _run(path)
    assert want[0] == 0
    assert _run(out) == want


UNKNOWN = ROOT / "tests" / "data" / "computed-unknown.c"


@pytest.fixture(scope="module")
def unknown(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    builds = {k: v for k, v in BUILDS.items() if k.startswith("gcc")}
    return build_programs(tmp_path_factory.mktemp("unknown"), UNKNOWN.read_text(), builds,
                          name=UNKNOWN.name)


@pytest.mark.parametrize("build", ["gcc-pie", "gcc-nopie"])
def test_a_computed_target_of_unknown_base_poisons_every_function(
        unknown: dict[str, Path], build: str, tmp_path: Path) -> None:
    path = unknown[build]
    rep = check(load(path))
    lo, hi = _symbol(path, "target_other")
    for s in rep.sites:
        assert s.blocked == "window-all-targets", (s.probe.name, s.outcome)
        assert s.window is not None and "base that is not known" in s.window.reason
        named = [int(a, 16) for a in re.findall(r"0x[0-9a-f]+", s.window.reason)]
        assert any(lo <= a < hi for a in named), s.window.reason
    assert _mismatches(path) == []
    out = tmp_path / "out"
    run_cli("rewrite", path, "-o", out)
    if out.exists():
        assert _run(out) == _run(path)


@pytest.mark.parametrize("build", BUILDS)
def test_the_jump_scan_says_what_the_part_scan_says(programs: dict[str, Path],
                                                    build: str) -> None:
    """The file-wide pass reads every function holding an indirect jump through
    targets.scan_jumps (the verdicts only): the same tables and computed jumps, in the same
    order, as the part scan of the same function (scan_part, which collects every target)."""
    from usdtpatch.analysis.targets import scan_jumps, scan_part

    rep = check(load(_each(programs, build)))
    ctx = rep.context
    with_jumps = 0
    for start in ctx.cfi.starts:
        b = ctx.bounds(start)
        if b is None:
            continue
        part = scan_part(ctx, b)
        tables, computed = scan_jumps(ctx, b)
        assert (tables, computed) == (list(part.tables), list(part.computed)), hex(start)
        with_jumps += bool(tables or computed)
    assert with_jumps >= 5


def test_the_kept_register_writes_are_the_texts(programs: dict[str, Path]) -> None:
    """targets.may_write keeps may_write_text's answer by what it reads (the mnemonic, its
    base and the operands' text): over every instruction of a build and of /usr/bin's
    python3.11 where there is one, and every register the searches ask about, asked twice
    (the second answer from the memo), it says what the text says; an instruction made
    without its base mnemonic is another question."""
    from usdtpatch.analysis.targets import may_write, may_write_text
    from usdtpatch.x86.decode import CodeInsn, Flow

    regs = ["rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
            *(f"r{i}" for i in range(8, 16))]
    paths = list(programs.values())
    if Path("/usr/bin/python3.11").exists():
        paths.append(Path("/usr/bin/python3.11"))
    asked = writes = 0
    for path in paths:
        ctx = check(load(path)).context
        for start in sorted(ctx.cfi.starts)[:400]:
            b = ctx.bounds(start)
            if b is None:
                continue
            for ins in ctx.sweep(b.start, b.end).insns:
                for reg in regs:
                    want = may_write_text(ins, reg)
                    assert may_write(ins, reg) == want == may_write(ins, reg), (ins, reg)
                    asked += 1
                    writes += want
    assert asked > 10_000 and 0 < writes < asked
    # "xchg %rax, %rbx" read with and without its base mnemonic: two answers
    bare = CodeInsn(0x1000, 3, "xchgq", "%rax, %rbx", Flow.NONE, None, None, None)
    full = bare._replace(base_mnemonic="xchgq")
    assert [may_write(i, "rax") for i in (bare, full, bare, full)] == [False, True] * 2
