"""Every finding code documented in docs/findings.md has an input that triggers it, with the
documented severity; clean fixtures give no finding at all."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import ROOT, fixture
from tests.test_analysis_built import built  # noqa: F401  (the module-scoped fixture)
from usdtpatch.analysis.check import check
from usdtpatch.api import load
from usdtpatch.elf.image import parse_elf

FINDINGS_DOC = ROOT / "docs" / "findings.md"

# code -> committed fixture that triggers it
FIXTURE_TRIGGERS = {
    "site-probe-lost": "nop10",
    "note-malformed": "odd-note",
    "note-foreign": "odd-note",
    "note-truncated": "odd-note",
    "arg-unknown-form": "bad-args",
    "arg-no-size": "bad-args",
    "too-many-args": "bad-args",
    "unsupported-arch": "aarch64",
    "note-base-moved": "prelinked",
    "site-crosses-page": "nop5-pagecross",
    "site-segment-prefix": "dsprefix",
    "site-hint-nop": "hintnop",
    "site-elf32": "i386",
    "site-combo5-pc1": "combo5",
    "red-zone-live": "redzone-leaf-nop5",
    "red-zone-rewrite": "redzone-leaf",
    "arg-uses-rsp": "redzone-leaf",
    "arg-uses-rip": "args-O2",
    "process-can-fork": "fork",
}

# code -> binary built by tests/test_analysis_built.py (custom notes: no committed fixture)
BUILT_TRIGGERS = {
    "window-branch-target": "built",
    "window-call": "built",
    "window-function-end": "built",
    "window-all-targets": "built",
    "probe-not-decoded": "built",
    "window-no-function-bounds": "built",
    "site-in-rseq-cs": "built",
    "semaphore-misaligned": "built",
    "semaphore-not-writable": "built",
    "semaphore-not-in-probes": "built",
    "semaphore-unmapped": "built",
}

CLEAN = ["nop5", "nop5-alt", "nop5-pageend", "nofork", "redzone-leaf-nored",
         "redzone-nonleaf-nop5", "pie", "stripped", "noprobes", "libprobes.so"]


# ---- inputs made by patching a copy of a fixture ---------------------------------------------

def _patch_pc(dst: Path) -> None:
    """pie with its first note's pc moved outside every segment."""
    data = bytearray(fixture("pie").read_bytes())
    sec = parse_elf(bytes(data)).section(".note.stapsdt")
    assert sec is not None
    struct.pack_into("<Q", data, sec.offset + 20, 0x7FFF0000)  # header 12 + "stapsdt\0" 8
    dst.write_bytes(bytes(data))


def _patch_section(dst: Path, name: str, field_offset: int, fmt: str, value: int) -> None:
    data = bytearray(fixture("pie").read_bytes())
    img = parse_elf(bytes(data))
    sec = img.section(name)
    assert sec is not None
    struct.pack_into(fmt, data, img.shoff + sec.index * 64 + field_offset, value)
    dst.write_bytes(bytes(data))


def _rename_base(dst: Path) -> None:
    data = bytearray(fixture("pie").read_bytes())
    img = parse_elf(bytes(data))
    shstr = img.sections[[s.name for s in img.sections].index(".shstrtab")]
    at = data.index(b".stapsdt.base\0", shstr.offset, shstr.offset + shstr.size)
    data[at: at + 13] = b".stapsdt.xxxx"
    dst.write_bytes(bytes(data))


def _relocatable(dst: Path) -> None:
    data = bytearray(fixture("pie").read_bytes())
    struct.pack_into("<H", data, 16, 1)  # e_type = ET_REL
    dst.write_bytes(bytes(data))


def _eh_frame_hdr_v2(dst: Path) -> None:
    data = bytearray(fixture("pie").read_bytes())
    sec = parse_elf(bytes(data)).section(".eh_frame_hdr")
    assert sec is not None
    data[sec.offset] = 2
    dst.write_bytes(bytes(data))


def _huge(dst: Path) -> None:
    from tests.test_analysis_candidacy import _with_huge_segment

    _with_huge_segment(fixture("nop5"), dst)


