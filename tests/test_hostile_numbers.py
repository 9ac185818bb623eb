"""Hostile numbers and nesting (issue 20, items 8, 9 and 12): one line and exit 2, or a
finding; never exit 3."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch import api
from usdtpatch.cli.common import EXIT_INTERNAL, EXIT_UNUSABLE
from usdtpatch.errors import UsdtpatchError

HUGE = "9" * 5000  # int() refuses decimals of more than 4,300 digits

_PROGRAM = r"""
int main(void) {
    __asm__ __volatile__(
        "990: nop\n"
        ".pushsection .note.stapsdt,\"?\",\"note\"\n"
        ".balign 4\n"
        ".4byte 992f-991f, 994f-993f, 3\n"
        "991: .asciz \"stapsdt\"\n"
        "992: .balign 4\n"
        "993: .8byte 990b\n"
        ".8byte _.stapsdt.base\n"
        ".8byte 0\n"
        ".asciz \"app\"\n"
        ".asciz \"big\"\n"
        ".asciz \"ARGS\"\n"
        "994: .balign 4\n"
        ".popsection\n"
        ".ifndef _.stapsdt.base\n"
        ".pushsection .stapsdt.base,\"aG\",\"progbits\",.stapsdt.base,comdat\n"
        ".weak _.stapsdt.base\n"
        ".hidden _.stapsdt.base\n"
        "_.stapsdt.base: .space 1\n"
        ".size _.stapsdt.base, 1\n"
        ".popsection\n"
        ".endif\n");
    return 0;
}
"""

ARGS = {
    "size": f"{HUGE}@%rax",
    "immediate": f"-4@${HUGE}",
    "displacement": f"-4@{HUGE}(%rbp)",
    "hex": f"8@$0x{'f' * 5000}",
}


@pytest.fixture(scope="module")
def huge_args(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("huge")
    out: dict[str, Path] = {}
    for name, args in ARGS.items():
        src = d / f"{name}.c"
        src.write_text(_PROGRAM.replace("ARGS", args))
        subprocess.run(["gcc", "-O0", "-o", str(d / name), str(src)], check=True)
        out[name] = d / name
    return out


def _commands(p: Path, tmp: Path) -> list[list[str | Path]]:
    return [["list", p], ["check", p], ["show", p, "--probe", "app:big"],
            ["rewrite", "--no-verify", p, "-o", tmp / "o1"], ["rewrite", p, "-o", tmp / "o2"],
            ["plan", p], ["verify", p]]


@pytest.mark.parametrize("shape", list(ARGS))
def test_a_5000_digit_number_in_a_note_argument(huge_args: dict[str, Path], tmp_path: Path,
                                                shape: str) -> None:
    """Item 8: before, ValueError "Exceeds the limit (4300 digits)" in every command."""
    for argv in _commands(huge_args[shape], tmp_path):
        res = run_cli(*argv)
        assert res.rc != EXIT_INTERNAL and "internal error" not in res.err, (argv, res.err)
        if res.rc == EXIT_UNUSABLE:
            assert len(res.err.strip().splitlines()) == 1, (argv, res.err)
    res = run_cli("check", "--json", huge_args[shape])
    assert "characters (at most" in res.out or "digits is not" in res.out, res.out[:400]


def _with_marker(tmp_path: Path, desc: bytes) -> Path:
    note = struct.pack("<III", 10, len(desc) + (-len(desc)) % 4, 1) + b"usdtpatch\0\0\0" \
        + desc + b"\0" * ((-len(desc)) % 4)
    (tmp_path / "marker").write_bytes(note)
    out = tmp_path / "marked"
    subprocess.run(["objcopy", "--add-section", f".note.usdtpatch={tmp_path / 'marker'}",
                    str(fixture("demo")), str(out)], check=True)
    return out


DEEP = b"[" * 100_000 + b"]" * 100_000


def test_a_marker_nested_100000_deep(tmp_path: Path) -> None:
    """Item 9: before, RecursionError (exit 3) from check, rewrite, restore and verify."""
    marked = _with_marker(tmp_path, b'{"a":' + DEEP + b"}")
    for argv in (["check", marked], ["rewrite", marked, "-o", tmp_path / "o"],
                 ["restore", marked, "-o", tmp_path / "r"], ["verify", marked],
                 ["list", marked]):
        res = run_cli(*argv)
        assert res.rc != EXIT_INTERNAL and "internal error" not in res.err, (argv, res.err)
        if res.rc == EXIT_UNUSABLE:
            lines = res.err.strip().splitlines()
            assert len(lines) == 1 and "marked" in lines[0], (argv, res.err)
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("doc", [DEEP, b'{"sites": ' + DEEP + b"}", b'{"load_base": ' +
                                 HUGE.encode() + b"}"])
def test_a_plan_nested_100000_deep_or_with_a_huge_number(tmp_path: Path, doc: bytes) -> None:
    """Item 9: verify --plan and api.read_plan raised RecursionError; a 5,000-digit number
    raised ValueError."""
    plan = tmp_path / "plan.json"
    plan.write_bytes(doc)
    res = run_cli("verify", fixture("demo"), "--plan", plan)
    assert res.rc == EXIT_UNUSABLE, res.err
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and "plan.json" in lines[0], res.err
    with pytest.raises(UsdtpatchError, match=r"plan\.json"):
        api.read_plan(plan)


def test_json_nesting_is_bounded_below_what_json_refuses() -> None:
    from usdtpatch import jsondoc

    assert jsondoc.loads(b'{"a": [[1, "[[[["], {"b": "]]"}]}') == \
        {"a": [[1, "[[[["], {"b": "]]"}]}
    assert jsondoc.nesting(b'["\\"[[[", [[]]]') == 3
    deep = b"[" * 65 + b"]" * 65
    with pytest.raises(ValueError, match="nested 65 deep"):
        jsondoc.loads(deep)
    assert jsondoc.loads(b"[" * 64 + b"]" * 64) is not None
