"""Branch targets: direct targets against objdump, and how indirect jumps are classified."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES, fixture
from usdtpatch.analysis.check import check
from usdtpatch.analysis.functions import FunctionBounds
from usdtpatch.analysis.targets import JUMP, RETURN_SITE, CodeContext, _Graph, _origin
from usdtpatch.api import load
from usdtpatch.elf.cfi import load_cfi
from usdtpatch.elf.symbols import load_symbols
from usdtpatch.x86.decode import Flow, sweep

_LINE = re.compile(r"^\s+([0-9a-f]+):\t(.*)$")
_BRANCH = re.compile(r"^(?:bnd |notrack )?(j[a-z]+|loop[a-z]*|call)\s+([0-9a-f]+)\b")


def objdump_view(path: Path, start: int, end: int) -> tuple[set[int], set[int], set[int]]:
    """(instruction starts, direct jump targets inside, return sites) per binutils objdump."""
    exe = shutil.which("objdump")
    if exe is None:
        pytest.skip("objdump not installed")
    out = subprocess.run([exe, "-d", "--no-show-raw-insn", f"--start-address={start:#x}",
                          f"--stop-address={end:#x}", str(path)], capture_output=True,
                         text=True, check=True).stdout
    starts: set[int] = set()
    jumps: set[int] = set()
    returns: set[int] = set()
    after_call = False
    for line in out.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        addr, text = int(m.group(1), 16), m.group(2).strip()
        starts.add(addr)
        if after_call:
            returns.add(addr)
        after_call = text.startswith("call")
        b = _BRANCH.match(text)
        if b and b.group(1) != "call" and start <= int(b.group(2), 16) < end:
            jumps.add(int(b.group(2), 16))
    return starts, jumps, returns


@pytest.mark.parametrize("path", [
    fixture("cxx-throw"), fixture("forms-mixed"), fixture("sema-dtrace"), fixture("static"),
    REAL_BINARIES["libstdc++"], REAL_BINARIES["python3.11"],
], ids=["cxx-throw", "forms-mixed", "sema-dtrace", "static", "libstdc++", "python3.11"])
def test_probe_functions_agree_with_objdump(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")
    ps = load(str(path))
    ctx = CodeContext(ps.image, load_cfi(ps.image), load_symbols(ps.image))
    report = check(ps)
    bounds = {s.function for s in report.sites if s.function is not None}
    assert bounds
    for b in bounds:
        fc = ctx.function(b)
        starts, jumps, returns = objdump_view(path, b.start, b.end)
        assert set(fc.starts) == starts
        assert jumps <= {a for a, ts in fc.incoming.items() if any(t.kind == JUMP for t in ts)}
        assert returns <= {a for a, ts in fc.incoming.items()
                           if any(t.kind == RETURN_SITE for t in ts)}
        assert all(fc.bounds.contains(a) for a in fc.targets)


BASE = 0x1000


def _origin_of(hexcode: str, reg: str) -> tuple[int, ...] | str:
    """What the `jmp *%reg` in hexcode jumps to."""
    code = bytes.fromhex(hexcode)
    sw = sweep(code, BASE)
    g = _Graph(sw.insns, {BASE})
    bounds = FunctionBounds(BASE, BASE + len(code), "symbol", "f", None)
    (k,) = [k for k, i in enumerate(sw.insns) if i.flow is Flow.JMP_INDIRECT]
    return _origin(g, k, reg, bounds)


@pytest.mark.parametrize(("code", "reg", "expected"), [
    # movq 0x10(%rsi), %rax; jmpq *%rax          -- a pointer from a structure: tail call
    ("488b4610" "ffe0", "rax", ()),
    # movq -1(%rdx,%rax), %rax; jmpq *%rax       -- a C++ member-function pointer: tail call
    ("488b4402ff" "ffe0", "rax", ()),
    # movq %rdi, %rax; jmpq *%rax                -- a function pointer argument: tail call
    ("4889f8" "ffe0", "rax", ()),
    # callq .+5; jmpq *%rax                      -- a returned function pointer: tail call
    ("e800000000" "ffe0", "rax", ()),
    # leaq 2(%rip), %rax; jmpq *%rax; nop; nop   -- goto *&&label: the label is a target
    ("488d0502000000" "ffe0" "9090", "rax", (BASE + 9,)),
], ids=["struct-pointer", "member-pointer", "argument", "returned", "label"])
def test_indirect_jump_origins(code: str, reg: str, expected: tuple[int, ...]) -> None:
    assert _origin_of(code, reg) == expected


@pytest.mark.parametrize(("code", "reg", "why"), [
    # movq %rdi, %rax; addq %rsi, %rax; jmpq *%rax   -- computed: no idea where it goes
    ("4889f8" "4801f0" "ffe0", "rax", "computes it"),
    # jmpq *%rbx with %rbx never set                  -- a callee-saved value from the caller
    ("ffe3", "rbx", "not set"),
    # callq .+5; jmpq *%rcx                           -- %rcx is clobbered by the call
    ("e800000000" "ffe1", "rcx", "clobbered"),
], ids=["computed", "unset-callee-saved", "clobbered"])
def test_indirect_jumps_not_understood(code: str, reg: str, why: str) -> None:
    got = _origin_of(code, reg)
    assert isinstance(got, str) and why in got


def test_a_function_that_never_returns() -> None:
    """never_returns (a call's fall-through cut when a jump table's base is searched past it,
    issue 31: musl's posix_spawn child): glibc's `_exit` (a loop of exit system calls, then
    hlt), `exit` and `abort` (which end in calls of such functions) never return; `getpid`
    and `main` do, and so does an address that is no function's entry."""
    from usdtpatch.analysis.targets import never_returns
    from usdtpatch.elf.symbols import symbol_value

    image = load(fixture("static")).image
    ctx = CodeContext(image, load_cfi(image), load_symbols(image))
    at = {n: symbol_value(image, n) for n in ("_exit", "exit", "abort", "getpid", "main")}
    assert all(a is not None for a in at.values())
    assert {n: never_returns(ctx, a) for n, a in at.items() if a is not None} == {
        "_exit": True, "exit": True, "abort": True, "getpid": False, "main": False}
    exit_at = at["_exit"]
    assert exit_at is not None and not never_returns(ctx, exit_at + 1)