def big_endian_x86(dst: Path) -> None:
    """A minimal ELF64 big-endian x86-64 executable with one SDT note (no such file exists in
    the wild; the byte order is what matters)."""
    bo = ">"
    code_addr, base_addr = 0x400100, 0x400110
    text = bytes([0x90, 0xC3])  # nop; ret
    desc = struct.pack(bo + "QQQ", code_addr, base_addr, 0) + b"be\0probe\0\0"
    desc += b"\0" * (-len(desc) % 4)
    note = struct.pack(bo + "III", 8, len(desc), 3) + b"stapsdt\0" + desc
    shstr = b"\0.text\0.stapsdt.base\0.note.stapsdt\0.shstrtab\0"
    body = bytearray(0x100)
    body += text + b"\0" * (0x10 - len(text)) + b"\0" * 8  # .text, .stapsdt.base (+pad)
    note_off = len(body)
    body += note
    shstr_off = len(body)
    body += shstr
    body += b"\0" * (-len(body) % 8)
    shoff = len(body)
    phdr = struct.pack(bo + "IIQQQQQQ", 1, 5, 0, 0x400000, 0x400000, note_off, note_off,
                       0x1000)
    sections = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (1, 1, 6, code_addr, 0x100, len(text), 0, 0, 16, 0),
        (7, 1, 2, base_addr, 0x110, 1, 0, 0, 1, 0),
        (21, 7, 0, 0, note_off, len(note), 0, 0, 4, 0),
        (35, 3, 0, 0, shstr_off, len(shstr), 0, 0, 1, 0),
    ]
    for s in sections:
        body += struct.pack(bo + "IIQQQQIIQQ", *s)
    ehdr = (b"\x7fELF" + bytes([2, 2, 1, 0]) + b"\0" * 8
            + struct.pack(bo + "HHIQQQIHHHHHH", 2, 62, 1, code_addr, 64, shoff, 0, 64, 56, 1,
                          64, len(sections), 4))
    body[0:64] = ehdr
    body[64:64 + 56] = phdr
    dst.write_bytes(bytes(body))


PATCHED_TRIGGERS: dict[str, Callable[[Path], None]] = {
    "pc-outside-segments": _patch_pc,
    "note-section-type": lambda p: _patch_section(p, ".note.stapsdt", 4, "<I", 1),
    "no-stapsdt-base": _rename_base,
    "not-linked": _relocatable,
    "cfi-malformed": _eh_frame_hdr_v2,
    "no-trampoline-reach": _huge,
    "big-endian": big_endian_x86,
}


# Codes of the fork guard: their triggers need built, rewritten or corrupted guarded programs,
# made and checked in the fork guard's own tests (each named here asserts the code appears).
TRIGGERED_ELSEWHERE = {
    "fork-guarded": "tests/test_fork_guard.py",
    "fork-guard-failed": "tests/test_fork_emulate.py",
    "fork-guard-unavailable": "tests/test_fork_guard.py",
    "probe-not-code": "tests/test_analysis_datacode.py",
    "fork-unknown": "tests/test_fork_static.py",
    "window-syscall": "tests/test_rewrite_observed.py",
    "window-fault-observed": "tests/test_rewrite_observed.py",
    # the model's: a hand-mutated fixture per kind of construct, and -z notext libraries
    "unmodelled-relocation": "tests/test_model.py",
    "unmodelled-dynamic-tag": "tests/test_model.py",
    "unmodelled-section-type": "tests/test_model.py",
    "unmodelled-segment-type": "tests/test_model.py",
    "unmodelled-note": "tests/test_model.py",
    "unmodelled-cfi": "tests/test_model.py",
    "unmodelled-lsda-encoding": "tests/test_model.py",
    "unmodelled-line-opcode": "tests/test_model.py",
    "window-text-relocation": "tests/test_text_relocations.py",
    # issue 46: programs built at test time
    "window-transaction": "tests/test_analysis_relative.py",
    "window-place-named": "tests/test_analysis_placerel.py",
    "window-foreign-personality": "tests/test_analysis_personality.py",
    "code-read-as-data": "tests/test_analysis_coderead.py",
}


