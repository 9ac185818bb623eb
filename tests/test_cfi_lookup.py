"""CFI: FDE lookup through .eh_frame_hdr against binutils readelf, LSDA landing pads, and the
malformed inputs the reader must refuse."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES, fixture
from usdtpatch.analysis.check import check
from usdtpatch.analysis.targets import LANDING_PAD, CodeContext
from usdtpatch.api import load
from usdtpatch.elf.cfi import CfiError, _walk_eh_frame, load_cfi, parse_lsda
from usdtpatch.elf.image import parse_elf
from usdtpatch.elf.symbols import load_symbols

_FDE = re.compile(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=[0-9a-f]+ "
                  r"pc=([0-9a-f]+)\.\.([0-9a-f]+)(.*)$", re.MULTILINE)


def readelf_fdes(path: Path) -> list[tuple[int, int]]:
    exe = shutil.which("readelf")
    if exe is None:
        pytest.skip("readelf not installed")
    text = subprocess.run([exe, "--debug-dump=frames", str(path)], capture_output=True,
                          text=True, check=False).stdout
    return [(int(a, 16), int(b, 16)) for a, b, _ in _FDE.findall(text)]


@pytest.mark.parametrize("path", [
    fixture("cxx-throw"), fixture("stripped"), fixture("static"), fixture("libprobes.so"),
    REAL_BINARIES["libstdc++"],
], ids=["cxx-throw", "stripped", "static", "libprobes", "libstdc++"])
def test_every_readelf_fde_is_found_by_binary_search(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")
    image = parse_elf(path.read_bytes())
    cfi = load_cfi(image)
    # gcc -static links no .eh_frame_hdr: then (and only then) .eh_frame is walked
    assert cfi.source == ("eh_frame_hdr" if image.section(".eh_frame_hdr") else "eh_frame")
    expected = readelf_fdes(path)
    assert len(cfi) == len(expected)
    for start, end in expected:
        if start == end:
            continue
        for addr in (start, end - 1):
            fde = cfi.lookup(addr)
            assert fde is not None, f"{addr:#x}"
            assert (fde.pc_begin, fde.pc_end) == (start, end)
    assert cfi.lookup(min(s for s, _ in expected) - 1) is None


def test_walk_agrees_with_the_header_table() -> None:
    image = parse_elf(fixture("cxx-throw").read_bytes())
    sec = image.section(".eh_frame")
    assert sec is not None
    walked = _walk_eh_frame(image, sec.addr, sec.size)
    table = load_cfi(image)
    assert (walked.starts, walked.fde_addresses) == (table.starts, table.fde_addresses)


def test_landing_pads_of_cxx_throw() -> None:
    ps = load(str(fixture("cxx-throw")))
    image = ps.image
    cfi = load_cfi(image)
    gcc_except = image.section(".gcc_except_table")
    assert gcc_except is not None
    with_lsda = [cfi.fde_at(i) for i in range(len(cfi)) if cfi.fde_at(i).lsda is not None]
    assert with_lsda, "g++ emits an LSDA for the function with try/catch"
    ctx = CodeContext(image, cfi, load_symbols(image))
    pads = 0
    for fde in with_lsda:
        assert fde.lsda is not None
        assert gcc_except.addr <= fde.lsda < gcc_except.addr + gcc_except.size
        lsda = parse_lsda(image, fde.lsda, fde.pc_begin)
        for cs in lsda.call_sites:
            assert fde.pc_begin <= cs.start < cs.end <= fde.pc_end
        bounds = ctx.bounds(fde.pc_begin)
        assert bounds is not None
        fc = ctx.function(bounds)
        for lp in lsda.landing_pads:
            pads += 1
            if fde.contains(lp):
                assert fc.index_of(lp) is not None, f"landing pad {lp:#x} mid-instruction"
                assert fc.targets[lp].kind == LANDING_PAD
    assert pads


def _patched(src: Path, dst: Path, section: str, offset: int, value: bytes) -> None:
    data = bytearray(src.read_bytes())
    sec = parse_elf(bytes(data)).section(section)
    assert sec is not None
    data[sec.offset + offset: sec.offset + offset + len(value)] = value
    dst.write_bytes(bytes(data))


def test_bad_header_version_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "badhdr"
    _patched(fixture("pie"), bad, ".eh_frame_hdr", 0, b"\x02")
    with pytest.raises(CfiError, match="version 2, expected 1"):
        load_cfi(parse_elf(bad.read_bytes()))
    r = check(load(str(bad)))  # check goes on with symbols only, and says so
    assert "cfi-malformed" in {f.code for f in r.findings}
    assert all(s.function is None or s.function.source == "symbol" for s in r.sites)


def test_unsorted_table_is_refused(tmp_path: Path) -> None:
    image = parse_elf(fixture("pie").read_bytes())
    sec = image.section(".eh_frame_hdr")
    assert sec is not None
    cfi = load_cfi(image)
    assert len(cfi) >= 2
    # table starts after the 4-byte header, eh_frame_ptr (sdata4) and fde_count (udata4)
    first = struct.pack("<i", cfi.starts[-1] - sec.addr + 16)
    bad = tmp_path / "unsorted"
    _patched(fixture("pie"), bad, ".eh_frame_hdr", 12, first)
    with pytest.raises(CfiError, match="not sorted"):
        load_cfi(parse_elf(bad.read_bytes()))


def test_truncated_table_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "truncated"
    _patched(fixture("pie"), bad, ".eh_frame_hdr", 8, struct.pack("<I", 0x7FFFFFF))
    with pytest.raises(CfiError, match="table of"):
        load_cfi(parse_elf(bad.read_bytes()))


def test_lookup_parses_only_one_fde(monkeypatch: pytest.MonkeyPatch) -> None:
    """The binary search parses the one FDE it lands on, never the whole .eh_frame."""
    import usdtpatch.elf.cfi as cfi_mod

    calls: list[int] = []
    real = cfi_mod.parse_fde

    def counting(image: object, address: int, cache: object = None) -> object:
        calls.append(address)
        return real(image, address, cache)  # type: ignore[arg-type]

    image = parse_elf(fixture("static").read_bytes())
    cfi = load_cfi(image)
    monkeypatch.setattr(cfi_mod, "parse_fde", counting)
    assert cfi.lookup(image.entry) is not None
    assert len(calls) == 1


def test_a_rewrite_reads_the_index_once(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    """check, plan and build each ask for the file's index: it is read once (it was three
    times), and a second image of the same bytes reads its own."""
    import usdtpatch.elf.cfi as cfi_mod
    from usdtpatch.api import rewrite

    reads: list[int] = []
    real = cfi_mod.read_hdr_table

    def counting(image: object, hdr: int) -> object:
        reads.append(hdr)
        return real(image, hdr)  # type: ignore[arg-type]

    monkeypatch.setattr(cfi_mod, "read_hdr_table", counting)
    out = rewrite(fixture("demo"), tmp_path / "demo", verify=False)
    assert out.changed
    assert len(reads) == 1
    data = fixture("demo").read_bytes()
    first, second = parse_elf(data), parse_elf(data)
    assert load_cfi(first).starts == load_cfi(second).starts
    assert len(reads) == 3
    assert load_cfi(first).starts == load_cfi(second).starts
    assert len(reads) == 3
