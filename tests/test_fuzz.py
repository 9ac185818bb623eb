"""The mutation corpus (tools/fuzz.py): a seeded, bounded run over every command finds no
problem, and the corpus's own checks catch each kind of problem they exist for.

`make fuzz` runs the same corpus at length (docs/reliability.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from tests.helpers import ROOT
from tools import fuzz

SEED = 20261130
COUNT = 250  # about 15-20 s here (`make fuzz` runs 2,000)


@pytest.fixture(scope="module")
def bases() -> list[fuzz.Base]:
    return fuzz.load_bases()


@pytest.mark.slow
def test_corpus_finds_no_problem() -> None:
    done = subprocess.run([sys.executable, "-m", "tools.fuzz", "--seed", str(SEED), "--count",
                           str(COUNT), "--json"], capture_output=True, text=True, cwd=ROOT,
                          timeout=900, check=False)
    assert done.stdout, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["mutants"] == COUNT
    for command in fuzz.COMMANDS:  # every command ran on every mutant
        assert sum(doc["runs"][command].values()) == COUNT, command
    # not vacuous: many mutants are still usable and many rewrites were checked end to end
    assert doc["runs"]["rewrite"].get("0", 0) >= COUNT // 4
    assert doc["rewrite_outputs_checked"] >= COUNT // 4
    assert doc["restore_outputs_checked"] >= 10
    assert done.returncode == (1 if doc["problems"] else 0)
    assert not doc["problems"], fuzz.render(doc)


def test_mutants_are_reproducible_and_damaged(bases: list[fuzz.Base]) -> None:
    seen = set()
    for i in range(60):
        m = fuzz.make_mutant(bases, SEED, i)
        again = fuzz.make_mutant(bases, SEED, i)
        assert (m.data, m.how, m.base.name) == (again.data, again.how, again.base.name)
        assert m.data != m.base.data, m.how
        seen.add(m.how.split()[0])
    assert {"flip", "truncate"} <= seen
    assert fuzz.make_mutant(bases, SEED + 1, 0).data != fuzz.make_mutant(bases, SEED, 0).data


def test_every_kind_of_mutation_is_made(bases: list[fuzz.Base]) -> None:
    hows = " ".join(fuzz.make_mutant(bases, SEED, i).how for i in range(600))
    for word in ("flip .note.stapsdt", "flip .eh_frame", "flip phdrs", "flip shdrs",
                 "flip ehdr", "flip site", "flip .note.usdtpatch", "truncate", "p_memsz=",
                 "sh_size=", "e_shnum=", "'s pc", "invalid UTF-8", "renamed .note.stapsdt",
                 "note header field", "moved by", "flip .text", "flip .rela.dyn",
                 "5,000-digit argument", "nested 100,000 deep"):
        assert word in hows, word


def test_hostile_shapes_hold_what_they_say(bases: list[fuzz.Base]) -> None:
    """The repointed sections are read: a note argument of 5,000 digits, a deep marker."""
    from usdtpatch.elf.image import parse_elf
    from usdtpatch.elf.notes import parse_notes

    seen = set()
    for i in range(600):
        m = fuzz.make_mutant(bases, SEED, i)
        single_number = m.how.startswith("note ") and "5,000-digit" in m.how and \
            ";" not in m.how
        if m.how == "marker nested 100,000 deep" or single_number:
            image = parse_elf(m.data)
            if "marker" in m.how:
                sec = image.section(".note.usdtpatch")
                assert sec is not None and b"[" * 100_000 in image.section_data(sec)
                seen.add("marker")
            else:
                sec = image.section(".note.stapsdt")
                assert sec is not None
                notes = parse_notes(image.section_data(sec), 8, image.byteorder).sdt_notes
                assert any(fuzz.LONG_NUMBER in n.args or "f" * 5000 in n.args for n in notes)
                seen.add("number")
    assert seen == {"marker", "number"}


FakeMain = Callable[[list[str], IO[str], IO[str]], int]


def _problems(bases: list[fuzz.Base], main: FakeMain, tmp: Path, command: str = "list",
              timeout: float = 30.0) -> list[str]:
    pie = next(b for b in bases if b.name == "pie")
    tally = fuzz.Tally()
    fuzz.check_mutant(fuzz.Mutant(0, pie, pie.data, "none"), tally, tmp, main=main,
                      timeout=timeout, commands=[command])
    return [p.kind for p in tally.problems]


def _input(argv: list[str]) -> Path:
    return Path(next(a for a in argv if a.endswith("pie")))


def test_checks_catch_an_internal_error(bases: list[fuzz.Base], tmp_path: Path) -> None:
    def main(argv: list[str], out: IO[str], err: IO[str]) -> int:
        print("usdtpatch: internal error: KeyError: 0", file=err)
        return 3

    assert _problems(bases, main, tmp_path) == ["internal error"]


def test_checks_catch_an_escaped_exception(bases: list[fuzz.Base], tmp_path: Path) -> None:
    def main(argv: list[str], out: IO[str], err: IO[str]) -> int:
        raise MemoryError

    assert _problems(bases, main, tmp_path) == ["internal error"]


def test_checks_catch_a_hang(bases: list[fuzz.Base], tmp_path: Path) -> None:
    def main(argv: list[str], out: IO[str], err: IO[str]) -> int:
        time.sleep(5)
        return 0

    started = time.monotonic()
    assert _problems(bases, main, tmp_path, timeout=0.3) == ["internal error"]
    assert time.monotonic() - started < 3


def test_checks_catch_a_memory_hog(bases: list[fuzz.Base], tmp_path: Path) -> None:
    held: list[bytes] = []

    def main(argv: list[str], out: IO[str], err: IO[str]) -> int:
        held.append(b"\x01" * (96 << 20))  # touched: resident
        return 0

    pie = next(b for b in bases if b.name == "pie")
    tally = fuzz.Tally()
    fuzz.check_mutant(fuzz.Mutant(0, pie, pie.data, "none"), tally, tmp_path, main=main,
                      commands=["list"], memory_limit=32 << 20)
    held.clear()
    assert [p.kind for p in tally.problems] == ["memory"]


def test_checks_catch_an_unclear_refusal(bases: list[fuzz.Base], tmp_path: Path) -> None:
    def main(argv: list[str], out: IO[str], err: IO[str]) -> int:
        print("usdtpatch: bad\nmore", file=err)
        return 2

    assert _problems(bases, main, tmp_path) == ["unclear refusal"]

    def nameless(argv: list[str], out: IO[str], err: IO[str]) -> int:
        print("usdtpatch: truncated", file=err)
        return 2

    assert _problems(bases, nameless, tmp_path / "2") == ["refusal without the file name"]


def test_checks_catch_a_changed_input_and_a_leftover(bases: list[fuzz.Base],
                                                     tmp_path: Path) -> None:
    def main(argv: list[str], out: IO[str], err: IO[str]) -> int:
        path = _input(argv)
        path.write_bytes(path.read_bytes()[:-1])
        (path.parent / ".pie.x1.tmp").write_bytes(b"")
        return 0

    assert _problems(bases, main, tmp_path) == ["input changed", "file left behind"]


def test_checks_catch_a_damaged_unrestorable_output(bases: list[fuzz.Base],
                                                    tmp_path: Path) -> None:
    def main(argv: list[str], out: IO[str], err: IO[str]) -> int:
        if argv[0] == "restore":
            print(f"usdtpatch: {argv[1]}: no marker", file=err)
            return 2
        target = Path(argv[argv.index("-o") + 1])
        target.write_bytes(_input(argv).read_bytes()[:-200])  # truncated: headers cut
        return 0

    kinds = _problems(bases, main, tmp_path, command="rewrite")
    assert kinds.count("damaged output") >= 1 and "not restored" in kinds, kinds


def test_checks_catch_an_output_after_a_refusal(bases: list[fuzz.Base], tmp_path: Path) -> None:
    def main(argv: list[str], out: IO[str], err: IO[str]) -> int:
        Path(argv[argv.index("-o") + 1]).write_bytes(b"partial")
        print(f"usdtpatch: {_input(argv)}: refused", file=err)
        return 2

    assert _problems(bases, main, tmp_path, command="rewrite") == ["output after a refusal"]


def test_checks_pass_the_real_commands(bases: list[fuzz.Base], tmp_path: Path) -> None:
    pie = next(b for b in bases if b.name == "pie.rewritten")
    tally = fuzz.Tally()
    fuzz.check_mutant(fuzz.Mutant(0, pie, pie.data, "none"), tally, tmp_path)
    assert tally.problems == []
    assert tally.restored == 1  # restore gave pie back
    plain = next(b for b in bases if b.name == "pie")
    fuzz.check_mutant(fuzz.Mutant(1, plain, plain.data, "none"), tally, tmp_path / "2")
    assert tally.problems == [] and tally.written == 2  # both rewrites, checked and restored


# Mutants that showed a problem while the corpus was run, kept as files (made by
# `python -m tools.fuzz --seed S --only I --keep DIR`, renamed WHAT.BASE); each must now pass
# every check. (file, probe for `show`, what it showed)
KEPT = ROOT / "tests" / "data" / "fuzz"
def _kept(name: str, probe: str, what: str, *marks: pytest.MarkDecorator) -> Any:
    return pytest.param(name, probe, what, marks=marks, id=name)


REPRODUCERS = [
    _kept("control-char-in-name.adjacent", "adjacent:first",
          "seed 7 #1320: `show` printed a \\x0b of a probe name raw: a refusal of two lines"),
    _kept("symtab-info-overflow.sema-dtrace", "sdtd:work",
          "seed 13 #1305: .symtab sh_info 2^32-1 overflowed the new sh_info (exit 3)"),
    _kept("memsz-4gib.stripped", "basic:compute",
          "seed 7 #1744: a 4 GiB p_memsz made `verify` use 8 GB and 16 s"),
    _kept("rela-past-end.nopie", "basic:entry",
          "seed 7 #331: .rela.dyn past the input's end covered the appended data"),
    _kept("dynsym-past-end.pie", "basic:entry",
          "seed 7 #789: .dynsym past the input's end covered the appended data"),
    _kept("note-past-end.stripped", "basic:compute",
          "seed 7 #1178: .note.ABI-tag past the input's end covered the appended data"),
    _kept("phdr-vaddr-top.riprel-after", "riprel:load",
          "seed 4242 #32: a p_vaddr of 2^64-1 put a moved header past 64 bits (exit 3)"),
    _kept("filesz-no-memsz.odd-note", "odd:good2",
          "seed 99 #2427: a PT_LOAD with file bytes and p_memsz 0 was not loaded in the "
          "emulator, which then wrote a window there (exit 3)"),
]


@pytest.mark.parametrize(("name", "probe", "what"), REPRODUCERS)
def test_kept_mutant_passes(name: str, probe: str, what: str, tmp_path: Path) -> None:
    data = (KEPT / name).read_bytes()
    base = fuzz.Base(name.split(".", 1)[1], data, None, probe, {}, [], [], [], None, 0, [])
    tally = fuzz.Tally()
    fuzz.check_mutant(fuzz.Mutant(0, base, data, what), tally, tmp_path)
    assert not tally.problems, [(p.kind, p.command, p.detail) for p in tally.problems]


def test_every_kept_mutant_is_listed() -> None:
    assert sorted(p.name for p in KEPT.iterdir()) == sorted(r.values[0] for r in REPRODUCERS)
