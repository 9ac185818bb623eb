"""usdtpatch/kernelfacts.py: the kernel generations are one table, the uprobe syscall's answer
is read one way by everything that asks it (`rewrite --form auto`, kcheck, bench, the live
tests' precondition), and no module outside the table names a generation's errno, bytes or
protocol."""

from __future__ import annotations

import ast
import ctypes
import errno
import os
import platform
import re
import sys
from pathlib import Path

import pytest

from tests.helpers import NONE_GEN, NOP5_GEN, NOP10_GEN, ROOT
from usdtpatch.errors import UnsupportedError
from usdtpatch.kernelfacts import (
    CHOICES,
    DEFAULT,
    GENERATIONS,
    OPTIMIZING,
    Generation,
    generation,
    generation_of_errno,
    generation_of_nop,
    kernel_of_errno,
)
from usdtpatch.live import kcheck, perf
from usdtpatch.rewriter.kernel import detect_kernel

X86_64_LINUX = sys.platform.startswith("linux") and platform.machine() == "x86_64"

# (the syscall's errno, the optimizing generation it means; None: a kernel that optimizes no
# uprobe, or an answer no generation gives)
ANSWERS = [(errno.ENXIO, NOP5_GEN), (errno.EPROTO, NOP10_GEN),
           (errno.ENOSYS, None), (errno.EPERM, None)]


@pytest.mark.parametrize(("answer", "gen"), ANSWERS)
def test_each_answer_names_one_generation(answer: int, gen: Generation | None) -> None:
    assert kernel_of_errno(answer)[0] is gen
    assert kernel_of_errno(None)[0] is None


def test_enosys_is_the_generation_that_optimizes_nothing() -> None:
    g, why = generation_of_errno(errno.ENOSYS)
    assert g is NONE_GEN and not g.optimizes and "no uprobe syscall" in why
    assert generation_of_errno(errno.EPERM)[0] is None
    assert generation_of_errno(None)[0] is None


def test_every_generation_reads_back_from_its_answer() -> None:
    assert [generation_of_errno(g.errno)[0] for g in GENERATIONS] == list(GENERATIONS)
    assert len({g.errno for g in GENERATIONS}) == len(GENERATIONS)
    assert len({g.name for g in GENERATIONS}) == len(GENERATIONS)


def test_names_and_aliases() -> None:
    """--kernel takes each optimizing generation's name and the names a user may have
    written before (6.18, nop10-series); a release number is never the rule."""
    assert generation("nop5") is NOP5_GEN and generation("6.18") is NOP5_GEN
    assert generation("nop10") is NOP10_GEN and generation("nop10-series") is NOP10_GEN
    assert set(CHOICES) == {"nop5", "6.18", "nop10", "nop10-series"}
    for bad in ("7.3", "7.2.13", "nop7", ""):
        with pytest.raises(ValueError, match="kernel must be one of"):
            generation(bad)
    assert DEFAULT is NOP5_GEN and OPTIMIZING == (NOP5_GEN, NOP10_GEN)


def test_the_rows_hold_the_measured_facts() -> None:
    """docs/kernel.md's measured table, row by row."""
    assert (NOP5_GEN.nop_length, NOP10_GEN.nop_length, NONE_GEN.nop_length) == (5, 10, 0)
    assert generation_of_nop(5) is NOP5_GEN and generation_of_nop(10) is NOP10_GEN
    assert generation_of_nop(1) is None
    # what an optimized site reads: e8 rel32; lea -0x80(%rsp),%rsp; e8 rel32
    assert NOP5_GEN.optimized(-0x10) == bytes.fromhex("e8f0ffffff")
    assert NOP10_GEN.optimized(0x1000) == bytes.fromhex("488d642480e800100000")
    # the hazards: nop5 writes the 32 bytes below rsp and fork loses the trampoline
    assert NOP5_GEN.red_zone_hazard and not NOP5_GEN.fork_keeps_sites
    assert not NOP10_GEN.red_zone_hazard and NOP10_GEN.fork_keeps_sites
    # the trampolines: 19 bytes ending `ret; int3`, 21 ending `ret $0x80; int3`
    assert len(NOP5_GEN.trampoline) == 19 and NOP5_GEN.trampoline.endswith(b"\xc3\xcc")
    assert NOP10_GEN.trampoline.endswith(bytes.fromhex("c28000cc"))
    assert NONE_GEN.trampoline == b""
    # a CS-prefixed nop10 is probed by the generation that optimizes it only
    nop10 = bytes.fromhex("662e0f1f840000000000")
    assert NOP10_GEN.probeable(nop10, b"\x66\x2e")
    assert not NOP5_GEN.probeable(nop10, b"\x66\x2e")
    assert not NONE_GEN.probeable(nop10, b"\x66\x2e")
    assert NOP5_GEN.probeable(bytes.fromhex("0f1f440000"), b"")