def documented() -> dict[str, str]:
    """code -> severity, from docs/findings.md (`### \\`code\\`` then `- severity: X`), for
    the codes of `list` and `check` (the sections before the one on `plan`)."""
    text = FINDINGS_DOC.read_text().split("\n## Plan (`plan`)")[0]
    out: dict[str, str] = {}
    for m in re.finditer(r"^### `([a-z0-9-]+)`\n(?:.*\n)*?- severity: (\w+)", text, re.M):
        out[m.group(1)] = m.group(2)
    return out


def test_every_documented_code_has_a_trigger_and_vice_versa() -> None:
    doc = documented()
    triggers = set(FIXTURE_TRIGGERS) | set(BUILT_TRIGGERS) | set(PATCHED_TRIGGERS)
    elsewhere = set()
    for code, test in TRIGGERED_ELSEWHERE.items():
        if (Path(__file__).resolve().parent.parent / test).exists() and \
                f'"{code}"' in (Path(__file__).resolve().parent.parent / test).read_text():
            elsewhere.add(code)
    assert set(doc) == triggers | elsewhere


def _codes_of(path: Path) -> dict[str, str]:
    r = check(load(str(path)))
    return {f.code: f.severity.value for f in r.all_findings}


@pytest.mark.parametrize("code", sorted(FIXTURE_TRIGGERS))
def test_fixture_triggers(code: str) -> None:
    codes = _codes_of(fixture(FIXTURE_TRIGGERS[code]))
    assert code in codes
    assert codes[code] == documented()[code]


@pytest.mark.parametrize("code", sorted(PATCHED_TRIGGERS))
def test_patched_triggers(code: str, tmp_path: Path) -> None:
    dst = tmp_path / code
    PATCHED_TRIGGERS[code](dst)
    codes = _codes_of(dst)
    assert code in codes
    assert codes[code] == documented()[code]


@pytest.mark.parametrize("code", sorted(BUILT_TRIGGERS))
def test_built_triggers(code: str, built: dict[str, Path]) -> None:  # noqa: F811
    codes = _codes_of(built[BUILT_TRIGGERS[code]])
    assert code in codes
    assert codes[code] == documented()[code]


@pytest.mark.parametrize("name", CLEAN)
def test_clean_fixture_gives_no_finding(name: str) -> None:
    assert _codes_of(fixture(name)) == {}


def test_hints_say_what_the_tool_does(tmp_path: Path) -> None:
    """Advice that contradicted the tool (issue 34, item 12): arg-uses-rip said the rewrite
    must re-express the argument while the rewritten note keeps `sym(%rip)` as written (a
    tracer reads the symbol's address: right wherever the probe is); fork-unknown advised
    --fork-guard always where the default had added the guard, which covers fork(), not a
    fork through syscall()."""
    import json as _json

    from tests.helpers import run_cli
    from usdtpatch import findings as F

    doc = _json.loads(run_cli("check", "--json", "--fail-on", "never",
                              fixture("args-O2")).out)
    rip = {s["name"] for s in doc["files"][0]["sites"] for f in s["findings"]
           if f["code"] == "arg-uses-rip" and "nothing to do" in f["hint"]}
    assert rip == {"f_rip", "mem"}

    def args(path: Path) -> dict[str, list[str]]:
        listed = _json.loads(run_cli("list", "--json", path).out)["files"][0]["probes"]
        return {p["name"]: [a["raw"] for a in p["arguments"]] for p in listed}

    out = tmp_path / "out"
    res = run_cli("rewrite", "--json", "--no-verify", fixture("args-O2"), "-o", out)
    moved = {s["name"] for s in _json.loads(res.out)["files"][0]["sites"]
             if s["action"] in ("detour", "moved")}
    assert rip <= moved
    before, after = args(fixture("args-O2")), args(out)
    assert all(before[n] == after[n] and any("(%rip)" in a for a in after[n]) for n in rip)
    assert "always" not in F.FORK_UNKNOWN.hint and "--fork-guard auto" in F.FORK_UNKNOWN.hint
