"""Place-relative words are ways in (issue 46, class 1), on tests/data/placerel.c: userspace
static keys as `asm goto` builds them (`__jump_table` entries `.long site - ., target - .`,
which main enables at start by writing a `jmp` over each site) and a kernel-style
`__ex_table` of fault fixups (`.long insn - ., fixup - .`, which a SIGSEGV handler looks the
faulting pc up in).

Before, no relocation and no absolute word held these addresses, so they were no way in:
skey_after's site, skey_target's jump target and fault's faulting load were each moved into
a detour, and every rewritten program died (SIGSEGV: the key's `jmp` written over the new
jump, the enabled key jumping into the int3 filler, the fault not found in the table). Now a
32-bit word W at any byte A of an allocated non-code section names A + W: a way in where that
lies strictly inside a window (also A + W + k, |k| <= 8, where an instruction starts), and an
instruction that must not move wherever a window would hold it (window-place-named, which
names the word and its section). Check predicts rewrite; the rewritten programs run as the
originals. Also the scans' last word: a word in a section's last 4 bytes was never read
(skey_target's target is the last word of `__jump_table`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from tests.helpers import ROOT, build_variant
from tests.test_analysis_waysin import _site, rewritten_runs_alike
from tests.test_check_equals_rewrite import _mismatches
from usdtpatch.analysis.check import check
from usdtpatch.api import load

SOURCE = ROOT / "tests" / "data" / "placerel.c"
BUILDS = {"gcc-O2-pie": ("gcc", ["-O2", "-fPIE", "-pie"]),
          "gcc-O0-pie": ("gcc", ["-O0", "-fPIE", "-pie"]),
          "clang-O0-nopie": ("clang", ["-O0", "-fno-pie", "-no-pie"]),
          "clang-O2-pie": ("clang", ["-O2", "-fPIE", "-pie"]),
          "gcc-O2-static": ("gcc", ["-O2", "-static"])}
# probe -> the section of the word that names the instruction after it
NAMED = {"skey_after": "__jump_table", "skey_target": "__jump_table", "fault": "__ex_table"}

pytestmark = [pytest.mark.needs_cc]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("placerel")


def _program(folder: Path, variant: str) -> Path:
    cc, flags = BUILDS[variant]
    return build_variant(SOURCE, folder / variant, cc, flags)


def _words(path: Path, section: str) -> dict[int, int]:
    """address -> A + W of each 4-byte word of `section`, read by pyelftools."""
    with path.open("rb") as f:
        sec = ELFFile(f).get_section_by_name(section)
        assert sec is not None
        data, addr = sec.data(), sec["sh_addr"]
    return {addr + i: addr + i + int.from_bytes(data[i:i + 4], "little", signed=True)
            for i in range(0, len(data) - 3, 4)}


@pytest.mark.parametrize("variant", BUILDS)
def test_place_relative_words_are_ways_in(built: Path, variant: str, tmp_path: Path) -> None:
    path = _program(built, variant)
    rep = check(load(path))
    for name, section in NAMED.items():
        s = _site(rep, name)
        assert s.blocked == "window-place-named", (name, s.outcome, s.blocked)
        assert s.window is not None
        m = re.search(rf"named by the place-relative word at (0x[0-9a-f]+) in {section}: "
                      r"0x[0-9a-f]+ \+ \(-?0x[0-9a-f]+\) = (0x[0-9a-f]+)", s.window.reason)
        assert m, (name, s.window.reason)
        # the word is real: pyelftools reads it at that address, naming that instruction,
        # the one after the probe
        word, named = int(m.group(1), 16), int(m.group(2), 16)
        assert _words(path, section).get(word) == named
        assert named == s.probe.address + 1
    assert _site(rep, "plain").outcome == "forward"
    assert _mismatches(path) == []
    rewritten_runs_alike(path, tmp_path / "out")


LASTWORD = r"""
#include "custom_note.h"
asm(".text\n.globl lw\n.type lw, @function\n.p2align 4\nlw:\n.cfi_startproc\n"
    "\tmov %rdi, %rax\n990: nop\n.Llw_after: add $1, %rax\n\tret\n.cfi_endproc\n"
    ".size lw, .-lw\n" CN_NOTE("990b", "0", "lastword", "lw", "8@%rax")
    ".pushsection lastword_words, \"a\", @progbits\n.byte 1, 2, 3\n"
    ".long .Llw_after\n.popsection\n" CN_BASE);
long lw(long);
int main(void) { return (int)lw(-1); }
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_sections_last_word_is_read(tmp_path: Path) -> None:
    """An absolute 4-byte word in the last bytes of a section (here unaligned, the section's
    only word) is a way in of a fixed-address program: before, the scan's pattern read a byte
    past its search's end and never matched a section's last word."""
    src = tmp_path / "lastword.c"
    src.write_text(LASTWORD)
    exe = tmp_path / "lastword"
    subprocess.run(["gcc", "-O2", "-fno-pie", "-no-pie", "-g0", "-I",
                    str(ROOT / "fixtures" / "src"), str(src), "-o", str(exe)], check=True)
    s = _site(check(load(exe)), "lw")
    assert s.blocked == "window-branch-target", s.outcome
    assert s.window is not None
    with exe.open("rb") as f:
        sec = ELFFile(f).get_section_by_name("lastword_words")
        assert sec is not None and sec.data_size == 7
        word = sec["sh_addr"] + 3
    assert f"data-word from {word:#x}" in s.window.reason, s.window.reason
