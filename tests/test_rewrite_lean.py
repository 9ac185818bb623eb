"""A rewrite adds little to a file: `.eh_frame` is not copied (a new `.eh_frame_hdr` indexes the
original FDEs and the detours'), `.symtab`/`.strtab` grow in place where they can (nothing of
them copied), and every reader still reads everything: LIEF, perf (SDT probe, symbol
resolution of the detours, build-id), the dynamic loader (symbol lookup through a moved
`.gnu.hash`); gdb and a C++ throw through a rewritten frame: tests/test_rewrite_unwind.py.
OpenJDK 17's libjvm.so grows by at most 5% plus the detours, and restores byte for byte.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import fixture, run_cli
from usdtpatch.elf.image import ElfImage, parse_elf
from usdtpatch.elf.symbols import SYM64_SIZE

LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")
FIXTURES = ["pie", "nopie", "static", "cxx-throw", "args-clang", "libprobes.so"]


def _rewrite(src: Path, out: Path, *opts: str) -> dict[str, Any]:
    res = run_cli("rewrite", src, "-o", out, "--json", *opts)
    assert res.rc == 0, res.err
    doc: dict[str, Any] = json.loads(res.out)["files"][0]
    assert doc["changed"]
    return doc


def _symbols(image: ElfImage) -> list[tuple[bytes, int, int, int]]:
    """(name, value, size, info) of every .symtab entry."""
    sym = image.section(".symtab")
    assert sym is not None
    strs = image.section_data(image.sections[sym.link])
    out = []
    for name, info, _other, _shndx, value, size in struct.iter_unpack(
            "<IBBHQQ", image.section_data(sym)):
        out.append((strs[name : strs.index(b"\0", name)], value, size, info))
    assert len(out) * SYM64_SIZE == sym.size
    return out


def _hdr_count(image: ElfImage) -> int:
    sec = image.section(".eh_frame_hdr")
    assert sec is not None
    return int(struct.unpack_from("<I", image.section_data(sec), 8)[0])


@pytest.mark.parametrize("name", FIXTURES)
def test_nothing_is_copied_and_nothing_is_lost(name: str, tmp_path: Path) -> None:
    src, out = fixture(name), tmp_path / name
    doc = _rewrite(src, out)
    before, after = parse_elf(src.read_bytes()), parse_elf(out.read_bytes())
    detours = sum(1 for s in doc["sites"] if s["action"] == "detour")
    # .eh_frame: the same section, in place; the new table = the old one + one per detour
    old_eh, new_eh = before.section(".eh_frame"), after.section(".eh_frame")
    assert old_eh is not None and new_eh is not None
    assert (new_eh.addr, new_eh.offset, new_eh.size) == (old_eh.addr, old_eh.offset,
                                                         old_eh.size)
    if before.section(".eh_frame_hdr") is not None:
        assert _hdr_count(after) == _hdr_count(before) + detours
        assert after.section(".eh_frame_hdr.orig") is not None
    # .symtab: every original symbol kept, plus one function symbol per detour
    old_syms, new_syms = _symbols(before), _symbols(after)
    added = collections.Counter(new_syms) - collections.Counter(old_syms)
    assert collections.Counter(old_syms) - collections.Counter(new_syms) == collections.Counter()
    names = [n for n, *_ in added.elements()]
    assert sum(1 for n in names if b".usdtpatch." in n or n.startswith(b"__usdtpatch_detour_")
               ) == detours
    sym = after.section(".symtab")
    assert sym is not None and all(info >> 4 == 0 for *_, info in new_syms[: sym.info])
    # restore gives the input back byte for byte
    back = tmp_path / "back"
    assert run_cli("restore", out, "-o", back).rc == 0
    assert back.read_bytes() == src.read_bytes()


@pytest.mark.parametrize("name", ["pie", "static"])  # static: .rela.plt links .symtab
def test_symtab_grows_in_place(tmp_path: Path, name: str) -> None:
    src, out = fixture(name), tmp_path / name
    _rewrite(src, out)
    before, after = parse_elf(src.read_bytes()), parse_elf(out.read_bytes())
    old, new = before.section(".symtab"), after.section(".symtab")
    assert old is not None and new is not None
    grown = new.size - old.size
    # where the layout moved part of the input's non-loaded end past the new segment (the
    # writer's cut), the sections from the cut on moved by one shift, the others by none:
    # the table's end tells its own (entries are added before entry 1)
    shift = new.offset + new.size - (old.offset + old.size)
    assert grown > 0 and shift >= 0 and new.offset == old.offset + shift - grown
    data, orig = out.read_bytes(), src.read_bytes()
    assert data[old.offset + shift + SYM64_SIZE : old.offset + shift + old.size] == \
        orig[old.offset + SYM64_SIZE : old.offset + old.size]  # none moved
    ostr, nstr = before.sections[old.link], after.sections[new.link]
    assert nstr.offset >= ostr.offset + shift and nstr.size > ostr.size  # names appended
    assert data[nstr.offset : nstr.offset + ostr.size] == \
        orig[ostr.offset : ostr.offset + ostr.size]


@pytest.mark.parametrize("name", FIXTURES)
def test_lief_reads_the_rewritten_file(name: str, tmp_path: Path) -> None:
    lief = pytest.importorskip("lief")
    out = tmp_path / name
    doc = _rewrite(fixture(name), out)
    binary = lief.ELF.parse(str(out))
    assert binary is not None
    names = {s.name for s in binary.symtab_symbols}
    assert sum(1 for n in names if ".usdtpatch." in n or n.startswith("__usdtpatch_detour_")
               ) == sum(1 for s in doc["sites"] if s["action"] == "detour")
    assert len(binary.segments) == len(parse_elf(fixture(name).read_bytes()).segments) + 1
    assert any(sec.name == ".usdtpatch.text" for sec in binary.sections)


@pytest.mark.live
@pytest.mark.skipif(shutil.which("perf") is None, reason="needs perf (linux-perf)")
def test_perf_probes_a_moved_probe_and_names_its_detour(tmp_path: Path) -> None:
    """perf's SDT support (buildid-cache, probe sdt_*), perf record and perf report's symbol
    resolution: every sample of the moved probe lands in its detour's symbol."""
    out = tmp_path / "pie"
    doc = _rewrite(fixture("pie"), out)
    assert any(s["name"] == "loop" and s["action"] == "detour" for s in doc["sites"])
    env = dict(os.environ, HOME=str(tmp_path))  # perf's build-id cache: $HOME/.debug

    def perf(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["perf", *argv], capture_output=True, text=True, env=env,
                              timeout=120, check=False, cwd=tmp_path)

    assert perf("buildid-cache", "--add", str(out)).returncode == 0
    added = perf("probe", "-x", str(out), "sdt_basic:loop")
    try:
        assert added.returncode == 0, added.stderr
        data = tmp_path / "perf.data"
        rec = perf("record", "-q", "-o", str(data), "-e", "sdt_basic:loop", str(out))
        assert rec.returncode == 0, rec.stderr
        assert "basic: sum=" in rec.stdout
        rep = perf("report", "-i", str(data), "--stdio", "--sort", "sym")
        lines = [ln for ln in rep.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
        assert lines and all(re.search(r"\S+\.usdtpatch\.\d+\s*$", ln) for ln in lines), \
            rep.stdout
        ids = perf("buildid-list", "-i", str(data))
        assert str(out) in ids.stdout
    finally:
        perf("probe", "-d", "sdt_basic:*")


@pytest.mark.slow
@pytest.mark.skipif(not LIBJVM.exists(), reason="needs OpenJDK 17's libjvm.so")
def test_libjvm_grows_by_at_most_five_percent_plus_the_detours(tmp_path: Path) -> None:
    out = tmp_path / "libjvm.so"
    _rewrite(LIBJVM, out, "--no-verify")
    size, grown = LIBJVM.stat().st_size, out.stat().st_size
    text = parse_elf(out.read_bytes()).section(".usdtpatch.text")
    assert text is not None
    assert grown - size <= 0.05 * size + text.size, (size, grown, text.size)
    back = tmp_path / "back.so"
    assert run_cli("restore", out, "-o", back).rc == 0
    assert back.read_bytes() == LIBJVM.read_bytes()
    # the dynamic loader finds symbols through the moved .gnu.hash
    code = f"import ctypes; print(bool(ctypes.CDLL({str(out)!r}).JNI_CreateJavaVM))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.strip() == "True", done.stderr
    lief = pytest.importorskip("lief")
    assert lief.ELF.parse(str(out)) is not None


@pytest.mark.parametrize("info", [0, 0xFFFFFFFF])
def test_a_symtab_whose_sh_info_is_no_index_is_refused(info: int, tmp_path: Path) -> None:
    """Adding symbols needs the index of the first non-local one: a corrupt sh_info is one
    line naming the file and exit 2 (it was an internal error), nothing written."""
    data = bytearray(fixture("pie").read_bytes())
    sym = parse_elf(bytes(data)).section(".symtab")
    assert sym is not None
    shoff = int.from_bytes(data[0x28:0x30], "little")
    struct.pack_into("<I", data, shoff + 64 * sym.index + 44, info)
    src, out = tmp_path / "bad", tmp_path / "bad.rw"
    src.write_bytes(bytes(data))
    res = run_cli("rewrite", "--no-verify", src, "-o", out)
    assert res.rc == 2, res.err
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and str(src) in lines[0] and "sh_info" in lines[0], res.err
    assert not out.exists()
