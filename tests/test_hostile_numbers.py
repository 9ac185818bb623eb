"""Hostile numbers and nesting (issue 20, items 8, 9 and 12): one line and exit 2, or a
finding; never exit 3."""

from __future__ import annotations

import filecmp
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import PEAK_RSS_KIB, ROOT, fixture, run_cli
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
    commands: list[list[str | Path]] = [
        ["check", marked], ["rewrite", marked, "-o", tmp_path / "o"],
        ["restore", marked, "-o", tmp_path / "r"], ["verify", marked], ["list", marked]]
    for argv in commands:
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


# ------------------------------------------------------------------- API arguments (12)

API: Any = api  # called with wrong types on purpose


@pytest.mark.parametrize(("call", "error", "name"), [
    (lambda p: API.plan(p, trampoline=-4096), ValueError, "trampoline"),
    (lambda p: API.plan(p, trampoline=2**64), ValueError, "trampoline"),
    (lambda p: API.plan(p, trampoline=0x555555500001), ValueError, "trampoline"),
    (lambda p: API.verify(p, trampoline=2**64), ValueError, "trampoline"),
    (lambda p: API.plan(p, load_base="0x1000"), TypeError, "load_base"),
    (lambda p: API.plan(p, load_base=-4096), ValueError, "load_base"),
    (lambda p: API.verify(p, load_base=2.0), TypeError, "load_base"),
    (lambda p: API.rewrite(p, jobs=0), ValueError, "jobs"),
    (lambda p: API.rewrite(p, jobs=-3), ValueError, "jobs"),
    (lambda p: API.rewrite(p, jobs="2"), TypeError, "jobs"),
    (lambda p: API.rewrite(p, jobs=True), TypeError, "jobs"),
    (lambda p: API.rewrite(p, verify="no"), TypeError, "verify"),
    (lambda p: API.rewrite_plan(p, verify=1), TypeError, "verify"),
    (lambda p: API.rewrite_plan(p, jobs=0), ValueError, "jobs"),
    (lambda p: API.restore(p, in_place="yes"), TypeError, "in_place"),
])
def test_api_arguments_are_checked_at_the_boundary(call: object, error: type[Exception],
                                                   name: str) -> None:
    """Item 12: before, trampoline=-4096 or 2**64, jobs=0/-3 and verify='no' (as yes) were
    taken; load_base='0x1000' and jobs='2' raised TypeError from deep inside."""
    assert callable(call)
    with pytest.raises(error, match=f"^{name}="):
        call(fixture("nop5"))


@pytest.mark.parametrize("value", ["-0x1000", str(2**64), "0x555555500001", "0"])
def test_cli_trampoline_is_a_user_space_page(value: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    res = run_cli("plan", fixture("nop5"), "--trampoline", value)
    said = capsys.readouterr().err  # argparse's message
    assert res.rc == EXIT_UNUSABLE and "--trampoline" in said, said
    assert run_cli("plan", fixture("nop5"), "--trampoline", "0x555555500000").rc == 0


# ------------------------------------------------------------ a 12 GB sparse input (10)

_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from usdtpatch.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_12_gb_sparse_input_under_a_3_gb_address_space_limit(tmp_path: Path) -> None:
    """Item 10: a small ELF followed by a 12 GB hole was read (or mapped) whole: MemoryError,
    exit 3 (list: one line, cannot map). Commands that only read it read what its headers
    name; a rewrite, whose output is the whole file, refuses it in one line."""
    big = tmp_path / "big"
    shutil.copy(fixture("nop5"), big)
    os.truncate(big, 12 << 30)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for argv, rc in ((["list", big], 0), (["check", big], 0), (["plan", big], 0),
                     (["verify", big], 0), (["rewrite", big, "-o", tmp_path / "out"], 2),
                     (["restore", big, "-o", tmp_path / "out"], 2)):
        done = subprocess.run([sys.executable, "-c", _LIMITED, *map(str, argv)],
                              capture_output=True, text=True, timeout=300, env=env,
                              check=False)
        assert done.returncode == rc, (argv, done.stderr)
        if rc == 2:
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and "past the end of everything" in lines[0], done.stderr
    assert sorted(os.listdir(tmp_path)) == ["big"]


def test_named_extent_covers_every_fixture_and_only_the_head_of_others(tmp_path: Path
                                                                       ) -> None:
    from usdtpatch.elf.image import named_extent

    for name in ("demo", "pie", "nopie", "i386", "bigendian", "libprobes.so"):
        data = fixture(name).read_bytes()

        def pread(offset: int, n: int, data: bytes = data) -> bytes:
            return data[offset:offset + n]

        assert named_extent(pread, len(data)) == len(data), name
    junk = b"not an ELF file" * 100
    assert named_extent(lambda o, n: junk[o:o + n], len(junk)) == 64


# ------------------------------------------------------ a 10-million-entry .symtab (11)

def _huge_symtab(src: Path, dst: Path, entries: int) -> None:
    """`src` with its `.symtab` moved past the section header table and grown to `entries`
    entries (the old ones first, then zeros: sparse), so that it cannot grow in place."""
    from usdtpatch.elf.image import parse_elf

    data = bytearray(src.read_bytes())
    image = parse_elf(bytes(data))
    sym = image.section(".symtab")
    assert sym is not None
    at = (len(data) + 4095) & ~4095
    struct.pack_into("<QQ", data, image.shoff + sym.index * 64 + 24, at, entries * 24)
    with open(dst, "wb") as f:
        f.write(data)
        f.seek(at)
        f.write(image.section_data(sym))
        f.truncate(at + entries * 24)


@pytest.mark.slow
def test_a_10_million_entry_symtab_is_not_copied(tmp_path: Path) -> None:
    """Item 11 (and issue 22's size rule): the table could not grow in place, so it was
    copied to the end while the old one stayed: a 240 MB input became 480 MB with a 2.4 GB
    peak. Now the detours go without symbols (a finding) and the file grows by its detours."""
    big = tmp_path / "big"
    _huge_symtab(fixture("demo"), big, 10_000_000)
    code = ("import json, sys\nfrom usdtpatch.cli import main\n"
            "rc = main(sys.argv[1:])\n"
            f"print({PEAK_RSS_KIB}, file=sys.stderr)\n"
            "sys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code, "rewrite", "--no-verify", "--json",
                           str(big), "-o", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          check=False)
    assert done.returncode == 0, done.stderr
    size = big.stat().st_size
    grown = (tmp_path / "out").stat().st_size - size
    assert 0 < grown < size // 100, grown
    assert "detour-symbols-left-out" in done.stdout
    peak = int(done.stderr.strip().splitlines()[-1]) * 1024
    # the file, its output, the symbol columns, and the one copy of the input's non-loaded end
    # that the layout perf reads after strip makes (the end moves past the new segment:
    # elf/writer.py plan_segment's cut; the marker's replay joins it back once)
    assert peak < 4.5 * size, peak
    assert run_cli("restore", tmp_path / "out", "-o", tmp_path / "back").rc == 0
    assert filecmp.cmp(big, tmp_path / "back", shallow=False)


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_cli_jobs_is_at_least_one(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    res = run_cli("rewrite", "--dry-run", "-j", value, fixture("demo"), fixture("pie"))
    said = capsys.readouterr().err
    assert res.rc == EXIT_UNUSABLE and "-j" in said, said