@pytest.mark.skipif(not X86_64_LINUX, reason="the uprobe syscall is x86-64 Linux's")
@pytest.mark.parametrize(("answer", "gen"), ANSWERS)
def test_kcheck_and_form_auto_read_the_answer_alike(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path, answer: int,
                                                    gen: Generation | None) -> None:
    """The syscall really runs (336 from outside a trampoline fails on every kernel); only the
    errno it leaves is replaced. kcheck runs on a kernel without the syscall (the generation
    that optimizes nothing: every site planned on the int3 path) and refuses an answer no
    generation gives."""
    monkeypatch.setattr(ctypes, "get_errno", lambda: answer)
    assert detect_kernel()[0] is gen
    assert perf.has_uprobe_syscall() is (gen is not None)
    pmu = tmp_path / "type"
    pmu.write_text("9\n")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(perf, "UPROBE_TYPE_PATH", str(pmu))
    if answer == errno.EPERM:
        with pytest.raises(UnsupportedError, match="no known kernel generation"):
            kcheck.kernel_support()
    elif gen is None:
        assert kcheck.kernel_support() is NONE_GEN
    else:
        assert kcheck.kernel_support() is gen


# -- no module outside the table names a generation ----------------------------------------

PACKAGE = ROOT / "usdtpatch"
TABLE = PACKAGE / "kernelfacts.py"
# The bytes only a generation's row holds: the nop10 head, the lea of nop10's optimized site
# (usdtpatch's red-zone guard reads it from the table: one encoding), `ret $0x80`.
_ROW_BYTES = ("662e0f1f84", "488d642480", "c28000")
_ERRNO_NAMES = {"ENXIO", "EPROTO", "ENOSYS"}
_OLD_NAMES = re.compile(r"^(K618|NOP10_SERIES|PROTOCOL_NOP5|PROTOCOL_NOP10|KERNEL_PROTOCOL|"
                        r"rule_618|rule_nop10|kernel_618|nop10_series|TRAMPOLINE_NOP5|"
                        r"TRAMPOLINE_NOP10|NOP10_HEAD|LEA_RSP_MINUS_128)$")
_RELEASES = re.compile(r"^(\d+\.\d+|nop10-series)$")  # "6.18", "7.3"
# machine code compiled from C (forkguard/recipe.py): its own instructions, no kernel's facts
_GENERATED = {PACKAGE / "forkguard" / "_code.py"}


def _byte_runs(tree: ast.AST) -> list[str]:
    """Every run of integer literals in a list, tuple or bytes([...]) call, as hex, and every
    bytes literal and bytes.fromhex argument."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            ints = [e.value for e in node.elts if isinstance(e, ast.Constant)
                    and isinstance(e.value, int) and not isinstance(e.value, bool)]
            if ints and all(0 <= v < 256 for v in ints):
                out.append(bytes(ints).hex())
        elif isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            out.append(node.value.hex())
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "fromhex" and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            out.append(node.args[0].value.replace(" ", "").lower())
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def generation_names(source: str) -> list[str]:
    """What `source` (a module's text) names of a generation: errno names, a row's bytes, a
    release or an old generation name as a value, the old vocabularies' identifiers."""
    tree = ast.parse(source)
    found = []
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and (node.id in _ERRNO_NAMES or _OLD_NAMES.match(node.id)):
            found.append(node.id)
        elif isinstance(node, ast.Attribute) and (node.attr in _ERRNO_NAMES
                                                  or _OLD_NAMES.match(node.attr)):
            found.append(node.attr)
        elif isinstance(node, ast.alias) and (node.name in _ERRNO_NAMES
                                              or _OLD_NAMES.match(node.name)):
            found.append(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docs and _RELEASES.match(node.value):
            found.append(repr(node.value))
    found += [run for run in _byte_runs(tree) if any(b in run for b in _ROW_BYTES)]
    return found


def test_no_module_outside_the_table_names_a_generation() -> None:
    bad = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == TABLE or path in _GENERATED:
            continue
        got = generation_names(path.read_text())
        if got:
            bad[str(path.relative_to(ROOT))] = got
    assert not bad, bad


@pytest.mark.parametrize("source", [
    "import errno\nX = errno.EPROTO\n",
    "from errno import ENXIO\n",
    "NOP10_HEAD = bytes([0x66, 0x2E, 0x0F, 0x1F, 0x84])\n",
    "LEA = bytes.fromhex('48 8d 64 24 80')\n",
    "RET = b'\\xc2\\x80\\x00'\n",
    "if kernel == '6.18':\n    pass\n",
    "CHOICES = ['nop10-series']\n",
    "from usdtpatch.sequences.sequences import PROTOCOL_NOP5\n",
    "v = cand.kernel_618\n",
])
def test_the_scan_finds_each_way_of_naming_one(source: str) -> None:
    assert generation_names(source)


def test_the_scan_leaves_forms_and_words_alone() -> None:
    assert not generation_names('"""On 6.18 the kernel ... ENXIO."""\nFORM = "nop5"\n'
                                "NOP5 = bytes([0x0F, 0x1F, 0x44, 0x00, 0x00])\n")
