"""Bad input never gives a traceback: one clear line on stderr and exit 2, or a finding.

Truncated files cut at many points, flipped bytes in the note section (hypothesis), non-ELF
files, foreign architectures, 32-bit files, unreadable paths, and damaged notes.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import fixture, run_cli
from usdtpatch.analysis.probes import NOTE_SECTION
from usdtpatch.cli.common import EXIT_INTERNAL, EXIT_OK, EXIT_UNUSABLE
from usdtpatch.elf.image import parse_elf

PIE = fixture("pie")


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"fixture {path} is missing: run `make -C fixtures`")
    return path


def _check_outcome(rc: int, err: str) -> None:
    assert rc != EXIT_INTERNAL, err
    assert rc in (EXIT_OK, EXIT_UNUSABLE), (rc, err)
    assert "Traceback" not in err
    if rc == EXIT_UNUSABLE:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("usdtpatch: "), err


def _cut_points(size: int) -> list[int]:
    """Every byte of the headers, then a spread over the rest of the file."""
    points = set(range(0, min(size, 128)))
    points.update(range(0, size, max(1, size // 200)))
    return sorted(points)


def test_truncated_files_never_crash(tmp_path: Path) -> None:
    data = _need(PIE).read_bytes()
    image = parse_elf(data)
    # also every cut through the note section and the section header table
    sec = image.section(NOTE_SECTION)
    assert sec is not None
    points = set(_cut_points(len(data)))
    points.update(range(sec.offset, sec.offset + sec.size))
    points.update(range(image.shoff, len(data), 7))
    target = tmp_path / "cut"
    unusable = 0
    for n in sorted(points):
        target.write_bytes(data[:n])
        res = run_cli("list", "--json", target)
        _check_outcome(res.rc, res.err)
        unusable += res.rc == EXIT_UNUSABLE
    assert unusable > 0  # a cut header must be refused, not listed as empty


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_flipped_bytes_in_the_note_section_give_findings_not_crashes(data: st.DataObject) -> None:
    raw = bytearray(_need(PIE).read_bytes())
    image = parse_elf(bytes(raw))
    sec = image.section(NOTE_SECTION)
    assert sec is not None
    flips = data.draw(st.lists(st.tuples(st.integers(0, sec.size - 1), st.integers(1, 255)),
                               min_size=1, max_size=8))
    for pos, mask in flips:
        raw[sec.offset + pos] ^= mask
    from usdtpatch.analysis.probes import read_probes

    ps = read_probes(parse_elf(bytes(raw)))  # must not raise
    for f in ps.findings:
        assert f.code and f.message


def test_flipped_note_bytes_through_the_cli(tmp_path: Path) -> None:
    raw = bytearray(_need(PIE).read_bytes())
    sec = parse_elf(bytes(raw)).section(NOTE_SECTION)
    assert sec is not None
    target = tmp_path / "flipped"
    for pos in range(sec.size):
        mutated = bytearray(raw)
        mutated[sec.offset + pos] ^= 0xFF
        target.write_bytes(bytes(mutated))
        res = run_cli("list", "--json", target)
        _check_outcome(res.rc, res.err)


@pytest.mark.parametrize(
    "content",
    [b"", b"\x7fEL", b"#!/bin/sh\necho hi\n", b"\x7fELF" + b"\0" * 12, b"\x7fELF\x03\x01\x01",
     b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\xff" * 64, os.urandom(4096)],
    ids=["empty", "short-magic", "script", "zero-ident", "bad-class", "garbage-header", "random"],
)
def test_non_elf_input_is_one_line_and_exit_2(tmp_path: Path, content: bytes) -> None:
    target = tmp_path / "input"
    target.write_bytes(content)
    res = run_cli("list", target)
    assert res.rc == EXIT_UNUSABLE
    _check_outcome(res.rc, res.err)
    assert str(target) in res.err


def test_unreadable_paths(tmp_path: Path) -> None:
    for path in (tmp_path / "missing", tmp_path):
        res = run_cli("list", path)
        assert res.rc == EXIT_UNUSABLE
        _check_outcome(res.rc, res.err)
    locked = tmp_path / "locked"
    locked.write_bytes(b"\x7fELF")
    locked.chmod(0)
    res = run_cli("list", locked)
    if os.geteuid() != 0:  # root reads it anyway, and then it is a truncated ELF
        assert "permission denied" in res.err
    assert res.rc == EXIT_UNUSABLE
    _check_outcome(res.rc, res.err)


def test_one_bad_file_does_not_hide_the_others(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"not an elf")
    res = run_cli("list", "--json", bad, _need(PIE))
    assert res.rc == EXIT_UNUSABLE
    doc = json.loads(res.out)
    assert [f["path"] for f in doc["files"]] == [str(PIE)]
    assert doc["errors"][0]["path"] == str(bad)


def test_aarch64_notes_listed_with_unsupported_arch() -> None:
    res = run_cli("list", "--json", _need(fixture("aarch64")))
    assert res.rc == EXIT_OK, res.err
    f = json.loads(res.out)["files"][0]
    assert f["elf"]["machine"] == "aarch64"
    assert f["probes"] and all(p["site"]["form"] == "unsupported-arch" for p in f["probes"])
    assert "unsupported-arch" in {x["code"] for x in f["findings"]}


def test_i386_notes_listed() -> None:
    res = run_cli("list", "--json", _need(fixture("i386")))
    assert res.rc == EXIT_OK, res.err
    f = json.loads(res.out)["files"][0]
    assert f["elf"]["class"] == 32 and f["elf"]["machine"] == "i386"
    assert f["probes"] and all(p["site"]["form"] == "nop1" for p in f["probes"])


def test_big_endian_notes_listed_everything_else_refused() -> None:
    res = run_cli("list", "--json", _need(fixture("bigendian")))
    assert res.rc == EXIT_OK, res.err
    f = json.loads(res.out)["files"][0]
    assert f["elf"]["byteorder"] == "big"
    assert f["probes"]
    assert all(p["site"]["form"] == "unsupported-arch" for p in f["probes"]) or \
        "big-endian" in {x["code"] for x in f["findings"]}


def test_a_bad_note_is_a_finding_and_the_others_are_listed() -> None:
    res = run_cli("list", "--json", _need(fixture("odd-note")))
    assert res.rc == EXIT_OK, res.err
    f = json.loads(res.out)["files"][0]
    codes = {x["code"] for x in f["findings"]}
    assert codes & {"note-malformed", "note-truncated"}
    assert f["probes"], "the good notes are still listed"


def test_unknown_argument_forms_are_kept_with_a_finding() -> None:
    res = run_cli("list", "--json", _need(fixture("bad-args")))
    assert res.rc == EXIT_OK, res.err
    f = json.loads(res.out)["files"][0]
    unknown = [a for p in f["probes"] for a in p["arguments"] if a["kind"] == "unknown"]
    assert unknown and all(a["raw"] and a["reason"] for a in unknown)
    assert "arg-unknown-form" in {x["code"] for x in f["findings"]}


def test_section_header_count_lies(tmp_path: Path) -> None:
    """e_shnum pointing past the end of the file is refused with the numbers."""
    raw = bytearray(_need(PIE).read_bytes())
    struct.pack_into("<H", raw, 0x3C, 0xFFF0)  # e_shnum of an ELF64 header
    target = tmp_path / "lying"
    target.write_bytes(bytes(raw))
    res = run_cli("list", target)
    assert res.rc == EXIT_UNUSABLE
    assert "section header table" in res.err
