"""The one `.eh_frame` reader (usdtpatch.elf.cfi): its entries agree with the index the
analysis and the rewrite use and with readelf, and the malformed CIEs that must give one line
and exit 2 (regressions: a CIE augmentation string without its NUL made the reader raise a bare
ValueError, junk LEB128 in a CIE's augmentation data made `rewrite` fail with struct.error;
both were internal errors, exit 3)."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import REAL_BINARIES, fixture, run_cli
from usdtpatch.elf.cfi import (
    CfiError,
    Cie,
    EhBytes,
    Fde,
    iter_entries,
    load_cfi,
    read_encoded,
    read_sleb,
    read_uleb,
)
from usdtpatch.elf.ehframe import build_eh_frame_hdr, rows_at, sleb, uleb
from usdtpatch.elf.image import parse_elf
from usdtpatch.errors import ElfFormatError, UnsupportedError

# ---------------------------------------------------------------------------------------------
# LEB128 and pointer encodings


@pytest.mark.parametrize("value", [0, 1, 63, 64, 127, 128, 300, 1 << 32, (1 << 63) - 1])
def test_uleb_round_trip(value: int) -> None:
    raw = uleb(value)
    assert read_uleb(EhBytes(raw, 0x1000), 0x1000, 0x1000 + len(raw), "x") == (
        value, 0x1000 + len(raw))


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, -65, 1 << 40, -(1 << 40)])
def test_sleb_round_trip(value: int) -> None:
    raw = sleb(value)
    assert read_sleb(EhBytes(raw, 0), 0, len(raw), "x") == (value, len(raw))


def test_leb_must_end_inside_its_entry() -> None:
    buf = EhBytes(b"\x80\x80\x01", 0x10)
    assert read_uleb(buf, 0x10, 0x13, "f") == (1 << 14, 0x13)
    with pytest.raises(CfiError, match=r"f at 0x10: ULEB128 runs past the end of the entry"):
        read_uleb(buf, 0x10, 0x12, "f")  # the entry ends before the last byte
    with pytest.raises(CfiError, match="longer than 16 bytes"):
        read_uleb(EhBytes(b"\x80" * 40, 0), 0, 40, "f")


def test_pointer_encodings() -> None:
    raw = struct.pack("<i", -16)
    buf = EhBytes(raw, 0x2000)
    assert read_encoded(buf, 0x2000, 0x1B, buf.end, "p") == (0x2000 - 16, 0x2004)  # pcrel|sdata4
    assert read_encoded(buf, 0x2000, 0x3B, buf.end, "p", data_base=0x100) == (0x100 - 16,
                                                                               0x2004)
    assert read_encoded(buf, 0x2000, 0x03, buf.end, "p") == (0xFFFFFFF0, 0x2004)  # udata4
    assert read_encoded(buf, 0x2000, 0xFF, buf.end, "p") == (0, 0x2000)  # omit
    with pytest.raises(CfiError, match="unknown value format"):
        read_encoded(buf, 0x2000, 0x07, buf.end, "p")
    with pytest.raises(CfiError, match="unknown application"):
        read_encoded(buf, 0x2000, 0x5B, buf.end, "p")
    with pytest.raises(CfiError, match="needs 8 bytes"):
        read_encoded(buf, 0x2000, 0x04, buf.end, "p")


# ---------------------------------------------------------------------------------------------
# One parser: the entries it reads are the ones the index holds


@pytest.mark.parametrize("path", [fixture("cxx-throw"), fixture("pie"), fixture("static"),
                                  REAL_BINARIES["libstdc++"]],
                         ids=["cxx-throw", "pie", "static", "libstdc++"])
def test_the_reader_sees_every_fde_the_index_holds(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} not present")
    image = parse_elf(path.read_bytes())
    sec = image.section(".eh_frame")
    assert sec is not None
    entries = list(iter_entries(EhBytes(image.section_data(sec), sec.addr, 8, "<")))
    cfi = load_cfi(image)
    assert sorted((e.pc_begin, e.address) for e in entries if isinstance(e, Fde)) == \
        sorted(zip(cfi.starts, cfi.fde_addresses, strict=True))
    assert any(isinstance(e, Cie) for e in entries)


def _cie(aug: bytes, aug_data: bytes, version: int = 1) -> bytes:
    body = b"\0\0\0\0" + bytes([version]) + aug + uleb(1) + sleb(-8) + b"\x10"
    body += uleb(len(aug_data)) + aug_data
    body += b"\0" * (-(len(body) + 4) % 4)
    return struct.pack("<I", len(body)) + body


def test_cie_augmentation_without_nul_is_a_format_error() -> None:
    raw = struct.pack("<I", 8) + b"\0\0\0\0\x01zRz"
    with pytest.raises(CfiError, match="augmentation string at 0x1009: no terminating NUL"):
        list(iter_entries(EhBytes(raw, 0x1000)))


def test_junk_leb128_in_cie_augmentation_data_is_a_format_error() -> None:
    raw = _cie(b"zR\0", b"\x1b")[:13] + b"\x80" * 11
    raw = struct.pack("<I", len(raw) - 4) + raw[4:]
    with pytest.raises(CfiError, match="runs past the end of the entry"):
        list(iter_entries(EhBytes(raw, 0x1000)))


def test_augmentation_data_longer_than_its_cie_is_a_format_error() -> None:
    raw = bytearray(_cie(b"zR\0", b"\x1b"))
    assert raw[15] == 1
    raw[15] = 0x7F  # augmentation length 127 in a 20-byte CIE
    with pytest.raises(CfiError, match="runs past the end of the entry"):
        list(iter_entries(EhBytes(bytes(raw), 0x1000)))


def test_unknown_augmentation_is_read_and_marked() -> None:
    """A CIE whose augmentation the reader does not know is read, not refused, and marked
    (`Cie.understood`)."""
    raw = _cie(b"zQ\0", b"\x00")
    (cie,) = iter_entries(EhBytes(raw, 0x1000))
    assert isinstance(cie, Cie) and not cie.understood
    (known,) = iter_entries(EhBytes(_cie(b"zR\0", b"\x1b"), 0x1000))
    assert isinstance(known, Cie) and known.understood


def test_rows_are_not_replayed_from_a_cie_not_understood() -> None:
    """A detour's unwind rows come from its function's CFA program, which an unknown
    augmentation may change (before, rows_at replayed it as if it were known): refused, so
    the detour gets `detour-without-cfi` or its site is skipped."""
    fde = load_cfi(parse_elf(fixture("pie").read_bytes())).fde_at(0)
    assert rows_at(fde, [fde.pc_begin])
    odd = replace(fde, cie=replace(fde.cie, augmentation="zQ", understood=False))
    with pytest.raises(UnsupportedError, match="augmentation 'zQ'"):
        rows_at(odd, [fde.pc_begin])


def test_header_table_refuses_out_of_range_addresses() -> None:
    with pytest.raises(UnsupportedError, match="does not fit a 4-byte field"):
        build_eh_frame_hdr(0x1000, 0x2000, [0x1000 + (1 << 40)], [0x3000])
    with pytest.raises(UnsupportedError, match="entry for 0x1100"):
        build_eh_frame_hdr(0x1000, 0x2000, [0x1000, 0x1100], [0x3000, 0x1000 - (1 << 31) - 1])


def test_header_table_is_sorted_by_location_then_fde() -> None:
    got = build_eh_frame_hdr(0x1000, 0x2000, [0x1300, 0x1100, 0x1100], [0x30, 0x20, 0x10])
    rows = list(struct.iter_unpack("<ii", got[12:]))
    assert struct.unpack_from("<I", got, 8)[0] == 3
    assert rows == [(0x100, 0x10 - 0x1000), (0x100, 0x20 - 0x1000), (0x300, 0x30 - 0x1000)]
    assert build_eh_frame_hdr(0x1000, 0x2000, [0x1100, 0x1100, 0x1300],
                              [0x10, 0x20, 0x30]) == got


# ---------------------------------------------------------------------------------------------
# Through the command line: one line naming the file, exit 2, nothing written


def _demo_with_first_cie(tmp_path: Path, name: str, fill: bytes, cut: bool) -> Path:
    """A copy of the demo fixture whose first CIE (used only by _start's FDE, no probe) has its
    augmentation string and data overwritten by `fill`; `cut` ends .eh_frame after it."""
    data = bytearray(fixture("demo").read_bytes())
    image = parse_elf(bytes(data))
    sec = image.section(".eh_frame")
    assert sec is not None
    length, cie_id = struct.unpack_from("<II", data, sec.offset)
    assert cie_id == 0 and data[sec.offset + 9 : sec.offset + 12] == b"zR\0", \
        "the demo fixture changed: its .eh_frame no longer starts with a zR CIE"
    cfi = load_cfi(image)
    listed = run_cli("list", "--json", fixture("demo"))
    assert listed.rc == 0
    pcs = [p["address"] for f in json.loads(listed.out)["files"] for p in f["probes"]]
    users = [cfi.fde_at(i) for i in range(len(cfi)) if cfi.fde_at(i).cie.address == sec.addr]
    assert pcs and users and not any(f.contains(pc) for f in users for pc in pcs)
    end = sec.offset + 4 + length
    start = sec.offset + 9 if cut else data.index(b"\0", sec.offset + 9) + 1
    data[start:end] = (fill * (end - start))[: end - start]
    if cut:  # the section ends with this CIE: no NUL anywhere after the augmentation
        shdr = image.shoff + sec.index * 64
        struct.pack_into("<Q", data, shdr + 32, 4 + length)
    out = tmp_path / name
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize(("name", "fill", "cut"), [
    ("cie-no-nul", b"z", True),
    ("cie-junk-leb", b"\x80", False),
])
def test_rewrite_leaves_a_malformed_unused_cie_alone(tmp_path: Path, name: str, fill: bytes,
                                                     cut: bool) -> None:
    """The rewrite reads only the FDEs of the windows it moves and leaves `.eh_frame` where it
    is (the new `.eh_frame_hdr` indexes it as the old one did): a CIE no probe's function uses
    is neither read nor copied, so its damage is the input's, unchanged, not a refusal."""
    src = _demo_with_first_cie(tmp_path, name, fill, cut)
    out = tmp_path / f"{name}.out"
    res = run_cli("rewrite", "--no-verify", src, "-o", out)
    assert res.rc == 0, res.err
    before, after = parse_elf(src.read_bytes()), parse_elf(out.read_bytes())
    old, new = before.section(".eh_frame"), after.section(".eh_frame")
    assert old is not None and new is not None and (old.addr, old.offset) == (new.addr,
                                                                             new.offset)
    assert after.section_data(new) == before.section_data(old)
    assert run_cli("list", src).rc == 0
    assert run_cli("check", "--fail-on", "never", src).rc == 0


def test_format_errors_are_the_package_errors() -> None:
    assert issubclass(CfiError, ElfFormatError)


def test_a_one_byte_leb128_is_read_as_the_reader_reads_it(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """leb_bytes reads a one-byte LEB128 (most operands of a call frame program) inline,
    without making a reader (the branch start made one per operand: a third of rows_at's
    time); every input reads as cfi's reader reads it, the refused ones (a position outside
    the data, a LEB128 running past its end) refused with the same words."""
    from usdtpatch.elf import cfi

    real = cfi.EhBytes
    made: list[int] = []

    def counted(data: bytes, address: int) -> cfi.EhBytes:
        made.append(address)
        return real(data, address)

    monkeypatch.setattr(cfi, "EhBytes", counted)
    assert cfi.leb_bytes(b"\x05", 0, False) == (5, 1)
    assert cfi.leb_bytes(b"\x7f", 0, True) == (-1, 1)
    assert made == []
    for signed in (False, True):
        for first in range(256):
            for tail in (b"", b"\x01", b"\x80", b"\x80\x01"):
                data = bytes([first]) + tail
                for pos in range(-1, len(data) + 1):
                    try:
                        got: object = cfi.leb_bytes(data, pos, signed)
                    except cfi.CfiError as exc:
                        got = str(exc)
                    read = cfi.read_sleb if signed else cfi.read_uleb
                    try:
                        want: object = read(real(data, 0), pos, len(data),
                                            "call frame instruction operand")
                    except cfi.CfiError as exc:
                        want = str(exc)
                    assert got == want, (data, pos, signed)
